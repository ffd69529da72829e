"""The admission decision: ``(pod, context) -> Decision``. Pure: no I/O, no clock, no globals.

Everything the webhook does to a pod is decided here and returned as JSONPatch operations
built by hand against the pod as submitted, with a sentence per step for ``explain``.

This module is the entry point and the order of the steps, and writes the marks; each
step lives with its concern: ``grouping`` (mode, isolation scope, run, placeholder),
``claims`` (grouping claims, claims-conflict, the rewrite), ``placement_step`` (pod affinity
or node name), ``defaults_and_policy`` (the admins' rules); what it reads is ``context``,
what it returns ``outcome``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from coschedule import marks
from coschedule.marks import (
    ALL_MARK_ANNOTATIONS,
    COMPONENT_AFFINITY_ASSISTANT,
    LABEL_COMPONENT,
    LABEL_GATED_BY,
    LABEL_MODE,
    LABEL_PLACEHOLDER,
    IsolationScope,
    Mode,
    Placement,
)
from coschedule.mutate import isolation
from coschedule.mutate.claims import claims_step, rewrite_claims
from coschedule.mutate.context import AdmissionContext, PlaceholderView, VolumeView
from coschedule.mutate.defaults_and_policy import (
    nothing_to_flag,
    policy_step,
    scheduling_defaults_step,
)
from coschedule.mutate.grouping import isolation_step, mode_step, placeholder_step, run_step
from coschedule.mutate.outcome import Decision
from coschedule.mutate.placement_step import (
    affinity_ops,
    by_node_name,
    drop_policy_gate,
    node_placement_ops,
)
from coschedule.placement import node_pin
from coschedule.wire import jsonpatch
from coschedule.wire import pod_fields as podview
from coschedule.wire.jsonpatch import Op

# decide's signature, in one import: the context it reads, the decision it returns.
__all__ = ["AdmissionContext", "Decision", "PlaceholderView", "VolumeView", "decide"]

# Our keys are constants: escape their paths once, not on every admission.
_PLACEHOLDER_LABEL_PATH = jsonpatch.pointer("metadata", "labels", LABEL_PLACEHOLDER)
_DISABLED = Mode.DISABLED.value
_ANNOTATION_PATHS = {
    key: jsonpatch.pointer("metadata", "annotations", key) for key in ALL_MARK_ANNOTATIONS
}
_ANNOTATED: Mapping[str, Any] = {"annotations": {}}  # the pod's metadata once marked


def decide(pod: Mapping[str, Any], ctx: AdmissionContext) -> Decision:
    """Decide what to do with a Pod CREATE. Raises ``podview.MalformedPod`` on bad shapes.

    Coscheduling first; then the admins' scheduling defaults and hardening policy, which
    apply to every pod decided on in an enabled namespace (any namespace or cluster mode,
    even ``disabled``; in a run or not) except placeholder pods and pods labelled
    ``coschedule.dev/mode: disabled``, and see the pod as it will be stored.
    """
    meta = podview.metadata(pod)
    labels = podview.string_map(meta, "labels")
    decision = _decide_coschedule(pod, ctx, meta, labels)
    if decision.allowed and not decision.by_node_name and labels.get(LABEL_GATED_BY):
        drop_policy_gate(pod, decision)
    # Not for placeholder pods (the reconciler copies their fields from the group's pods),
    # pods that opted out with the label coschedule.dev/mode: disabled (never touched, as the
    # webhook configuration's matchConditions already ensure in a cluster) and namespaces not
    # enabled. A namespace or cluster mode of disabled turns coscheduling off, not the
    # admins' defaults and policy.
    info = ctx.namespace_info
    if (
        decision.allowed
        and labels.get(LABEL_COMPONENT) != COMPONENT_AFFINITY_ASSISTANT
        and labels.get(LABEL_MODE) != _DISABLED
        and (info is None or info.enabled)
    ):
        pod_spec = podview.spec(pod)
        settings = ctx.settings
        if settings.scheduling_defaults or not nothing_to_flag(pod_spec):
            merged = scheduling_defaults_step(pod, pod_spec, labels, ctx, decision)
            policy_step(pod_spec, ctx, decision, merged)
    if decision.trace and decision.allowed and decision.placeholder is not None:
        # Counted last: the scheduling defaults add theirs after the placeholder's.
        decision.reasons.append(
            f"{len(decision.ops)} patch operation(s)"
            if decision.ops
            else "already mutated: nothing to add"
        )
    return decision


def _decide_coschedule(
    pod: Mapping[str, Any],
    ctx: AdmissionContext,
    meta: Mapping[str, Any],
    labels: Mapping[str, str],
) -> Decision:
    """Coscheduling alone, step by step: mode, run, claims, placeholder, then the claim
    rewrite, the affinity term and the marks. A step that returns None has finished the
    decision (left alone or denied)."""
    settings = ctx.settings
    decision = Decision(allowed=True, trace=ctx.explain)
    mode = mode_step(labels, ctx, decision)
    if mode is None:
        return decision
    identity = run_step(labels, settings, decision)
    if identity is None:
        return decision
    run_label, run = identity
    scope = IsolationScope.NAMESPACE
    if mode is Mode.ISOLATE_PIPELINERUN:
        chosen = isolation_step(labels, ctx, decision)
        if chosen is None:
            return decision
        scope = chosen
    if settings.isolation_tenant_label:
        info = ctx.namespace_info
        decision.tenant = isolation.tenant_of(info.labels if info is not None else None, settings)
        if decision.trace:
            label = settings.isolation_tenant_label
            decision.reasons.append(
                f"tenant {decision.tenant!r}: the namespace's label {label}"
                if decision.tenant
                else f"no tenant: the namespace has no label {label} (a tenant of its own)"
            )
    pod_spec = podview.spec(pod)
    if pod_spec.get("nodeName"):
        # The scheduler never sees it (nor a gate: the API refuses one beside a nodeName),
        # and the kubelet ignores pod affinity: nothing could tie it to a placeholder.
        if decision.trace:
            decision.reasons.append(
                f"left alone: spec.nodeName names its node ({pod_spec['nodeName']}); the "
                "scheduler is bypassed, so it cannot be placed beside a placeholder"
            )
        return decision
    volumes = podview.claim_volumes(pod_spec)
    found = claims_step(pod_spec, volumes, ctx, mode, run, decision)
    if found is None:
        return decision
    claims, view = found
    placeholder = placeholder_step(ctx.namespace, mode, run_label, run, claims, decision)
    if placeholder is None:
        return decision

    ops = decision.ops
    mounted = claims
    if view is not None and mode.per_run:  # offline (no view), no enum property read
        mounted = rewrite_claims(
            ctx.namespace, run, placeholder, volumes, claims, view, settings, ops, decision
        )
    wanted = marks.encode_fields(
        mode,
        run,
        run_label,
        mounted,
        settings.topology_key,
        decision.templates,
        scope,
        decision.tenant,
    )
    previous = labels.get(LABEL_PLACEHOLDER)
    if settings.placement is Placement.AUTO and by_node_name(meta, settings, decision):
        node = node_placement_ops(pod_spec, meta, placeholder, previous, ctx, ops, decision)
        _mark_ops(meta, labels, wanted, placeholder, ops)
        if node is not None:
            # After the marks: the pod's annotations exist by then.
            marked = meta if meta.get("annotations") else _ANNOTATED
            ops.extend(node_pin.pinned_node_op(marked, node))
    else:
        affinity_ops(pod_spec, placeholder, previous, settings.topology_key, ops, decision)
        _mark_ops(meta, labels, wanted, placeholder, ops)
    return decision


def _mark_ops(
    meta: Mapping[str, Any],
    labels: Mapping[str, str],
    annotations_wanted: dict[str, str],
    placeholder: str,
    ops: list[Op],
) -> None:
    """Label the pod with its placeholder and annotate what the reconciler needs."""
    if not meta:
        ops.append(
            jsonpatch.add(
                "/metadata",
                {"labels": {LABEL_PLACEHOLDER: placeholder}, "annotations": annotations_wanted},
            )
        )
        return
    if meta.get("labels") is None:
        ops.append(jsonpatch.add("/metadata/labels", {LABEL_PLACEHOLDER: placeholder}))
    elif labels.get(LABEL_PLACEHOLDER) != placeholder:
        ops.append(jsonpatch.add(_PLACEHOLDER_LABEL_PATH, placeholder))

    annotations = podview.string_map(meta, "annotations")
    if meta.get("annotations") is None:
        ops.append(jsonpatch.add("/metadata/annotations", annotations_wanted))
        return
    # Every mark is one op, built in place (jsonpatch.add's dict): a first admission adds
    # them all, and a call per op was most of this step's cost. A pod with none of the marks
    # yet (a first admission: one check in C) needs no lookup per mark.
    paths = _ANNOTATION_PATHS
    if annotations.keys().isdisjoint(annotations_wanted):
        ops.extend(
            [
                {"op": "add", "path": paths[key], "value": value}
                for key, value in annotations_wanted.items()
            ]
        )
        return
    have = annotations.get
    ops.extend(
        [
            {"op": "add", "path": paths[key], "value": value}
            for key, value in annotations_wanted.items()
            if have(key) != value
        ]
    )
