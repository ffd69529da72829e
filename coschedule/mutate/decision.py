"""The admission decision: ``(pod, context) -> Decision``. Pure: no I/O, no clock, no globals.

Everything the webhook does to a pod is decided here and returned as JSONPatch operations
built by hand against the pod as submitted, with a sentence per step for ``explain``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from coschedule import marks
from coschedule.config.policy import (
    CONTROL_PLANE_KEYS,
    EVICTION_DELAY_KEYS,
    Finding,
    PolicyMode,
    check_policy,
    delays_eviction,
)
from coschedule.config.settings import Settings, isolation_problem
from coschedule.engines import BY_KIND, pod_recreated_by_owner
from coschedule.k8s.constants import HOSTNAME, REQUIRED
from coschedule.k8s.nodeaffinity import required_terms
from coschedule.k8s.volumes import VolumeTopology
from coschedule.marks import (
    ALL_MARK_ANNOTATIONS,
    COMPONENT_AFFINITY_ASSISTANT,
    LABEL_COMPONENT,
    LABEL_ENABLED,
    LABEL_GATED_BY,
    LABEL_ISOLATION_SCOPE,
    LABEL_MODE,
    LABEL_PLACEHOLDER,
    MODE_CHOICES,
    SCOPE_CHOICES,
    IsolationScope,
    Mode,
    NamespaceInfo,
    Placement,
    claim_placeholder,
    run_identity,
    run_placeholder,
)
from coschedule.mutate import claim_rewrite as claims_mod
from coschedule.mutate import isolation, volume_conflict
from coschedule.mutate.claim_rewrite import ClaimView
from coschedule.mutate.defaults import MergedScheduling, merge_defaults
from coschedule.mutate.isolation import InvalidScope, ScopeChoice
from coschedule.mutate.mode_choice import InvalidMode, ModeChoice, choose_mode, cluster_choice
from coschedule.placement import node_pin
from coschedule.wire import jsonpatch
from coschedule.wire import pod_fields as podview
from coschedule.wire.jsonpatch import Op

# Our keys are constants: escape their paths once, not on every admission.
_PLACEHOLDER_LABEL_PATH = jsonpatch.pointer("metadata", "labels", LABEL_PLACEHOLDER)
_GATED_BY_PATH = jsonpatch.pointer("metadata", "labels", LABEL_GATED_BY)
_DISABLED = Mode.DISABLED.value
_ANNOTATION_PATHS = {
    key: jsonpatch.pointer("metadata", "annotations", key) for key in ALL_MARK_ANNOTATIONS
}
_ANNOTATED: Mapping[str, Any] = {"annotations": {}}  # the pod's metadata once marked
_REQUIRED_POD_AFFINITY = "/spec/affinity/podAffinity/" + REQUIRED


@dataclass(frozen=True, slots=True)
class AdmissionContext:
    settings: Settings
    namespace: str
    # None: no cluster (or the namespace is not in the cache yet): the MutatingWebhook
    # configuration's namespaceSelector already chose the namespace; cluster config applies.
    namespace_info: NamespaceInfo | None = None
    # None: no cluster: claims are grouped as mounted and never rewritten.
    claims: ClaimView | None = None
    # None: no cluster (or not synced): the claims-conflict pre-flight is skipped.
    volumes: VolumeView | None = None
    # None: no cluster (or not synced): no placeholder is bound, so a pod placed by node
    # name is gated and the reconciler pins it (placement ``auto``).
    placeholders: PlaceholderView | None = None
    # Write a reason per step (``explain``); the webhook never reads them and skips them.
    explain: bool = True
    # The mode of a pod when neither it nor its namespace is labelled: most pods.
    cluster_mode: ModeChoice = field(init=False, repr=False, compare=False)
    # The same for an isolated run's scope.
    cluster_scope: ScopeChoice = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        choice = cluster_choice(self.settings.mode, self.settings.mode_reason)
        object.__setattr__(self, "cluster_mode", choice)
        object.__setattr__(self, "cluster_scope", isolation.cluster_scope(self.settings))


class VolumeView(Protocol):
    """Where each PersistentVolume can be used, by name (a watch-fed cache)."""

    @property
    def synced(self) -> bool: ...

    def get(self, name: str) -> VolumeTopology | None: ...


class PlaceholderView(Protocol):
    """The node each placeholder's pod is bound to (a watch-fed cache)."""

    def node(self, namespace: str, placeholder: str) -> str | None:
        """None: not bound, terminating, or not known (yet)."""
        ...


@dataclass(slots=True)
class Decision:
    allowed: bool
    ops: list[Op] = field(default_factory=list)
    mode: Mode | None = None
    placeholder: str | None = None
    rule: str | None = None  # the rule that denied the pod
    message: str | None = None  # the denial, as kubectl will print it
    # isolate-pipelinerun: the run's isolation scope and why (None in other modes).
    scope: ScopeChoice | None = None
    tenant: str = ""  # the namespace's tenant (isolation-tenant-label), "" when none
    warnings: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)  # every step, for ``explain``
    # Claims the pod mounts that the claim cache has not seen yet: the caller may wait
    # for the watch to deliver them and decide again (never a guess, never an API call).
    missing_claims: tuple[str, ...] = ()
    # The run's volumeClaimTemplates as decided here (None: the placeholder's rule).
    templates: tuple[marks.ClaimTemplate, ...] | None = None
    # The pod's nodeSelector/tolerations/schedulerName as stored, and which scheduling
    # defaults rule gave what (None: defaults and policy did not apply to this pod, or there
    # was nothing for them to do: no rule configured and nothing a policy rule reads).
    scheduling: MergedScheduling | None = None
    findings: list[Finding] = field(default_factory=list)  # policy rules that fired
    # Placed by node name (pinned, or held behind the placeholder's gate for the reconciler
    # to pin: ``held``).
    by_node_name: bool = False
    held: bool = False
    trace: bool = True  # the steps write ``reasons`` (the context's ``explain``)

    @property
    def mode_label(self) -> str:
        return str(self.mode) if self.mode is not None else "none"  # .value is slower


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
        _drop_policy_gate(pod, decision)
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
        if settings.scheduling_defaults or not _nothing_to_flag(pod_spec):
            merged = _scheduling_defaults_step(pod, pod_spec, labels, ctx, decision)
            _policy_step(pod_spec, ctx, decision, merged)
    if decision.trace and decision.allowed and decision.placeholder is not None:
        # Counted last: the scheduling defaults add theirs after the placeholder's.
        decision.reasons.append(
            f"{len(decision.ops)} patch operation(s)"
            if decision.ops
            else "already mutated: nothing to add"
        )
    return decision


def _drop_policy_gate(pod: Mapping[str, Any], decision: Decision) -> None:
    """The admission policy gates every pod that may be placed by node name (CEL cannot tell
    which are); one this decision does not hold gets the gate lifted again here."""
    ops = node_pin.ungate_ops(podview.spec(pod))
    if ops:  # the policy's label goes with its gate: it marks a pod no one has decided on
        ops.append(jsonpatch.remove(_GATED_BY_PATH))
    decision.ops.extend(ops)
    if ops and decision.trace:
        decision.reasons.append(
            f"gate: the admission policy's {marks.GATE_PLACEHOLDER} gate lifted: "
            "this pod is not held for the reconciler"
        )


def _nothing_to_flag(pod_spec: Mapping[str, Any]) -> bool:
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
    if tolerations is None:
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


def _scheduling_defaults_step(
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


def _policy_step(
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
        _deny(decision, denial.deny_rule, denial.message)


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
    mode = _mode_step(labels, ctx, decision)
    if mode is None:
        return decision
    identity = _run_step(labels, settings, decision)
    if identity is None:
        return decision
    run_label, run = identity
    scope = IsolationScope.NAMESPACE
    if mode is Mode.ISOLATE_PIPELINERUN:
        chosen = _isolation_step(labels, ctx, decision)
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
    found = _claims_step(pod_spec, volumes, ctx, mode, run, decision)
    if found is None:
        return decision
    claims, view = found
    placeholder = _placeholder_step(ctx.namespace, mode, run_label, run, claims, decision)
    if placeholder is None:
        return decision

    ops = decision.ops
    mounted = claims
    if view is not None and mode.per_run:  # offline (no view), no enum property read
        mounted = _rewrite_claims(
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
    if settings.placement is Placement.AUTO and _by_node_name(meta, settings, decision):
        node = _node_placement_ops(pod_spec, meta, placeholder, previous, ctx, ops, decision)
        _mark_ops(meta, labels, wanted, placeholder, ops)
        if node is not None:
            # After the marks: the pod's annotations exist by then.
            marked = meta if meta.get("annotations") else _ANNOTATED
            ops.extend(node_pin.pinned_node_op(marked, node))
    else:
        _affinity_ops(pod_spec, placeholder, previous, settings.topology_key, ops, decision)
        _mark_ops(meta, labels, wanted, placeholder, ops)
    return decision


def _mode_step(labels: Mapping[str, str], ctx: AdmissionContext, decision: Decision) -> Mode | None:
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
        _deny(
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


def _isolation_step(
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
        _deny(
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
        _deny(
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


def _run_step(
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


def _claims_step(
    pod_spec: Mapping[str, Any],
    volumes: list[tuple[int, str, str]],
    ctx: AdmissionContext,
    mode: Mode,
    run: str,
    decision: Decision,
) -> tuple[list[str], ClaimView | None] | None:
    """The claims that group the pod, and the claim view to rewrite them with (None: none);
    None when the pod is denied."""
    settings = ctx.settings
    view = ctx.claims
    if view is not None and not view.synced:
        if not (volumes and mode.per_run and settings.rewrite_claims):
            view = None  # grouping as mounted is safe; only a rewrite needs the cache
        else:
            _deny(
                decision,
                "claim-cache-not-synced",
                "coschedule has not finished reading the cluster's claims since it started, "
                "so it cannot tell which claims of this run it co-locates. This is temporary: "
                "retry the pod in a few seconds.",
            )
            return None
    claims: list[str] = []
    for _, _, claim in volumes:
        if claim in claims:
            continue
        known = view.get(ctx.namespace, claim) if view is not None else None
        if view is not None and known is None and not marks.is_placeholder_claim(claim):
            decision.missing_claims += (claim,)
        if not claims_mod.groupable(known, settings.group_shared_claims):
            why = (
                "labelled coschedule.dev/skip=true" if known and known.skip else "shared (RWX/ROX)"
            )
            if decision.trace:
                decision.reasons.append(f"claim {claim!r}: {why}: neither grouped nor rewritten")
            continue
        claims.append(claim)
    if decision.missing_claims and mode.per_run and settings.rewrite_claims:
        _deny(
            decision,
            "claim-unknown",
            f"claim(s) {', '.join(decision.missing_claims)} are not in coschedule's claim cache "
            "yet, so it cannot tell whether the run's placeholder provisions them. Retry the "
            "pod in a few seconds; if the claim does not exist, create it first.",
        )
        return None
    if view is not None and mode.per_run:
        conflict = _claims_conflict(pod_spec, ctx, view, run, claims)
        if conflict is not None:
            _deny(decision, volume_conflict.RULE, conflict)
            return None
    return claims, view


# Where a user sets the mode label so that a run's pods carry it: Tekton copies a
# PipelineRun's labels to its pods; Argo copies none of a Workflow's, only its
# spec.podMetadata.labels.
_MODE_LABEL_WHERE = {
    BY_KIND["Workflow"].run_label: f"set {LABEL_MODE}: pipelineruns in the Workflow's "
    "spec.podMetadata.labels, which Argo puts on its pods",
}


def _placeholder_step(
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
            _deny(
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


def _claims_conflict(
    pod_spec: Mapping[str, Any],
    ctx: AdmissionContext,
    view: ClaimView,
    run: str,
    claims: list[str],
) -> str | None:
    """Rule claims-conflict: the run's bound claims cannot be used in one place."""
    volumes = ctx.volumes
    if volumes is None or not volumes.synced:
        return None

    def bound(info: claims_mod.ClaimInfo | None) -> volume_conflict.BoundClaim | None:
        if info is None or not info.volume:
            return None
        topology = volumes.get(info.volume)
        if topology is None or not topology.terms:
            return None
        return volume_conflict.BoundClaim(info.name, topology)

    own = [b for c in claims if (b := bound(view.get(ctx.namespace, c))) is not None]
    run_claims = [b for info in view.run_claims(ctx.namespace, run) if (b := bound(info))]
    if not own and not run_claims:
        return None
    selector = pod_spec.get("nodeSelector")
    return volume_conflict.check(
        own,
        run_claims,
        ctx.settings.topology_key,
        {k: v for k, v in selector.items() if isinstance(v, str)}
        if isinstance(selector, dict)
        else {},
        required_terms(pod_spec.get("affinity")),
    )


def _rewrite_claims(
    namespace: str,
    run: str,
    placeholder: str,
    volumes: list[tuple[int, str, str]],
    claims: list[str],
    view: claims_mod.ClaimView,
    settings: Settings,
    ops: list[Op],
    decision: Decision,
) -> list[str]:
    """Point the run's template claims at the placeholder's; return the claims the
    placeholder must mount as they are (bound ones, the user's: they may hold data)."""
    reasons = decision.reasons
    existing = view.placeholder_templates(namespace, placeholder)
    earlier = view.pod_decision(namespace, placeholder) if existing is None else None
    if existing is not None:
        # The StatefulSet exists: its (immutable) templates are the run's decision.
        chosen = {claim: template for template, claim in existing.items()}
        if decision.trace:
            reasons.append(f"claims: following the {len(chosen)} template(s) of {placeholder}")
    elif earlier is not None:
        # An earlier pod of the run carries the decision: follow it, even if a claim got
        # bound since (Immediate binding): the run's pods must all agree.
        decision.templates = earlier
        chosen = {t.claim: t.name for t in earlier}
        if decision.trace:
            reasons.append(
                f"claims: following the run's earlier pods: the placeholder provisions "
                f"{sorted(chosen) or 'none'}"
            )
    elif not settings.rewrite_claims:
        # The default: the placeholder mounts the engine's own claims, so a workspace has
        # one volume whatever its class's binding mode (WaitForFirstConsumer: the
        # placeholder is the first consumer, as the run's pods wait for it; Immediate: the
        # run goes where the volume is). An earlier decision (above) is still followed.
        decision.templates = ()
        chosen = {}
        if decision.trace:
            reasons.append("claims: rewrite-claims is off: the placeholder mounts them as they are")
    else:
        templates = claims_mod.run_templates(
            view.run_claims(namespace, run), run, settings.group_shared_claims
        )
        decision.templates = templates
        chosen = {t.claim: t.name for t in templates}
        if decision.trace:
            reasons.append(
                f"claims: the run's unbound template claims are {sorted(chosen) or 'none'}; "
                "the placeholder provisions them"
            )
    mounted: list[str] = []
    for index, _, claim in volumes:
        if claim not in claims:
            continue  # skipped or shared: left as it is
        if marks.is_placeholder_claim(claim, placeholder):
            if decision.trace:
                reasons.append(f"claim {claim!r}: already the placeholder's")
            continue
        template = chosen.get(claim)
        if template is not None:
            target = marks.placeholder_claim(template, placeholder)
            ops.append(
                jsonpatch.replace(f"/spec/volumes/{index}/persistentVolumeClaim/claimName", target)
            )
            if decision.trace:
                reasons.append(f"claim {claim!r}: rewritten to {target!r} (template {template!r})")
            continue
        info = view.get(namespace, claim)
        if info is not None and info.bound:
            why = "bound (it may hold data)"
        elif info is not None and not info.belongs_to(run):
            why = "not made for this run"
        else:
            why = "not in the placeholder's templates"
        if decision.trace:
            reasons.append(f"claim {claim!r}: kept, {why}; the placeholder mounts it")
        if claim not in mounted:
            mounted.append(claim)
    return mounted


def _deny(decision: Decision, rule: str, message: str) -> Decision:
    decision.allowed = False
    decision.rule = rule
    decision.message = f"coschedule: rule {rule}: {message}"
    if decision.trace:
        decision.reasons.append(f"denied by rule {rule}")
    return decision


def _by_node_name(meta: Mapping[str, Any], settings: Settings, decision: Decision) -> bool:
    """Placement ``auto``: whether this pod is placed by node name (pinned, or gated until
    its placeholder is bound) instead of by a pod-affinity term. Only where a pod left
    pending on a node its placeholder left can be deleted and come back: its owner
    recreates it (a Tekton TaskRun's pod), and the run is kept on one node."""
    if settings.topology_key != HOSTNAME:
        if decision.trace:
            decision.reasons.append(
                f"placement: pod affinity: the topology key is {settings.topology_key}, and a "
                "node name pins one node, not a domain"
            )
        return False
    if not pod_recreated_by_owner(meta.get("ownerReferences")):
        if decision.trace:
            decision.reasons.append(
                "placement: pod affinity: the pod's controller does not recreate a deleted "
                "pod (only a Tekton TaskRun does), so a pin that its run leaves could strand it"
            )
        return False
    return True


def _node_placement_ops(
    pod_spec: Mapping[str, Any],
    meta: Mapping[str, Any],
    placeholder: str,
    previous: str | None,
    ctx: AdmissionContext,
    ops: list[Op],
    decision: Decision,
) -> str | None:
    """Pin the pod to its placeholder's node when the webhook knows it, else hold it behind
    the placeholder's gate for the reconciler to pin; return the node pinned (None: gated).
    Reinvoked on its own output it adds nothing: a gated pod stays gated (the reconciler
    pins it), a pinned one stays pinned unless the placeholder has moved since."""
    trace = decision.trace
    decision.by_node_name = True
    # Most pods (a TaskRun's pod as Tekton makes it) have no affinity and no gate: each step
    # below that reads one is skipped by a dict lookup (the same answer: an absent or null
    # field is what those steps skip), as a call per step is what this path costs under load.
    if pod_spec.get("affinity") is not None:
        _drop_placeholder_terms(pod_spec, placeholder, previous, ops, decision)
    view = ctx.placeholders
    node = view.node(ctx.namespace, placeholder) if view is not None else None
    gates = pod_spec.get("schedulingGates")
    gated = gates is not None and node_pin.gate_index(pod_spec) is not None
    if gated and node is not None and previous is None:
        # Gated by the admission policy, not by an earlier admission of ours (which, on
        # reinvocation, stays as it decided), and the placeholder is bound: pin it and lift
        # the gate, as the reconciler would.
        ops.extend(node_pin.pin_ops(pod_spec, node, node_pin.pinned_node(meta)))
        ops.extend(node_pin.ungate_ops(pod_spec))
        if trace:
            decision.reasons.append(
                f"placement: by node name: the placeholder's pod is bound to {node!r}: pinned "
                f"to it, and the {marks.GATE_PLACEHOLDER} gate lifted"
            )
        return node
    decision.held = True
    if gated:
        if trace:
            decision.reasons.append(
                f"placement: by node name: already held behind the {marks.GATE_PLACEHOLDER} "
                "gate; the reconciler pins it once the placeholder is bound"
            )
        return None
    if node is None:
        if gates is None and pod_spec:
            ops.append(jsonpatch.add("/spec/schedulingGates", [node_pin.gate()]))
        else:
            ops.extend(node_pin.gate_ops(pod_spec))
        if trace:
            pinned = node_pin.pinned_node(meta)
            why = "not known" if view is None else "not bound yet"
            decision.reasons.append(
                f"placement: by node name: the placeholder's node is {why}: held behind the "
                f"{marks.GATE_PLACEHOLDER} scheduling gate until the reconciler pins it there"
                + (f" (replacing the pin to {pinned!r})" if pinned else "")
            )
        return None
    pinned = node_pin.pinned_node(meta)
    ops.extend(node_pin.pin_ops(pod_spec, node, pinned))
    if trace:
        if pinned == node:
            what = "already pinned to it"
        elif pinned:
            what = f"pinned to it (was {pinned!r}, which the placeholder left)"
        else:
            what = "pinned to it (spec.affinity.nodeAffinity matchFields metadata.name)"
        decision.reasons.append(
            f"placement: by node name: the placeholder's pod is bound to {node!r}: {what}"
        )
    return node


def _drop_placeholder_terms(
    pod_spec: Mapping[str, Any],
    placeholder: str,
    previous: str | None,
    ops: list[Op],
    decision: Decision,
) -> None:
    """Placed by node name, the pod carries no pod-affinity term of ours: one an earlier
    admission added (under ``pod-affinity``) is removed; another assistant's is warned of."""
    if not pod_spec:
        return
    affinity = podview.sub_object(pod_spec, "affinity", "pod.spec")
    pod_affinity = (
        podview.sub_object(affinity, "podAffinity", "pod.spec.affinity") if affinity else None
    )
    if not pod_affinity:
        return
    terms = podview.sub_list(pod_affinity, REQUIRED, "pod.spec.affinity.podAffinity")
    if not terms:
        return
    ours, _ = _placeholder_terms(terms, placeholder, previous, None, decision)
    for index in reversed(ours):
        ops.append(jsonpatch.remove(f"{_REQUIRED_POD_AFFINITY}/{index}"))
    if ours and decision.trace:
        decision.reasons.append(f"affinity: removed {len(ours)} placeholder term(s) of ours")


def _placeholder_terms(
    terms: list[Any],
    placeholder: str,
    previous: str | None,
    topology_key: str | None,
    decision: Decision,
) -> tuple[list[int], bool]:
    """(indexes of our terms to remove, whether the wanted term is there): a term to the
    placeholder with ``topology_key`` is wanted (none when None); one to it with another
    key or to ``previous`` is ours from an earlier admission. A term to another placeholder
    (Tekton's own Affinity Assistant) gets a warning."""
    present = False
    stale: list[int] = []
    for index, existing in enumerate(terms):
        instance = marks.term_placeholder(existing)
        if instance is None:
            continue
        if instance == placeholder and (
            topology_key is None or existing.get("topologyKey") == topology_key
        ):
            if topology_key is None:
                stale.append(index)
            else:
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
    return stale, present


def _affinity_ops(
    pod_spec: Mapping[str, Any],
    placeholder: str,
    previous: str | None,
    topology_key: str,
    ops: list[Op],
    decision: Decision,
) -> None:
    """Append the placeholder term to the pod's own affinity, creating only what is absent."""
    term = marks.affinity_term(placeholder, topology_key)
    if not pod_spec:
        ops.append(jsonpatch.add("/spec", {"affinity": {"podAffinity": {REQUIRED: [term]}}}))
        if decision.trace:
            decision.reasons.append("affinity: created spec.affinity with the placeholder term")
        return
    affinity = podview.sub_object(pod_spec, "affinity", "pod.spec")
    if affinity is None:
        ops.append(jsonpatch.add("/spec/affinity", {"podAffinity": {REQUIRED: [term]}}))
        if decision.trace:
            decision.reasons.append("affinity: created spec.affinity with the placeholder term")
        return
    pod_affinity = podview.sub_object(affinity, "podAffinity", "pod.spec.affinity")
    if pod_affinity is None:
        ops.append(jsonpatch.add("/spec/affinity/podAffinity", {REQUIRED: [term]}))
        if decision.trace:
            decision.reasons.append(
                "affinity: added podAffinity; the pod's node affinity and anti-affinity are kept"
            )
        return
    terms = podview.sub_list(pod_affinity, REQUIRED, "pod.spec.affinity.podAffinity")
    base = _REQUIRED_POD_AFFINITY
    if terms is None:
        ops.append(jsonpatch.add(base, [term]))
        if decision.trace:
            decision.reasons.append("affinity: added a required podAffinity list to the pod's own")
        return

    stale, present = _placeholder_terms(terms, placeholder, previous, topology_key, decision)
    for index in reversed(stale):
        ops.append(jsonpatch.remove(f"{base}/{index}"))
        if decision.trace:
            decision.reasons.append(f"affinity: removed the stale term to {previous!r}")
    if present:
        if decision.trace:
            decision.reasons.append("affinity: the placeholder term is already there")
    else:
        ops.append(jsonpatch.add(base + "/-", term))
        if decision.trace:
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
        ops.append(jsonpatch.add(_PLACEHOLDER_LABEL_PATH, placeholder))

    annotations = podview.string_map(meta, "annotations")
    if meta.get("annotations") is None:
        ops.append(jsonpatch.add("/metadata/annotations", annotations_wanted))
        return
    for key, value in annotations_wanted.items():
        if annotations.get(key) != value:
            ops.append(jsonpatch.add(_ANNOTATION_PATHS[key], value))  # every mark is one
