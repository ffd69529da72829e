"""The admission decision: ``(pod, context) -> Decision``. Pure: no I/O, no clock, no globals.

Everything the webhook does to a pod is decided here and returned as JSONPatch operations
built by hand against the pod as submitted, with a sentence per step for ``explain``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from webhook.contract import (
    ANNOTATION_CLAIMS,
    ANNOTATION_MODE,
    ANNOTATION_RUN,
    ANNOTATION_RUN_LABEL,
    ANNOTATION_TOPOLOGY_KEY,
    COMPONENT_AFFINITY_ASSISTANT,
    LABEL_COMPONENT,
    LABEL_ENABLED,
    LABEL_INSTANCE,
    LABEL_MODE,
    LABEL_PLACEHOLDER,
)
from webhook.decide import pod as podview
from webhook.decide.modes import MODE_CHOICES, InvalidMode, Mode, choose_mode
from webhook.decide.names import claim_placeholder, run_placeholder
from webhook.settings import Settings
from webhook.wire import jsonpatch
from webhook.wire.jsonpatch import Op

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


@dataclass(frozen=True, slots=True)
class NamespaceInfo:
    """What the namespace cache knows of the request's namespace."""

    labels: Mapping[str, str]

    @property
    def enabled(self) -> bool:
        return self.labels.get(LABEL_ENABLED) == "true"


@dataclass(frozen=True, slots=True)
class AdmissionContext:
    settings: Settings
    namespace: str
    # None: no cluster (or the namespace is not in the cache yet): the MutatingWebhook
    # configuration's namespaceSelector already chose the namespace; cluster config applies.
    namespace_info: NamespaceInfo | None = None


@dataclass(slots=True)
class Decision:
    allowed: bool
    ops: list[Op] = field(default_factory=list)
    mode: Mode | None = None
    placeholder: str | None = None
    rule: str | None = None  # the rule that denied the pod
    message: str | None = None  # the denial, as kubectl will print it
    warnings: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)  # every step, for ``explain``

    @property
    def mode_label(self) -> str:
        return self.mode.value if self.mode is not None else "none"


def affinity_term(placeholder: str, topology_key: str) -> dict[str, Any]:
    """The required pod-affinity term that pins a pod to its placeholder."""
    return {
        "labelSelector": {
            "matchLabels": {
                LABEL_COMPONENT: COMPONENT_AFFINITY_ASSISTANT,
                LABEL_INSTANCE: placeholder,
            }
        },
        "topologyKey": topology_key,
    }


def _term_instance(term: Any) -> str | None:
    """The placeholder a term selects, if it is an affinity-assistant term."""
    if not isinstance(term, dict):
        return None
    selector = term.get("labelSelector")
    if not isinstance(selector, dict):
        return None
    labels = selector.get("matchLabels")
    if not isinstance(labels, dict) or labels.get(LABEL_COMPONENT) != COMPONENT_AFFINITY_ASSISTANT:
        return None
    instance = labels.get(LABEL_INSTANCE)
    return instance if isinstance(instance, str) else None


def run_identity(
    labels: Mapping[str, str], group_labels: tuple[str, ...]
) -> tuple[str, str] | None:
    """(label key, run) from the first group label present with a value."""
    for key in group_labels:
        value = labels.get(key)
        if value:
            return key, value
    return None


def decide(pod: Mapping[str, Any], ctx: AdmissionContext) -> Decision:
    """Decide what to do with a Pod CREATE. Raises ``podview.MalformedPod`` on bad shapes."""
    settings = ctx.settings
    meta = podview.metadata(pod)
    labels = podview.string_map(meta, "labels")
    decision = Decision(allowed=True)
    reasons = decision.reasons

    if labels.get(LABEL_COMPONENT) == COMPONENT_AFFINITY_ASSISTANT:
        reasons.append(
            f"left alone: a placeholder pod ({LABEL_COMPONENT}={COMPONENT_AFFINITY_ASSISTANT})"
        )
        return decision

    info = ctx.namespace_info
    if info is not None and not info.enabled:
        reasons.append(
            f"left alone: namespace {ctx.namespace!r} is not labelled {LABEL_ENABLED}=true"
        )
        return decision

    choice = choose_mode(
        labels, info.labels if info is not None else None, settings.mode, settings.mode_reason
    )
    if isinstance(choice, InvalidMode):
        where = (
            f"the pod's label {LABEL_MODE}"
            if choice.source == "pod label"
            else f"namespace {ctx.namespace!r}'s label {LABEL_MODE}"
        )
        return _deny(
            decision,
            "invalid-mode",
            f"{where} is {choice.value!r}, which is not a coschedule mode. "
            f"Fix: set it to one of {MODE_CHOICES}, or remove it to use the "
            f"{'namespace or cluster' if choice.source == 'pod label' else 'cluster'} mode.",
        )
    decision.mode = choice.mode
    reasons.append(f"mode {choice.mode.value}: from the {choice.reason}")
    if choice.mode is Mode.DISABLED:
        reasons.append("left alone: coscheduling is disabled")
        return decision

    identity = run_identity(labels, settings.group_labels)
    if identity is None:
        reasons.append(
            "left alone: not part of a run (none of the group labels "
            f"{', '.join(settings.group_labels)} is set)"
        )
        return decision
    run_label, run = identity
    reasons.append(f"run {run!r}: from label {run_label}")

    pod_spec = podview.spec(pod)
    claims: list[str] = []
    for _, _, claim in podview.claim_volumes(pod_spec):
        if claim not in claims:
            claims.append(claim)

    if choice.mode is Mode.WORKSPACES:
        if not claims:
            reasons.append("left alone: mode workspaces groups by claim and the pod mounts none")
            return decision
        if len(claims) > 1:
            return _deny(
                decision,
                "workspaces-single-claim",
                f"pod mounts {len(claims)} PersistentVolumeClaims ({', '.join(claims)}) but "
                "mode workspaces co-locates the pods of one claim, so a pod can join only one. "
                f"Fix: run it in mode pipelineruns (label the run {LABEL_MODE}=pipelineruns, "
                f"or its namespace), which co-locates all volumes of the run; or mount one claim.",
            )
        placeholder = claim_placeholder(ctx.namespace, claims[0])
        reasons.append(f"placeholder {placeholder}: the claim {claims[0]!r}")
    else:
        placeholder = run_placeholder(ctx.namespace, run)
        reasons.append(f"placeholder {placeholder}: the run {run!r} in {ctx.namespace!r}")
    decision.placeholder = placeholder

    ops = decision.ops
    previous = labels.get(LABEL_PLACEHOLDER)
    _affinity_ops(pod_spec, placeholder, previous, settings.topology_key, ops, decision)
    _mark_ops(
        meta,
        labels,
        {
            ANNOTATION_MODE: choice.mode.value,
            ANNOTATION_RUN: run,
            ANNOTATION_RUN_LABEL: run_label,
            ANNOTATION_CLAIMS: ",".join(claims),
            ANNOTATION_TOPOLOGY_KEY: settings.topology_key,
        },
        placeholder,
        ops,
    )
    reasons.append(f"{len(ops)} patch operation(s)" if ops else "already mutated: nothing to add")
    return decision


def _deny(decision: Decision, rule: str, message: str) -> Decision:
    decision.allowed = False
    decision.rule = rule
    decision.message = f"coschedule: rule {rule}: {message}"
    decision.reasons.append(f"denied by rule {rule}")
    return decision


def _affinity_ops(
    pod_spec: Mapping[str, Any],
    placeholder: str,
    previous: str | None,
    topology_key: str,
    ops: list[Op],
    decision: Decision,
) -> None:
    """Append the placeholder term to the pod's own affinity, creating only what is absent."""
    term = affinity_term(placeholder, topology_key)
    if not pod_spec:
        ops.append(jsonpatch.add("/spec", {"affinity": {"podAffinity": {REQUIRED: [term]}}}))
        decision.reasons.append("affinity: created spec.affinity with the placeholder term")
        return
    affinity = podview.sub_object(pod_spec, "affinity", "pod.spec")
    if affinity is None:
        ops.append(jsonpatch.add("/spec/affinity", {"podAffinity": {REQUIRED: [term]}}))
        decision.reasons.append("affinity: created spec.affinity with the placeholder term")
        return
    pod_affinity = podview.sub_object(affinity, "podAffinity", "pod.spec.affinity")
    if pod_affinity is None:
        ops.append(jsonpatch.add("/spec/affinity/podAffinity", {REQUIRED: [term]}))
        decision.reasons.append(
            "affinity: added podAffinity; the pod's node affinity and anti-affinity are kept"
        )
        return
    terms = podview.sub_list(pod_affinity, REQUIRED, "pod.spec.affinity.podAffinity")
    base = "/spec/affinity/podAffinity/" + REQUIRED
    if terms is None:
        ops.append(jsonpatch.add(base, [term]))
        decision.reasons.append("affinity: added a required podAffinity list to the pod's own")
        return

    present = False
    stale: list[int] = []
    for index, existing in enumerate(terms):
        instance = _term_instance(existing)
        if instance is None:
            continue
        if instance == placeholder and existing.get("topologyKey") == topology_key:
            present = True
        elif previous is not None and instance == previous:
            # Ours from an earlier admission under another decision (reinvocation after
            # another webhook changed the pod): it would pin the pod twice.
            stale.append(index)
        elif instance != placeholder:
            decision.warnings.append(
                f"pod already has an affinity-assistant term to {instance!r}: is Tekton's own "
                "Affinity Assistant also on? Set coschedule: disabled in Tekton's feature-flags "
                "so that only one of them pins this run"
            )
    for index in reversed(stale):
        ops.append(jsonpatch.remove(f"{base}/{index}"))
        decision.reasons.append(f"affinity: removed the stale term to {previous!r}")
    if present:
        decision.reasons.append("affinity: the placeholder term is already there")
    else:
        ops.append(jsonpatch.add(base + "/-", term))
        decision.reasons.append(
            f"affinity: appended the placeholder term to {len(terms) - len(stale)} existing "
            "required podAffinity term(s)"
        )


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
        ops.append(
            jsonpatch.add(jsonpatch.pointer("metadata", "labels", LABEL_PLACEHOLDER), placeholder)
        )

    annotations = podview.string_map(meta, "annotations")
    if meta.get("annotations") is None:
        ops.append(jsonpatch.add("/metadata/annotations", annotations_wanted))
        return
    for key, value in annotations_wanted.items():
        if annotations.get(key) != value:
            ops.append(jsonpatch.add(jsonpatch.pointer("metadata", "annotations", key), value))
