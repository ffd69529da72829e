"""Which group a pod joins: its mode, its isolated run's scope, its run, and the placeholder
that stands for the group. Steps of ``decide``; each returns None when the pod is left alone
or denied. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping

from coschedule.config.settings import Settings, isolation_problem
from coschedule.engines import BY_KIND
from coschedule.marks import (
    COMPONENT_AFFINITY_ASSISTANT,
    LABEL_COMPONENT,
    LABEL_ENABLED,
    LABEL_ISOLATION_SCOPE,
    LABEL_MODE,
    MODE_CHOICES,
    SCOPE_CHOICES,
    IsolationScope,
    Mode,
    claim_placeholder,
    run_identity,
    run_placeholder,
)
from coschedule.mutate import isolation
from coschedule.mutate.context import AdmissionContext
from coschedule.mutate.isolation import InvalidScope
from coschedule.mutate.mode_choice import InvalidMode, choose_mode
from coschedule.mutate.outcome import Decision, deny


def mode_step(labels: Mapping[str, str], ctx: AdmissionContext, decision: Decision) -> Mode | None:
    """The pod's mode; None when coscheduling leaves it alone or it is denied."""
    reasons = decision.reasons
    if labels.get(LABEL_COMPONENT) == COMPONENT_AFFINITY_ASSISTANT:
        if decision.trace:
            reasons.append(
                f"left alone: a placeholder pod ({LABEL_COMPONENT}={COMPONENT_AFFINITY_ASSISTANT})"
            )
        return None
    info = ctx.namespace_info
    if info is not None and not info.enabled:
        if decision.trace:
            reasons.append(
                f"left alone: namespace {ctx.namespace!r} is not labelled {LABEL_ENABLED}=true"
            )
        return None
    choice = choose_mode(labels, info.labels if info is not None else None, ctx.cluster_mode)
    if isinstance(choice, InvalidMode):
        where = (
            f"the pod's label {LABEL_MODE}"
            if choice.source == "pod label"
            else f"namespace {ctx.namespace!r}'s label {LABEL_MODE}"
        )
        deny(
            decision,
            "invalid-mode",
            f"{where} is {choice.value!r}, which is not a coschedule mode. "
            f"Fix: set it to one of {MODE_CHOICES}, or remove it to use the "
            f"{'namespace or cluster' if choice.source == 'pod label' else 'cluster'} mode.",
        )
        return None
    decision.mode = choice.mode
    if decision.trace:
        reasons.append(f"mode {choice.mode}: from the {choice.reason}")
    if choice.mode is Mode.DISABLED:
        if decision.trace:
            reasons.append("left alone: coscheduling is disabled")
        return None
    return choice.mode


def isolation_step(
    labels: Mapping[str, str], ctx: AdmissionContext, decision: Decision
) -> IsolationScope | None:
    """The isolated run's scope; None when a label's scope is denied."""
    info = ctx.namespace_info
    choice = isolation.choose_scope(
        labels, info.labels if info is not None else None, ctx.cluster_scope
    )
    if choice is ctx.cluster_scope:  # most runs; checked at load
        if decision.trace:
            decision.reasons.append(f"isolation scope {choice.scope}: from the {choice.reason}")
        decision.scope = choice
        return choice.scope
    if isinstance(choice, InvalidScope):
        deny(
            decision,
            "invalid-isolation-scope",
            f"{_scope_label(choice.source, ctx.namespace)} is {choice.value!r}, which is not "
            f"an isolation scope. Fix: set it to one of {SCOPE_CHOICES}, or remove it.",
        )
        return None
    settings = ctx.settings
    problem = isolation_problem(
        choice.scope, settings.topology_key, settings.isolation_tenant_label
    )
    if problem is not None:
        deny(
            decision,
            "invalid-isolation-scope",
            f"{_scope_label(choice.source, ctx.namespace)} is {choice.scope.value}, but "
            f"{problem}. Fix: set the label to namespace, or remove it.",
        )
        return None
    decision.scope = choice
    if decision.trace:
        decision.reasons.append(f"isolation scope {choice.scope}: from the {choice.reason}")
    return choice.scope


def _scope_label(source: str, namespace: str) -> str:
    if source == isolation.POD_LABEL:
        return f"the pod's label {LABEL_ISOLATION_SCOPE}"
    return f"namespace {namespace!r}'s label {LABEL_ISOLATION_SCOPE}"


def run_step(
    labels: Mapping[str, str], settings: Settings, decision: Decision
) -> tuple[str, str] | None:
    """(group label, run); None when the pod is not part of a run."""
    identity = run_identity(labels, settings.group_labels)
    if identity is None:
        if decision.trace:
            decision.reasons.append(
                "left alone: not part of a run (none of the group labels "
                f"{', '.join(settings.group_labels)} is set)"
            )
        return None
    if decision.trace:
        decision.reasons.append(f"run {identity[1]!r}: from label {identity[0]}")
    return identity


# Where a user sets the mode label so that a run's pods carry it: Tekton copies a
# PipelineRun's labels to its pods; Argo copies none of a Workflow's, only its
# spec.podMetadata.labels.
_MODE_LABEL_WHERE = {
    BY_KIND["Workflow"].run_label: f"set {LABEL_MODE}: pipelineruns in the Workflow's "
    "spec.podMetadata.labels, which Argo puts on its pods",
}


def placeholder_step(
    namespace: str, mode: Mode, run_label: str, run: str, claims: list[str], decision: Decision
) -> str | None:
    """The placeholder the pod joins: its run's, or in workspaces mode its claim's."""
    if mode is Mode.WORKSPACES:
        if not claims:
            if decision.trace:
                decision.reasons.append(
                    "left alone: mode workspaces groups by claim and the pod mounts none"
                )
            return None
        if len(claims) > 1:
            deny(
                decision,
                "workspaces-single-claim",
                f"pod mounts {len(claims)} PersistentVolumeClaims ({', '.join(claims)}) but "
                "mode workspaces co-locates the pods of one claim, so a pod can join only one. "
                "Fix: run it in mode pipelineruns ("
                + _MODE_LABEL_WHERE.get(run_label, f"label the run {LABEL_MODE}=pipelineruns")
                + ", or label its namespace), which co-locates all volumes of the run; or mount "
                "one claim.",
            )
            return None
        placeholder = claim_placeholder(namespace, claims[0])
        if decision.trace:
            decision.reasons.append(f"placeholder {placeholder}: the claim {claims[0]!r}")
    else:
        placeholder = run_placeholder(namespace, run)
        if decision.trace:
            decision.reasons.append(f"placeholder {placeholder}: the run {run!r} in {namespace!r}")
    decision.placeholder = placeholder
    return placeholder
