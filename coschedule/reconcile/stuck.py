"""Stuck runs: is a group stuck, is moving it safe, and where to? Pure.

- **Stuck**: a live pod of the group has been ``PodScheduled=False`` (reason
  ``Unschedulable``) for ``stuck-grace-seconds`` and the scheduler's message counts a
  reason other than the pin to the placeholder: the group's node (which passes that pin)
  refused it. ``diagnose`` says why, from the node and what is bound to it.
- **Safe to move**: no pod of the group runs (bound, not finished), and every claim is
  unbound or on a volume that allows the target.
- **Where to**: a node outside the domains the placeholder left, whose topology domain is
  not the current one, that the pod (with the placeholder beside it) fits on: allocatable
  minus what is bound there, the ``pods`` cap, taints, nodeSelector and required node
  affinity, the claims' volume topology.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from coschedule.k8s import fit
from coschedule.k8s.constants import TERMINAL_PHASES
from coschedule.k8s.node_constraints import strip_pin
from coschedule.k8s.nodeaffinity import pod_allows, required_terms
from coschedule.k8s.nodes import Node
from coschedule.k8s.quantity import resources, show
from coschedule.k8s.scheduler_messages import Cause, SchedulerMessage, parse
from coschedule.k8s.taints import untolerated
from coschedule.k8s.timefmt import parse_time
from coschedule.k8s.volumes import VolumeTopology
from coschedule.placement import node_pin
from coschedule.reconcile.model import Obj

FACTS = "scheduling"  # where the pod transform keeps a pending pod's scheduling facts


# ---- cache shapes ---------------------------------------------------------------------


def scheduling_facts(obj: Obj) -> Obj | None:
    """What stuck detection reads of a pod that is not bound yet (None once bound): the
    PodScheduled condition, requests, required node affinity. Bound pods keep nothing."""
    spec = obj.get("spec") or {}
    if spec.get("nodeName"):
        return None
    facts: Obj = {}
    for condition in (obj.get("status") or {}).get("conditions") or ():
        if isinstance(condition, dict) and condition.get("type") == "PodScheduled":
            facts["condition"] = {
                k: condition.get(k) for k in ("status", "reason", "message", "lastTransitionTime")
            }
    requests = fit.pod_requests(spec)
    facts["requests"] = {name: str(amount) for name, amount in requests.items()}
    terms = required_terms(spec.get("affinity"))
    if terms is not None:
        facts["nodeAffinity"] = list(terms)
    return facts


def with_scheduling(transform: Callable[[Obj], Obj]) -> Callable[[Obj], Obj]:
    """Wrap a marked-pod informer transform so that pending pods keep their facts."""

    def wrapped(obj: Obj) -> Obj:
        slim = transform(obj)
        facts = scheduling_facts(obj)
        if facts is not None:
            slim[FACTS] = facts
        return slim

    return wrapped


def with_condition(transform: Callable[[Obj], Obj]) -> Callable[[Obj], Obj]:
    """Wrap the placeholder-pod informer transform so that an unbound placeholder pod keeps
    its PodScheduled condition (a placeholder that cannot be placed stalls its run)."""

    def wrapped(obj: Obj) -> Obj:
        slim = transform(obj)
        facts = scheduling_facts(obj)
        if facts is not None and "condition" in facts:
            slim[FACTS] = {"condition": facts["condition"]}
        return slim

    return wrapped


def unschedulable_since(obj: Obj) -> tuple[float, str] | None:
    """(since, message) of a slim pod reported Unschedulable; None otherwise."""
    facts = obj.get(FACTS)
    condition = facts.get("condition") if isinstance(facts, dict) else None
    if not isinstance(condition, dict):
        return None
    if condition.get("status") != "False" or condition.get("reason") != "Unschedulable":
        return None
    since = parse_time(condition.get("lastTransitionTime"))
    return None if since is None else (since, str(condition.get("message") or ""))


def with_allocatable(transform: Callable[[Obj], Obj]) -> Callable[[Obj], Obj]:
    """Wrap the node informer transform so that nodes keep their allocatable."""

    def wrapped(obj: Obj) -> Obj:
        slim = transform(obj)
        allocatable = (obj.get("status") or {}).get("allocatable")
        if isinstance(allocatable, dict):
            slim.setdefault("status", {})["allocatable"] = dict(allocatable)
        return slim

    return wrapped


# ---- plain data -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PendingPod:
    namespace: str
    name: str
    uid: str
    claims: tuple[str, ...]
    since: float | None  # PodScheduled=False/Unschedulable since (None: not that)
    message: SchedulerMessage
    raw_message: str
    requests: Mapping[str, Decimal]
    node_selector: Mapping[str, str]
    tolerations: tuple[Mapping[str, Any], ...]
    terms: tuple[Mapping[str, Any], ...] | None  # required node affinity, without our pin
    pinned_node: str | None = None  # the node our pin names (placement by node name)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def pending_pod(obj: Obj, claims: tuple[str, ...] = ()) -> PendingPod | None:
    """A live marked pod that is not bound, from its slim cache shape; else None."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    facts = obj.get(FACTS)
    if spec.get("nodeName") or not isinstance(facts, dict) or meta.get("deletionTimestamp"):
        return None
    if (obj.get("status") or {}).get("phase") in TERMINAL_PHASES:
        return None
    condition = facts.get("condition") or {}
    unschedulable = condition.get("status") == "False" and condition.get("reason") == (
        "Unschedulable"
    )
    message = str(condition.get("message") or "") if unschedulable else ""
    terms = facts.get("nodeAffinity")
    pinned = node_pin.pinned_node(meta)
    parsed = parse(message)
    if pinned is not None:
        # Our pin stands for "the placeholder's node", as the pod-affinity term does: it is
        # not the pod's own rule (a move takes it along), and the nodes it rules out are
        # the pin's share of the scheduler's count, not reasons the run is stuck.
        parsed = parsed.pinned()
        if isinstance(terms, list):
            terms = unpinned(terms, pinned)
    return PendingPod(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        claims=claims,
        since=parse_time(condition.get("lastTransitionTime")) if unschedulable else None,
        message=parsed,
        raw_message=message,
        requests=resources(facts.get("requests")),
        node_selector={str(k): str(v) for k, v in (spec.get("nodeSelector") or {}).items()},
        tolerations=tuple(t for t in spec.get("tolerations") or () if isinstance(t, dict)),
        terms=tuple(terms) if isinstance(terms, list) else None,
        pinned_node=pinned,
    )


def unpinned(terms: Sequence[Any], node: str) -> list[Any] | None:
    """Required node-selector terms without our pin to ``node`` (``node_pin.pin_ops`` ANDs it
    into every term); with only the pin's own term, None (no requirement: the pin was all of
    it)."""
    kept = strip_pin([t for t in terms if isinstance(t, Mapping)], node)
    return list(kept) if kept else None


@dataclass(frozen=True, slots=True)
class ClaimState:
    claim: str
    bound: bool
    volume: VolumeTopology | None  # None: unbound, or its PV is not known

    def where(self) -> str:
        if self.volume is None:
            return f"claim {self.claim}"
        return f"claim {self.claim} (volume {self.volume.name}, usable on {self.volume.describe()})"


@dataclass(frozen=True, slots=True)
class Finding:
    """Why a node refuses the pod: the cause, and a sentence naming the numbers."""

    cause: Cause
    text: str
    option: str  # what the user can do about it


# ---- stuck? ---------------------------------------------------------------------------


def find_stuck(
    pods: Sequence[PendingPod], now: float, grace: float
) -> tuple[PendingPod | None, float | None]:
    """(the longest-stuck pod, or None; seconds until a pending pod's grace ends, if any).

    A pod whose message counts only the pin to the placeholder waits for its placeholder
    (not yet bound, or moving): that is not stuck."""
    stuck: PendingPod | None = None
    wait: float | None = None
    for pod in pods:
        if pod.since is None or not pod.message.blocking:
            continue
        left = pod.since + grace - now
        if left > 0:
            wait = left if wait is None else min(wait, left)
        elif stuck is None or pod.since < (stuck.since or 0):
            stuck = pod
    return stuck, wait


def diagnose(
    pod: PendingPod,
    node: Node,
    in_use: Mapping[str, Decimal],
    claims: Sequence[ClaimState] = (),
) -> list[Finding]:
    """Why ``node`` (the group's) refuses ``pod``, in the scheduler's filter order."""
    where = f"node {node.name}"
    found: list[Finding] = []
    if node.unschedulable:
        found.append(
            Finding(
                Cause.UNSCHEDULABLE,
                f"{where} is cordoned",
                f"uncordon {where} (the placeholder moves off it on its own)",
            )
        )
    for taint in untolerated(node, pod.tolerations):
        shown = f"{{{taint.key}: {taint.value}}}:{taint.effect}"
        found.append(
            Finding(
                Cause.TAINT,
                f"{where} has taint {shown}, which the pod does not tolerate",
                f"remove the taint from {where}, or give the run's pods a toleration for it",
            )
        )
    if not pod_allows(pod.node_selector, pod.terms, node.labels, node.name):
        found.append(
            Finding(
                Cause.NODE_AFFINITY,
                f"the pod's nodeSelector / node affinity excludes {where}",
                "give every pod of the run the same nodeSelector and node affinity (the "
                "placeholder goes where all the run's pods seen so far may go)",
            )
        )
    for name, wanted, free in fit.shortfalls(pod.requests, node.allocatable, in_use):
        cap = node.allocatable.get(name, Decimal(0))
        if name == fit.PODS:
            found.append(
                Finding(
                    Cause.PODS,
                    f"{where} has reached its pod cap ({show(name, cap)} pods)",
                    f"raise the pod cap of {where} (kubelet maxPods) or wait for pods there "
                    "to finish",
                )
            )
            continue
        found.append(
            Finding(
                Cause.RESOURCES,
                f"the pod requests {show(name, wanted)} {name} and {where} has "
                f"{show(name, free)} of {show(name, cap)} free",
                f"free {name} on {where}, or lower the pod's {name} request",
            )
        )
    for claim in claims:
        volume = claim.volume
        if claim.claim in pod.claims and volume and not volume.allows(node.labels, node.name):
            found.append(
                Finding(
                    Cause.VOLUME,
                    f"{claim.where()} cannot be used on {where}",
                    "bind the run's claims where the run runs",
                )
            )
    return found


def from_message(pod: PendingPod, node: str) -> list[Finding]:
    """When our arithmetic finds nothing, the scheduler's own reasons are the facts."""
    return [
        Finding(
            r.cause,
            f"the scheduler reports {r.count} node(s) with: {r.text}",
            f"see why node {node} refuses the pod: kubectl describe pod -n {pod.namespace} "
            f"{pod.name}",
        )
        for r in pod.message.blocking
    ]


# ---- safe? where to? ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Running:
    pod: str
    node: str


def unsafe(running: Sequence[Running]) -> list[str]:
    """Facts that forbid any move, whatever the target: pods of the group running."""
    return [
        f"pod {r.pod} of the run is running on node {r.node}: moving the placeholder would "
        "split the run"
        for r in running
    ]


@dataclass
class Candidates:
    nodes: list[Node] = field(default_factory=list)
    rejected: dict[str, str] = field(default_factory=dict)  # node -> why not
    volume_blocked: list[str] = field(default_factory=list)  # claims that pin the run


def static_candidates(
    pod: PendingPod,
    nodes: Sequence[Node],
    *,
    topology_key: str,
    current: Node,
    left: Collection[str],
    claims: Sequence[ClaimState],
    excluded: Collection[str] = (),
    placeholder_tolerations: Sequence[Mapping[str, Any]] = (),
    run_selector: Mapping[str, str] | None = None,
    run_terms: Sequence[Mapping[str, Any]] | None = None,
) -> Candidates:
    """Nodes the pod and the placeholder could go to, before looking at what runs there."""
    result = Candidates()
    here = current.domain(topology_key)
    blockers: set[str] = set()
    for node in sorted(nodes, key=lambda n: n.name):
        domain = node.domain(topology_key)
        why = ""
        if node.name == current.name or (domain is not None and domain == here):
            continue
        if domain is None:
            why = f"no {topology_key} label"
        elif domain in left:
            why = f"the placeholder already left {topology_key}={domain} in this run"
        elif node.name in excluded:
            why = "another run's placeholder is there (mode isolate-pipelinerun)"
        elif node.unschedulable:
            why = "cordoned"
        elif untolerated(node, pod.tolerations) or untolerated(node, placeholder_tolerations):
            why = "a taint the run does not tolerate"
        elif not pod_allows(pod.node_selector, pod.terms, node.labels, node.name):
            why = "the pod's nodeSelector / node affinity excludes it"
        elif not pod_allows(run_selector or {}, run_terms, node.labels, node.name):
            why = "the run's pods' nodeSelector / node affinity (the placeholder's) excludes it"
        else:
            pinned = [
                c
                for c in claims
                if c.volume is not None and not c.volume.allows(node.labels, node.name)
            ]
            if pinned:
                blockers.update(c.where() for c in pinned)
                why = "the run's volume(s) cannot be used there: " + ", ".join(
                    c.claim for c in pinned
                )
        if why:
            result.rejected[node.name] = why
        else:
            result.nodes.append(node)
    if not result.nodes:
        result.volume_blocked = sorted(blockers)
    return result


def choose_target(
    pod: PendingPod,
    candidates: Sequence[Node],
    usage: Mapping[str, Mapping[str, Decimal]],
    placeholder_requests: Mapping[str, Decimal],
    busy: Collection[str] = (),
) -> tuple[Node | None, dict[str, str]]:
    """The node where the pod and a new placeholder pod both fit; prefer nodes without
    another placeholder (they repel each other), then the most free CPU. Also why the
    others do not fit."""
    need = fit.used([pod.requests, placeholder_requests])
    fitting: list[tuple[bool, Decimal, str, Node]] = []
    rejected: dict[str, str] = {}
    for node in candidates:
        in_use = usage.get(node.name, {})
        short = fit.shortfalls(need, node.allocatable, in_use)
        if short:
            rejected[node.name] = "not enough " + ", ".join(
                f"{name} ({show(name, free)} free, {show(name, wanted)} needed)"
                for name, wanted, free in short
            )
            continue
        cpu_free = node.allocatable.get("cpu", Decimal(0)) - in_use.get("cpu", Decimal(0))
        fitting.append((node.name in busy, -cpu_free, node.name, node))
    if not fitting:
        return None, rejected
    return min(fitting, key=lambda t: t[:3])[3], rejected


# ---- what to say ----------------------------------------------------------------------


def explanation(
    pod: PendingPod,
    run: str,
    node: str,
    findings: Sequence[Finding],
    blockers: Sequence[str],
    options: Sequence[str],
) -> str:
    """The Warning Event (and log) text: the node, the cause, why not moved, what to do."""
    causes = "; ".join(f.text for f in findings) or "see the scheduler's message"
    todo = list(dict.fromkeys([*(f.option for f in findings), *options]))
    text = (
        f"pod {pod.name} of {run} cannot be scheduled on node {node}, where the run is kept "
        f"together: {causes}. coschedule did not move the run: {'; '.join(blockers)}."
    )
    if todo:
        text += " You can: " + "; or ".join(todo) + "."
    return text


def volume_options(blocked: Sequence[str]) -> list[str]:
    if not blocked:
        return []
    return [
        "free capacity where the run's data is (" + ", ".join(blocked) + "), or use mode "
        "pipelineruns with volumeClaimTemplates so that a run's volumes are provisioned "
        "where the run can go"
    ]
