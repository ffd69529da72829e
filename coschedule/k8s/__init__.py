"""Kubernetes' own rules, pure: the ground floor every other layer may build on.

Node affinity, volume topology, taints and tolerations (one ``Node``), the scheduler's fit
arithmetic and messages, label selectors and names, quantities, RFC 3339 times, and the
well-known labels and phases. Nothing here imports from coschedule outside this package.
"""
