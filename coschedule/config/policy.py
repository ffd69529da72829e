"""Hardening policy at admission (config keys ``policy-*``). Pure.

Each rule has a mode: ``off`` (not checked), ``warn`` (admitted with an AdmissionResponse
warning, which kubectl prints) or ``deny`` (refused, naming the rule, the field and the fix).
The checks read the pod as it will be stored: after the scheduling defaults are merged.
The webhook's own affinity-assistant term is a pod *affinity* term; no rule reads those, so
it never trips one.

- ``reserved-tolerations`` (default warn): a toleration of a ``node.kubernetes.io/*`` taint.
  Those taints mark nodes that are not ready for workloads (not-ready, unreachable,
  unschedulable, memory/disk/pid-pressure, network-unavailable, out-of-service). Exempt: a
  ``NoExecute`` toleration of ``node.kubernetes.io/not-ready`` or ``/unreachable`` with
  ``tolerationSeconds``, which only delays eviction: the DefaultTolerationSeconds admission
  plugin adds two of them (300 s) to every pod.
- ``control-plane`` (default warn): a nodeSelector key, or a required node affinity
  expression (``In`` or ``Exists``; ``matchFields`` cannot name a role), on
  ``node-role.kubernetes.io/control-plane`` or ``node-role.kubernetes.io/master``, or a
  toleration of those taints.
- ``hard-anti-affinity-topology`` (default deny, as the Kubernetes inter-pod affinity
  design asks): a required pod anti-affinity term with an empty ``namespaceSelector``
  (``{}``: pods of every namespace) and a ``topologyKey`` other than
  ``kubernetes.io/hostname``: one such pod would keep every matching pod of the cluster out
  of its whole zone (or region).
- ``unsatisfiable-placement`` (default deny): the pod's nodeSelector and required node
  affinity leave no node, in any cluster: every term asks of one key what no value (or
  absence) gives (``pool=a`` and ``pool In [b]``; ``Exists`` and ``DoesNotExist``; ``Gt 5``
  and ``Lt 3``). Such a pod would wait forever, and in a run its placeholder, which carries
  the same constraints, too. Denied by default: no node label can ever change the answer,
  so refusing loses nothing and turns a silent hang into an immediate error naming the fix.

A toleration with an empty key and ``operator: Exists`` tolerates every taint. It counts as
a toleration of the reserved taints (unless its effect is ``PreferNoSchedule``, an effect
none of them uses) and of the control-plane taint (when its effect is empty or
``NoSchedule``, the effect of that taint): "tolerate everything" is exactly what these rules
exist to catch.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from coschedule.config import ConfigError
from coschedule.k8s.constants import HOSTNAME, REQUIRED
from coschedule.k8s.node_constraints import term_conflict
from coschedule.k8s.nodeaffinity import NAME_FIELD, required_terms
from coschedule.wire import pod_fields as podview

RESERVED_PREFIX = "node.kubernetes.io/"
EVICTION_DELAY_KEYS = frozenset({"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"})
CONTROL_PLANE_KEYS = ("node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master")

RESERVED_TOLERATIONS = "reserved-tolerations"
CONTROL_PLANE = "control-plane"
HARD_ANTI_AFFINITY_TOPOLOGY = "hard-anti-affinity-topology"
UNSATISFIABLE_PLACEMENT = "unsatisfiable-placement"
RULES = (RESERVED_TOLERATIONS, CONTROL_PLANE, HARD_ANTI_AFFINITY_TOPOLOGY, UNSATISFIABLE_PLACEMENT)
KEY_PREFIX = "policy-"
POLICY_KEYS = tuple(KEY_PREFIX + rule for rule in RULES)
_RULE_ORDER = {rule: index for index, rule in enumerate(RULES)}

WARNING_LIMIT = 256  # kube-apiserver may truncate longer warnings


class PolicyMode(enum.StrEnum):
    OFF = "off"
    WARN = "warn"
    DENY = "deny"


@dataclass(frozen=True, slots=True)
class PolicySettings:
    reserved_tolerations: PolicyMode = PolicyMode.WARN
    control_plane: PolicyMode = PolicyMode.WARN
    hard_anti_affinity_topology: PolicyMode = PolicyMode.DENY
    unsatisfiable_placement: PolicyMode = PolicyMode.DENY

    def mode(self, rule: str) -> PolicyMode:
        mode: PolicyMode = getattr(self, rule.replace("-", "_"))
        return mode


def parse_policy(raw: Mapping[str, str]) -> PolicySettings:
    """The ``policy-*`` keys of ``raw`` (absent or empty: the rule's default)."""
    modes: dict[str, PolicyMode] = {}
    for rule, key in zip(RULES, POLICY_KEYS, strict=True):
        text = raw.get(key)
        if text is None or not text.strip():
            continue
        try:
            modes[rule.replace("-", "_")] = PolicyMode(text.strip().lower())
        except ValueError:
            raise ConfigError(
                f'config key "{key}": {text.strip()!r} is not a policy mode; use off, warn or deny'
            ) from None
    return PolicySettings(**modes)


@dataclass(frozen=True, slots=True)
class Finding:
    """One policy rule tripped by one field of the pod."""

    rule: str  # without the "policy-" prefix
    mode: PolicyMode
    field: str  # JSON-path-like, in the pod as stored: spec.tolerations[2]
    message: str  # the problem and the fix, for a denial and for explain
    summary: str  # the short form for a kubectl warning

    @property
    def warning(self) -> str:
        text = f"coschedule: policy {self.rule}: {self.summary}"
        return text if len(text) <= WARNING_LIMIT else text[: WARNING_LIMIT - 1] + "…"

    @property
    def deny_rule(self) -> str:
        return KEY_PREFIX + self.rule


def _effect(toleration: Mapping[str, Any]) -> str:
    effect = toleration.get("effect")
    return effect if isinstance(effect, str) else ""


def delays_eviction(toleration: Mapping[str, Any]) -> bool:
    """``NoExecute`` with ``tolerationSeconds``: the pod is evicted after a delay; the
    exemption of rule reserved-tolerations for not-ready and unreachable."""
    if toleration.get("effect") != "NoExecute":
        return False
    seconds = toleration.get("tolerationSeconds")
    return isinstance(seconds, int) and not isinstance(seconds, bool)


def _reserved_named(
    i: int, toleration: Mapping[str, Any], key: str, mode: PolicyMode
) -> Finding | None:
    """A toleration whose key starts with ``node.kubernetes.io/``."""
    if _effect(toleration) == "PreferNoSchedule":
        return None
    if key in EVICTION_DELAY_KEYS and delays_eviction(toleration):
        return None  # only delays eviction: what DefaultTolerationSeconds adds
    field = f"spec.tolerations[{i}]"
    return Finding(
        RESERVED_TOLERATIONS,
        mode,
        field,
        f"{field} tolerates {key}, a taint reserved for nodes that are not ready for "
        "workloads. Fix: remove that toleration (for not-ready/unreachable, a NoExecute "
        "toleration with tolerationSeconds is allowed).",
        f"{field} tolerates {key}: remove it",
    )


def _wildcard(
    i: int, toleration: Mapping[str, Any], reserved: PolicyMode, control: PolicyMode
) -> list[Finding]:
    """A toleration with an empty key: with ``Exists`` it tolerates every taint."""
    if toleration.get("operator") != "Exists":
        return []  # invalid (the API server refuses it): tolerates nothing
    effect = _effect(toleration)
    field = f"spec.tolerations[{i}]"
    found = []
    if reserved is not PolicyMode.OFF and effect != "PreferNoSchedule":
        found.append(
            Finding(
                RESERVED_TOLERATIONS,
                reserved,
                field,
                f"{field} (empty key, operator Exists) tolerates every taint, including the "
                f"{RESERVED_PREFIX}* taints reserved for nodes not ready for workloads. Fix: "
                "list the taint keys the pod must tolerate instead.",
                f"{field} (empty key, Exists) tolerates all taints incl. {RESERVED_PREFIX}*",
            )
        )
    if control is not PolicyMode.OFF and effect in ("", "NoSchedule"):
        found.append(
            Finding(
                CONTROL_PLANE,
                control,
                field,
                f"{field} (empty key, operator Exists) tolerates every taint, including the "
                "control-plane taint. Fix: list the taint keys the pod must tolerate instead.",
                f"{field} (empty key, Exists) tolerates the control-plane taint",
            )
        )
    return found


def _control_plane_toleration(
    i: int, toleration: Mapping[str, Any], key: str, mode: PolicyMode
) -> Finding | None:
    if _effect(toleration) == "PreferNoSchedule":
        return None
    field = f"spec.tolerations[{i}]"
    return Finding(
        CONTROL_PLANE,
        mode,
        field,
        f"{field} tolerates the {key} taint that keeps workloads off control-plane "
        "nodes. Fix: remove that toleration.",
        f"{field} tolerates {key}",
    )


def _control_plane_placement(
    node_selector: Mapping[str, str], affinity: Mapping[str, Any] | None, mode: PolicyMode
) -> list[Finding]:
    """nodeSelector keys and required node affinity expressions on the control-plane role."""
    found = []
    for key in CONTROL_PLANE_KEYS:
        if key in node_selector:
            field = f"spec.nodeSelector[{key}]"
            found.append(
                Finding(
                    CONTROL_PLANE,
                    mode,
                    field,
                    f"{field} places the pod on control-plane nodes. Fix: remove that "
                    "nodeSelector key; run workloads on worker nodes.",
                    f"{field} picks control-plane nodes",
                )
            )
    if affinity is None:
        return found
    node_affinity = podview.sub_object(affinity, "nodeAffinity", "pod.spec.affinity")
    if node_affinity is None:
        return found
    required = podview.sub_object(node_affinity, REQUIRED, "pod.spec.affinity.nodeAffinity")
    if not required:
        return found
    where = f"pod.spec.affinity.nodeAffinity.{REQUIRED}"
    for t, term in enumerate(podview.sub_list(required, "nodeSelectorTerms", where) or ()):
        if not isinstance(term, dict):
            raise podview.MalformedPod(f"{where}.nodeSelectorTerms[{t}] must be an object")
        term_where = f"{where}.nodeSelectorTerms[{t}]"
        expressions = podview.sub_list(term, "matchExpressions", term_where)
        for e, expression in enumerate(expressions or ()):
            if not isinstance(expression, dict):
                raise podview.MalformedPod(f"{term_where}.matchExpressions[{e}] must be an object")
            selected = expression.get("key")
            if selected in CONTROL_PLANE_KEYS and expression.get("operator") in ("In", "Exists"):
                field = (
                    f"spec.affinity.nodeAffinity.{REQUIRED}.nodeSelectorTerms[{t}]"
                    f".matchExpressions[{e}]"
                )
                found.append(
                    Finding(
                        CONTROL_PLANE,
                        mode,
                        field,
                        f"{field} requires {selected}: the pod can only run on control-plane "
                        "nodes. Fix: remove that expression; run workloads on worker nodes.",
                        f"required node affinity term {t} selects {selected}",
                    )
                )
    return found


def _anti_affinity(affinity: Mapping[str, Any] | None, mode: PolicyMode) -> list[Finding]:
    found: list[Finding] = []
    if affinity is None:
        return found
    anti = podview.sub_object(affinity, "podAntiAffinity", "pod.spec.affinity")
    where = "pod.spec.affinity.podAntiAffinity"
    terms = podview.sub_list(anti, REQUIRED, where) if anti is not None else None
    for i, term in enumerate(terms or ()):
        if not isinstance(term, dict):
            raise podview.MalformedPod(f"{where}.{REQUIRED}[{i}] must be an object")
        selector = podview.sub_object(term, "namespaceSelector", f"{where}.{REQUIRED}[{i}]")
        if selector is None or selector.get("matchLabels") or selector.get("matchExpressions"):
            continue
        topology = term.get("topologyKey")
        if topology == HOSTNAME:
            continue
        field = f"spec.affinity.podAntiAffinity.{REQUIRED}[{i}]"
        found.append(
            Finding(
                HARD_ANTI_AFFINITY_TOPOLOGY,
                mode,
                field,
                f"{field} has an empty namespaceSelector (pods of all namespaces) with "
                f"topologyKey {topology!r}: one such pod would keep the matching pods of every "
                f"namespace out of a whole {topology}. Fix: use topologyKey "
                f"{HOSTNAME}, select namespaces (a non-empty namespaceSelector, or "
                "namespaces), or make the term preferred.",
                f"anti-affinity term {i}: all namespaces, on {topology}",
            )
        )
    return found


def _show(expression: Mapping[str, Any]) -> str:
    values = expression.get("values")
    shown = f" [{', '.join(str(v) for v in values)}]" if isinstance(values, list) else ""
    return f"{expression.get('key')} {expression.get('operator')}{shown}"


def _unsatisfiable(
    node_selector: Mapping[str, str], affinity: Mapping[str, Any], mode: PolicyMode
) -> list[Finding]:
    """The required node affinity, with the nodeSelector, allows no node at all."""
    terms = required_terms(affinity)
    if not terms:
        return []
    why: list[str] = []
    for t, term in enumerate(terms):
        key = term_conflict(term, node_selector)
        if key is None:
            return []  # this term allows some node
        if not key:
            why.append(f"term {t} is empty or malformed (it matches no node)")
            continue
        field = "matchFields" if key == NAME_FIELD else "matchExpressions"
        asks = [
            _show(e) for e in term.get(field) or () if isinstance(e, dict) and e.get("key") == key
        ]
        if key in node_selector:
            asks.append(f"nodeSelector {key}={node_selector[key]}")
        why.append(f"term {t} asks {' and '.join(asks)}")
    field = f"spec.affinity.nodeAffinity.{REQUIRED}"
    return [
        Finding(
            UNSATISFIABLE_PLACEMENT,
            mode,
            field,
            f"{field} with spec.nodeSelector allows no node: {'; '.join(why)}. No node can "
            "ever satisfy that, so the pod (and the placeholder of its run, which carries the "
            "same constraints) would wait forever. Fix: make the nodeSelector and every "
            "node-affinity term agree on each key (the same value, or a value the term allows).",
            f"no node fits: {why[0]}",
        )
    ]


def check_policy(
    node_selector: Mapping[str, str],
    tolerations: Sequence[Mapping[str, Any]],
    affinity: Mapping[str, Any] | None,
    policy: PolicySettings,
) -> list[Finding]:
    """Every finding of every rule that is not off, in rule order then field order.

    Reads the pod as it will be stored: the merged nodeSelector and tolerations (whose keys
    are strings or absent, as ``defaults.pod_tolerations`` checks), and the pod's own
    ``spec.affinity``. Raises ``MalformedPod`` on bad shapes of the affinity it reads.
    One pass over the tolerations: this runs on every admission.
    """
    reserved = policy.reserved_tolerations
    control = policy.control_plane
    findings: list[Finding] = []
    if control is not PolicyMode.OFF and (node_selector or affinity is not None):
        findings.extend(_control_plane_placement(node_selector, affinity, control))
    if reserved is not PolicyMode.OFF or control is not PolicyMode.OFF:
        for i, toleration in enumerate(tolerations):
            key = toleration.get("key")
            if key in EVICTION_DELAY_KEYS and delays_eviction(toleration):
                continue  # DefaultTolerationSeconds adds two of these to every pod
            if not key:
                findings.extend(_wildcard(i, toleration, reserved, control))
            elif key.startswith(RESERVED_PREFIX):
                if reserved is not PolicyMode.OFF:
                    found = _reserved_named(i, toleration, key, reserved)
                    if found is not None:
                        findings.append(found)
            elif key in CONTROL_PLANE_KEYS and control is not PolicyMode.OFF:
                found = _control_plane_toleration(i, toleration, key, control)
                if found is not None:
                    findings.append(found)
    if policy.hard_anti_affinity_topology is not PolicyMode.OFF and affinity is not None:
        findings.extend(_anti_affinity(affinity, policy.hard_anti_affinity_topology))
    if policy.unsatisfiable_placement is not PolicyMode.OFF and affinity is not None:
        findings.extend(_unsatisfiable(node_selector, affinity, policy.unsatisfiable_placement))
    if len(findings) > 1:
        findings.sort(key=lambda finding: _RULE_ORDER[finding.rule])  # stable: field order
    return findings
