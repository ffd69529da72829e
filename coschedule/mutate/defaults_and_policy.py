"""The admins' rules as steps of ``decide``: the matching ``scheduling-defaults`` rules merged
into the pod (the pod wins), then the hardening policy checked on the pod as it will be stored.
``nothing_to_flag`` is the hot path's shortcut past both. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from coschedule.config.policy import (
    CONTROL_PLANE_KEYS,
    EVICTION_DELAY_KEYS,
    Finding,
    PolicyMode,
    check_policy,
    delays_eviction,
)
from coschedule.mutate.context import AdmissionContext
from coschedule.mutate.defaults import MergedScheduling, merge_defaults
from coschedule.mutate.outcome import Decision, deny
from coschedule.wire import pod_fields as podview

# What kube-apiserver's DefaultTolerationSeconds plugin adds to every pod (its default
# seconds, in its order): one list comparison, in C, stands for the loop below on most pods.
_DEFAULT_TOLERATIONS = [
    {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
    for key in sorted(EVICTION_DELAY_KEYS)  # not-ready, then unreachable
]


def nothing_to_flag(pod_spec: Mapping[str, Any]) -> bool:
    """The pod has nothing any policy rule reads a finding from: no ``spec.affinity``, no
    control-plane nodeSelector key, and no toleration but those DefaultTolerationSeconds
    adds to every pod. With no scheduling-defaults rule either, the two steps would add no
    op and find nothing, so they are skipped: most pods, and, under load, most of what those
    steps cost. Anything else, a malformed field included, takes the steps (which refuse
    it), so the answer is the same either way (a test holds them to that)."""
    if pod_spec.get("affinity") is not None:
        return False
    selector = pod_spec.get("nodeSelector")
    if selector is not None and (
        not isinstance(selector, dict) or not selector.keys().isdisjoint(CONTROL_PLANE_KEYS)
    ):
        return False
    tolerations = pod_spec.get("tolerations")
    if tolerations is None or tolerations == _DEFAULT_TOLERATIONS:
        return True
    if not isinstance(tolerations, list):
        return False
    for toleration in tolerations:
        if not (
            isinstance(toleration, dict)
            and toleration.get("key") in EVICTION_DELAY_KEYS
            and delays_eviction(toleration)
        ):
            return False
    return True


def scheduling_defaults_step(
    pod: Mapping[str, Any],
    pod_spec: Mapping[str, Any],
    labels: Mapping[str, str],
    ctx: AdmissionContext,
    decision: Decision,
) -> MergedScheduling:
    """Merge the matching ``scheduling-defaults`` rules into the pod (the pod wins)."""
    spec_created = not pod_spec and any(op["path"] == "/spec" for op in decision.ops)
    ops, reasons, merged = merge_defaults(
        pod,
        ctx.namespace,
        ctx.settings.scheduling_defaults,
        spec_created=spec_created,
        labels=labels,
        pod_spec=pod_spec,
    )
    decision.ops.extend(ops)
    if decision.trace:
        decision.reasons.extend(reasons)
    decision.scheduling = merged
    return merged


def policy_step(
    pod_spec: Mapping[str, Any],
    ctx: AdmissionContext,
    decision: Decision,
    merged: MergedScheduling,
) -> None:
    """Check the hardening policy on the pod as stored: warn, or deny on the first deny."""
    policy = ctx.settings.policy
    affinity = podview.sub_object(pod_spec, "affinity", "pod.spec")
    findings = check_policy(merged.node_selector, merged.tolerations, affinity, policy)
    decision.findings = findings
    denial: Finding | None = None
    for finding in findings:
        if decision.trace:
            decision.reasons.append(
                f"policy {finding.rule} ({finding.mode.value}): {finding.message}"
            )
        if finding.mode is PolicyMode.WARN:
            decision.warnings.append(finding.warning)
        elif denial is None:
            denial = finding
    if denial is not None:
        decision.ops.clear()
        deny(decision, denial.deny_rule, denial.message)
