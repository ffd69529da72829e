"""Placement: how a run's pods are held beside its placeholder, as both processes read and
write it (the protocol floor, beside ``marks``). Pure: plain data in, objects and operations
out.

Two strategies (config key ``placement``; ``marks.Placement``):

- by pod affinity: a required pod-affinity term to the placeholder (``marks.affinity_term``;
  the reconciler reads it back with ``marks.term_placeholder``);
- by node name: the pin (``matchFields metadata.name``), the placeholder's scheduling gate and
  the pinned-node annotation (``node_pin``): the webhook pins or gates, the reconciler pins
  and lifts the gate, and both read the pin back the same way.

An isolated run's placeholder keeps other runs off its node with ``anti_affinity``.
Which strategy a pod gets, and the patch that applies it, is the webhook's decision
(``mutate.placement_step``).
"""
