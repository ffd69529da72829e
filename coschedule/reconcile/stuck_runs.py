"""Stuck runs, planned: ``plan_stuck(observed, facts, settings, now) -> Plan``. Pure.

For a group with a live pod and a bound placeholder, after ``plan``'s actions: move the
placeholder when a pod of the run is stuck because of its node and moving loses nothing,
else explain (once per change); say so when the placeholder itself cannot be placed.
The decisions (stuck? safe? where to?) are ``stuck``'s; this module composes them into
actions the ``Executor`` carries out, and a look again instead of a timer.

What the caches do not hold is read only when a pod is stuck (rare): ``step`` answers with
the claims (GET) and the nodes' bound requests (LIST by ``spec.nodeName``) it needs first;
``stuck_facts.read_and_plan`` reads them until nothing more is wanted, and plans with what
it read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from coschedule import marks
from coschedule.config.settings import Settings
from coschedule.k8s import fit
from coschedule.k8s.constants import HOSTNAME, TERMINAL_PHASES
from coschedule.k8s.nodes import Node, parse_node
from coschedule.k8s.quantity import resources
from coschedule.k8s.scheduler_messages import parse
from coschedule.marks import Mode
from coschedule.reconcile import relocation, stuck
from coschedule.reconcile.model import (
    Action,
    ClearStuck,
    DeleteStrayPod,
    MarkStuck,
    Obj,
    Observed,
    ObservedSet,
    OwnerRef,
    Plan,
    RecordEvent,
    RelocatePlaceholder,
    Requeue,
)
from coschedule.reconcile.placeholder import (
    GroupSpec,
    group_spec,
    steered_template,
    template_patch,
)

RECHECK_MARGIN = 0.05  # look just after a grace period ends, not just before
# A stuck group is looked at again this often: what blocked a move (a running task, no
# room elsewhere) may change without an event on the group's own pods.
MIN_STUCK_RECHECK_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class StuckFacts:
    """What the planner reads beyond ``Observed``: cache views, memory, and what was read."""

    pods: Mapping[str, Obj]  # the group's marked pods as cached (scheduling facts), by name
    nodes: Mapping[str, Obj]  # every node as cached (with allocatable), by name
    placeholder_pods: Mapping[str, Obj]  # every placeholder pod as cached, by namespace/name
    explained: tuple[Any, ...] | None = None  # what was said about this group last
    was_stuck: bool = False  # counted stuck now
    # Read on demand (``Wanted``): the run's claims and their volumes; the requests of the
    # pods bound to a node, by node.
    claims: tuple[stuck.ClaimState, ...] | None = None
    usage: Mapping[str, Mapping[str, Decimal]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Wanted:
    """Facts to read before the next step can be decided."""

    claims: tuple[str, ...] | None = None  # the claims to read (None: none wanted)
    usage: tuple[str, ...] = ()  # the nodes whose bound pods' requests to read


@dataclass(frozen=True, slots=True)
class _Case:
    """A group with a stuck pod: what deciding, choosing a target and moving read."""

    observed: Observed
    sts: ObservedSet
    group: GroupSpec
    facts: StuckFacts
    settings: Settings
    now: float
    pod: stuck.PendingPod  # the stuck pod
    node: Node  # the group's node
    state: relocation.Relocations | None  # the domains the run has left

    @property
    def topology_key(self) -> str:
        return self.group.topology_key


def plan_stuck(observed: Observed, facts: StuckFacts, settings: Settings, now: float) -> Plan:
    """The actions for one group's stuck pods (if any) and when to look again. Pure; the
    facts ``step`` asks for must have been read."""
    planned = step(observed, facts, settings, now)
    if isinstance(planned, Wanted):
        raise ValueError(f"stuck-run facts not read yet: {planned}")
    return planned


def _clear(
    observed: Observed, facts: StuckFacts, *, forget: bool, why: str | None = None
) -> list[Action]:
    """Forget the group's stuck state, when there is any to forget."""
    if facts.was_stuck or (forget and facts.explained is not None):
        return [ClearStuck(observed.namespace, observed.name, forget, why)]
    return []


def step(observed: Observed, facts: StuckFacts, settings: Settings, now: float) -> Plan | Wanted:
    """The plan, or the facts to read before it can be decided. Pure."""
    sts = observed.statefulset
    live = [p for p in observed.pods if p.live]
    group = group_spec(observed.namespace, observed.name, observed.pods, observed.claims_kept)
    if sts is None or sts.deleting or not live or group is None:
        return Plan(tuple(_clear(observed, facts, forget=True)))
    state = relocation.parse(sts.annotations)
    placed = [p for p in observed.placeholder_pods if not p.deleting and p.node_name]
    actions: list[Action] = _strays(observed, placed, facts, state) if state is not None else []
    here = [p for p in placed if p.node_name in facts.nodes]
    grace = float(settings.stuck_grace_seconds)
    if not here:
        # The placeholder is being (re)scheduled: its pods wait for it. Say so if the
        # scheduler cannot place it either (never a silent hang).
        return _placeholder_pending(observed, facts, state, grace, now, actions)
    node = parse_node(facts.nodes[here[0].node_name])
    if state is not None and now < state.at + grace:
        # Just moved: give the scheduler a grace period to place the run's pods there.
        return Plan(
            tuple(actions),
            Requeue(state.at + grace - now + RECHECK_MARGIN, "moved: the scheduler's grace"),
        )
    claims_of = {p.name: p.marks.claims for p in observed.pods}
    # A pod pinned to another node than the group's is stranded there, not stuck: it is
    # deleted for its engine to recreate it (``node_pins``), never a reason to move the run.
    pending = [
        found
        for name, obj in facts.pods.items()
        if (found := stuck.pending_pod(obj, claims_of.get(name, ()))) is not None
        and found.pinned_node in (None, node.name)
    ]
    pod, wait = stuck.find_stuck(pending, now, grace)
    requeue = (
        Requeue(wait + RECHECK_MARGIN, "a pending pod's stuck grace ends")
        if wait is not None
        else None
    )
    if pod is None:
        actions += _clear(observed, facts, forget=True, why="no pod of the run is stuck")
        return Plan(tuple(actions), requeue)
    case = _Case(observed, sts, group, facts, settings, now, pod, node, state)
    decided = _decide(case)
    if isinstance(decided, Wanted):
        return decided
    return Plan(tuple(actions), requeue).then(decided)


def _claim_names(case: _Case) -> tuple[str, ...]:
    templates = (marks.placeholder_claim(t, case.sts.name) for t in case.sts.templates)
    return tuple(dict.fromkeys([*case.group.claims, *templates]))


def _decide(case: _Case) -> Plan | Wanted:
    facts, pod, node = case.facts, case.pod, case.node
    if facts.claims is None or node.name not in facts.usage:
        return Wanted(
            claims=_claim_names(case) if facts.claims is None else None,
            usage=() if node.name in facts.usage else (node.name,),
        )
    claims = facts.claims
    findings = stuck.diagnose(pod, node, facts.usage[node.name], claims)
    diagnosed = bool(findings)
    if not findings:
        findings = stuck.from_message(pod, node.name)
    running = [
        stuck.Running(name, str((obj.get("spec") or {}).get("nodeName")))
        for name, obj in sorted(facts.pods.items())
        if (obj.get("spec") or {}).get("nodeName")
        and (obj.get("status") or {}).get("phase") not in TERMINAL_PHASES
        and not (obj.get("metadata") or {}).get("deletionTimestamp")
    ]
    blockers = stuck.unsafe(running)
    options: list[str] = []
    if running:
        options.append(
            "wait for the running task to finish: coschedule moves the run's placeholder "
            "once no pod of the run runs"
        )
    if not diagnosed:
        blockers.append(
            "the scheduler's reasons are not ones coschedule can check, so it cannot tell "
            "where the pod would fit"
        )
    if not blockers:
        target = _target(case, claims, blockers, options)
        if isinstance(target, Wanted):
            return target
        if target is not None:
            return _relocate(case, target, findings)
    return _explain(case, findings, blockers, options)


def _target(
    case: _Case,
    claims: Sequence[stuck.ClaimState],
    blockers: list[str],
    options: list[str],
) -> Node | Wanted | None:
    pod, facts = case.pod, case.facts
    first = f"{case.observed.name}-0"
    others = {
        str((obj.get("spec") or {}).get("nodeName"))
        for obj in facts.placeholder_pods.values()
        if (obj.get("spec") or {}).get("nodeName")
        and (obj.get("metadata") or {}).get("name") != first
    }
    left = set(case.state.left) if case.state is not None else set()
    candidates = stuck.static_candidates(
        pod,
        [parse_node(obj) for obj in facts.nodes.values()],
        topology_key=case.topology_key,
        current=case.node,
        left=left,
        claims=claims,
        # Every other placeholder, whatever the run's isolation scope: a superset of those
        # its own terms repel, and it covers those whose terms repel it (cluster-scoped runs
        # of other namespaces), which the placeholder pods do not show.
        excluded=others if case.group.mode is Mode.ISOLATE_PIPELINERUN else (),
        placeholder_tolerations=case.group.tolerations,
        run_selector=case.group.node_selector,
        run_terms=case.group.node_terms,
    )
    if candidates.volume_blocked:
        blockers.append(
            "the run's volumes can only be used where it is: "
            + ", ".join(candidates.volume_blocked)
        )
        options.extend(stuck.volume_options(candidates.volume_blocked))
        return None
    unread = tuple(n.name for n in candidates.nodes if n.name not in facts.usage)
    if unread:
        return Wanted(usage=unread)
    requests = resources(case.settings.placeholder_resources.get("requests"))
    requests[fit.PODS] = Decimal(1)
    target, rejected = stuck.choose_target(pod, candidates.nodes, facts.usage, requests, others)
    if target is None:
        why = {**candidates.rejected, **rejected}
        listed = "; ".join(f"{name}: {reason}" for name, reason in sorted(why.items()))
        blockers.append("no other node can take the pod" + (f" ({listed})" if listed else ""))
        options.append("add capacity: a node where the pod fits next to the placeholder")
    return target


# ---- what to do -------------------------------------------------------------------------


def relocation_patch(
    sts: ObservedSet,
    group: GroupSpec,
    settings: Settings,
    observed: Observed,
    moved: relocation.Relocations,
) -> Obj:
    """The conditional strategic merge patch that moves the placeholder: the new relocations
    state and the pod template it steers, by the one template-and-hash rule drift uses."""
    moved_to = moved.encode()
    template, annotations = steered_template(
        group,
        settings,
        observed.claim_templates,
        {**sts.annotations, relocation.ANNOTATION_RELOCATIONS: moved_to},
    )
    return {
        "metadata": {
            "annotations": {relocation.ANNOTATION_RELOCATIONS: moved_to, **annotations},
            "resourceVersion": sts.resource_version,
        },
        "spec": {"template": template_patch(template)},
    }


def _relocate(case: _Case, target: Node, findings: Sequence[stuck.Finding]) -> Plan:
    observed, sts, pod, node = case.observed, case.sts, case.pod, case.node
    state, topology_key, now = case.state, case.topology_key, case.now
    domain = node.domain(topology_key) or node.name
    hostname = target.labels.get(HOSTNAME, target.name)
    moved = (
        state.moved(topology_key, domain, hostname, now)
        if state is not None
        else relocation.first(topology_key, domain, hostname, now)
    )
    because = "; ".join(f.text for f in findings)
    message = (
        f"moved the placeholder of {_run(observed)} from node {node.name} towards node "
        f"{target.name}: pod {pod.name} could not be scheduled on {node.name} ({because}) "
        "and no pod of the run was running there"
    )
    relocate = RelocatePlaceholder(
        observed.namespace,
        observed.name,
        relocation_patch(sts, case.group, case.settings, observed, moved),
        tuple(
            p.name for p in observed.placeholder_pods if p.node_name == node.name and not p.deleting
        ),
        findings[0].cause.value,
        node.name,
        target.name,
        pod.key,
        because,
    )
    return Plan(
        (
            relocate,
            *_clear(observed, case.facts, forget=True),
            RecordEvent(observed.namespace, observed.name, "PlaceholderRelocated", message),
            *_run_events(observed, "RunRelocated", message, pod=pod),
        )
    )


def _explain(
    case: _Case,
    findings: Sequence[stuck.Finding],
    blockers: Sequence[str],
    options: Sequence[str],
) -> Plan:
    observed, pod, node = case.observed, case.pod, case.node
    again = Requeue(
        max(MIN_STUCK_RECHECK_SECONDS, float(case.settings.stuck_grace_seconds)),
        "stuck: what blocked a move may change",
    )
    fingerprint = (pod.name, node.name, tuple(f.cause for f in findings), tuple(blockers))
    if case.facts.explained == fingerprint:
        return Plan((MarkStuck(observed.namespace, observed.name),), again)
    text = stuck.explanation(pod, _run(observed), node.name, findings, blockers, options)
    mark = MarkStuck(
        observed.namespace,
        observed.name,
        fingerprint,
        text,
        pod.key,
        node.name,
        findings[0].cause.value if findings else "",
    )
    # One Event for one stuck run: on the run's owner, where its users look (kubectl
    # describe pipelinerun, tkn); the text names the pod, its node, why and the options. The
    # pod carries the scheduler's own FailedScheduling Event; ours goes on it only when no
    # run object owns the group (a pod grouped by coschedule.dev/group alone).
    owner = observed.owner.root if observed.owner is not None else None
    about = owner if owner is not None else OwnerRef("v1", "Pod", pod.name, pod.uid)
    told = RecordEvent(observed.namespace, observed.name, "RunStuck", text, "Warning", about)
    return Plan((mark, told), again)


def _placeholder_pending(
    observed: Observed,
    facts: StuckFacts,
    state: relocation.Relocations | None,
    grace: float,
    now: float,
    actions: list[Action],
) -> Plan:
    name = f"{observed.name}-0"
    obj = facts.placeholder_pods.get(f"{observed.namespace}/{name}")
    found = stuck.unschedulable_since(obj) if obj is not None else None
    if found is None:
        return Plan((*actions, *_clear(observed, facts, forget=False)))
    since, message = found
    if now < since + grace:
        return Plan(
            (*actions, *_clear(observed, facts, forget=False)),
            Requeue(since + grace - now + RECHECK_MARGIN, "the placeholder's stuck grace ends"),
        )
    again = Requeue(max(MIN_STUCK_RECHECK_SECONDS, grace), "the placeholder cannot be placed")
    fingerprint = ("placeholder", tuple(r.cause for r in parse(message).reasons))
    if facts.explained == fingerprint:
        return Plan((*actions, MarkStuck(observed.namespace, observed.name)), again)
    left = (
        f" It may not go back to {', '.join(state.left)}, which it left in this run"
        " (the run's pods or data could not follow it there)."
        if state is not None
        else ""
    )
    text = (
        f"the placeholder of {_run(observed)} (pod {name}) cannot be scheduled, so the "
        f"run's pods wait for it: the scheduler says: {message}.{left} You can: free "
        "capacity on a node the run may use, or add one."
    )
    reason = "PlaceholderUnschedulable"
    return Plan(
        (
            *actions,
            MarkStuck(observed.namespace, observed.name, fingerprint, text, name),
            RecordEvent(observed.namespace, observed.name, reason, text, "Warning"),
            *_run_events(observed, reason, text, "Warning"),
        ),
        again,
    )


def _strays(
    observed: Observed,
    placed: Sequence[Any],
    facts: StuckFacts,
    state: relocation.Relocations,
) -> list[Action]:
    """A placeholder pod recreated in a domain it left (the StatefulSet controller used
    the template from before the move): delete it again (the executor, once per version)."""
    actions: list[Action] = []
    for placeholder in placed:
        node_obj = facts.nodes.get(placeholder.node_name)
        labels = ((node_obj or {}).get("metadata") or {}).get("labels") or {}
        if labels.get(state.topology_key, placeholder.node_name) in state.left:
            actions.append(
                DeleteStrayPod(
                    observed.namespace, placeholder.name, observed.name, placeholder.node_name
                )
            )
    return actions


def _run_events(
    observed: Observed,
    reason: str,
    message: str,
    kind: str = "Normal",
    *,
    pod: stuck.PendingPod | None = None,
) -> list[RecordEvent]:
    """The same Event on the stuck pod (if any) and on the run that owns the group, where
    its users look (``kubectl describe pipelinerun``)."""
    about: list[OwnerRef] = []
    if pod is not None:
        about.append(OwnerRef("v1", "Pod", pod.name, pod.uid))
    owner = observed.owner.root if observed.owner is not None else None
    if owner is not None:
        about.append(owner)
    return [
        RecordEvent(observed.namespace, observed.name, reason, message, kind, involved)
        for involved in about
    ]


def _run(observed: Observed) -> str:
    owner = observed.owner.root if observed.owner is not None else None
    if owner is not None:
        return f"{owner.kind} {owner.name}"
    first = observed.pods[0] if observed.pods else None
    return f"run {first.marks.run}" if first is not None else f"placeholder {observed.name}"
