"""Pods the admission policy gated and the webhook never saw (a webhook outage), planned:
``plan_unmarked(pod, namespace_labels, settings) -> UnmarkedPlan``. Pure.

The MutatingAdmissionPolicy ``coschedule-gate-pods`` (CEL, in the API server) holds every
unmarked Tekton TaskRun pod of an enabled namespace behind the placeholder's gate and labels
it ``coschedule.dev/gated-by=admission-policy``; the webhook, when it answers, marks it (or
lifts the gate). A pod still gated and unmarked was admitted while the webhook was away. The
reconciler then makes the webhook's own decision (``mutate.decision.decide``) and applies
what can be applied to a pod that exists:

- **held** (placed by node name): the marks (label and annotations) are patched on; the pod
  stays gated, and the placeholder controller makes its placeholder, pins the pod to the
  placeholder's node and lifts the gate, as for any gated pod. The run is co-located.
- **claim rewrite** (``rewrite-claims: "true"``, a per-run mode, a claim the webhook would
  point at the placeholder's): a pod's volumes cannot change after creation, and a pod
  writing to another volume than its run's loses the data, so it stays gated and a Warning
  Event says to delete it once the webhook answers (Tekton makes it again, through it).
- **not held** (left alone, placed by pod affinity, refused): the gate is lifted (a pod
  cannot be refused, nor get a pod-affinity term, after creation), with a Warning Event
  when that costs something (not co-located, or the rule that would have refused it).

What cannot be done after creation is said in the Event: the admins' scheduling defaults
(nodeSelector, tolerations merged at admission) and the hardening policy's denials.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from coschedule.config.settings import Settings
from coschedule.marks import GATE_PLACEHOLDER, LABEL_GATED_BY, NamespaceInfo
from coschedule.mutate.decision import AdmissionContext, decide
from coschedule.placement import node_pin
from coschedule.wire import jsonpatch
from coschedule.wire import pod_fields as podview
from coschedule.wire.jsonpatch import Op

REASON_MARKED = "MarkedWithoutWebhook"
REASON_RELEASED = "ReleasedWithoutWebhook"
REASON_WAITING = "WaitingForWebhook"
_GATED_BY_PATH = jsonpatch.pointer("metadata", "labels", LABEL_GATED_BY)
_CLAIM_NAME = "/persistentVolumeClaim/claimName"
_WITHOUT = "created while the coschedule webhook was unreachable"


@dataclass(frozen=True, slots=True)
class UnmarkedPlan:
    """The one JSON patch for the pod (empty: leave it), and the Event that says why."""

    ops: tuple[Op, ...]
    reason: str = ""
    message: str = ""
    warning: bool = False
    placeholder: str | None = None


def plan_unmarked(
    pod: Mapping[str, Any], namespace_labels: Mapping[str, str], settings: Settings
) -> UnmarkedPlan:
    meta = podview.metadata(pod)
    pod_spec = podview.spec(pod)
    if node_pin.gate_index(pod_spec) is None:
        return UnmarkedPlan(())  # someone lifted the gate: nothing of ours to finish
    namespace = str(meta.get("namespace") or "")
    guard = jsonpatch.test("/metadata/resourceVersion", str(meta.get("resourceVersion") or ""))
    lift = (guard, *node_pin.ungate_ops(pod_spec), jsonpatch.remove(_GATED_BY_PATH))
    ctx = AdmissionContext(settings, namespace, NamespaceInfo(dict(namespace_labels)))
    try:
        decision = decide(pod, ctx)
    except podview.MalformedPod as exc:
        return UnmarkedPlan(lift, REASON_RELEASED, f"{_WITHOUT}; {exc}: gate lifted", True)
    if not decision.allowed:
        return UnmarkedPlan(
            lift,
            REASON_RELEASED,
            f"{_WITHOUT}, which would have refused it ({decision.message}); a pod cannot be "
            "refused once created, so the gate is lifted",
            warning=True,
        )
    if not decision.held:
        if decision.placeholder is None:
            return UnmarkedPlan(lift)  # the webhook leaves it alone: so do we
        return UnmarkedPlan(
            lift,
            REASON_RELEASED,
            f"{_WITHOUT}; it is placed by pod affinity to {decision.placeholder}, which "
            "cannot be added after creation: the gate is lifted and the pod is not co-located",
            warning=True,
            placeholder=decision.placeholder,
        )
    # The reconciler has no claim cache: where the webhook might point a claim at the
    # placeholder's (rewrite-claims on, a per-run mode, a pod with claims), it does not guess.
    rewrite = (
        settings.rewrite_claims
        and decision.mode is not None
        and decision.mode.per_run
        and bool(podview.claim_volumes(pod_spec))
    )
    if rewrite or any(op["path"].endswith(_CLAIM_NAME) for op in decision.ops):
        return UnmarkedPlan(
            (),
            REASON_WAITING,
            f"{_WITHOUT}; its claims must be pointed at placeholder {decision.placeholder}'s "
            "(rewrite-claims), which only admission can do: it stays behind the "
            f"{GATE_PLACEHOLDER} gate. Delete it once the webhook answers again: Tekton "
            "makes it again, and the webhook admits it",
            warning=True,
            placeholder=decision.placeholder,
        )
    marks = tuple(op for op in decision.ops if op["path"].startswith("/metadata"))
    skipped = len(decision.ops) - len(marks)
    message = (
        f"{_WITHOUT}: marked for placeholder {decision.placeholder} by the reconciler, "
        "which pins it to the placeholder's node and lifts the gate"
    )
    if skipped:
        message += (
            f"; {skipped} scheduling-defaults change(s) the webhook would have made at "
            "admission are not made after creation"
        )
    return UnmarkedPlan((guard, *marks), REASON_MARKED, message, placeholder=decision.placeholder)
