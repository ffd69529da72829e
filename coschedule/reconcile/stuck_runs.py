"""Stuck runs, carried out: gather what the pure decisions in ``stuck`` need, then move the
placeholder or explain, once per change.

Runs after ``plan``'s actions for a group, on the leader, only when the group has a live
pod and a bound placeholder. The caches give the pods, the placeholder and the nodes; what
they do not hold is read only when a pod is stuck (rare): the claims and volumes of the
run (GET) and the pods bound to the nodes considered (LIST by ``spec.nodeName``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from coschedule import marks
from coschedule.config.settings import Settings
from coschedule.k8s import fit
from coschedule.k8s.constants import HOSTNAME, TERMINAL_PHASES
from coschedule.k8s.nodes import Node, parse_node
from coschedule.k8s.quantity import resources
from coschedule.k8s.scheduler_messages import Cause, parse
from coschedule.k8s.volumes import volume_topology
from coschedule.kube.client import KubeClient, object_path
from coschedule.kube.events import record_event
from coschedule.marks import Mode
from coschedule.reconcile import relocation, stuck
from coschedule.reconcile.executor import NotLeader
from coschedule.reconcile.observed import Obj, Observed, ObservedSet, OwnerRef
from coschedule.reconcile.placeholder import (
    ANNOTATION_TEMPLATE_HASH,
    GroupSpec,
    group_spec,
    pod_template,
    template_hash,
)
from coschedule.reconcile.workqueue import WorkQueue

log = logging.getLogger("coschedule.reconcile")

RECHECK_MARGIN = 0.05  # look just after a grace period ends, not just before
# A stuck group is looked at again this often: what blocked a move (a running task, no
# room elsewhere) may change without an event on the group's own pods.
MIN_STUCK_RECHECK_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class _Case:
    """A group with a stuck pod, as ``reconcile`` found it: what deciding, choosing a
    target and moving read."""

    observed: Observed
    sts: ObservedSet
    group: GroupSpec
    raw_pods: Mapping[str, Obj]
    sts_obj: Obj | None
    nodes: Mapping[str, Obj]
    placeholder_pods: Iterable[Obj]
    settings: Settings
    now: float
    pod: stuck.PendingPod  # the stuck pod
    node: Node  # the group's node
    state: relocation.Relocations | None  # the domains the run has left

    @property
    def topology_key(self) -> str:
        return self.group.topology_key


class StuckRuns:
    def __init__(
        self,
        client: KubeClient,
        registry: CollectorRegistry,
        queue: WorkQueue,
        *,
        leading: Callable[[], bool],
    ) -> None:
        self.client = client
        self.queue = queue
        self.leading = leading
        self.relocations = Counter(
            "coschedule_relocations_total",
            "Placeholders moved because their node could not take the run's next pod, by "
            "the cause on that node.",
            ["reason"],
            registry=registry,
        )
        self.stuck_groups = Gauge(
            "coschedule_stuck_groups",
            "Groups with a pod stuck because of the group's node that coschedule cannot "
            "move (explained in Events on the pod and the run).",
            registry=registry,
        )
        for cause in (Cause.RESOURCES, Cause.PODS, Cause.TAINT, Cause.VOLUME):
            self.relocations.labels(cause.value)
        self._stuck: set[str] = set()
        self._explained: dict[str, tuple[Any, ...]] = {}
        self._deleted: dict[str, str] = {}  # placeholder pod key -> resourceVersion deleted

    def forget(self, key: str) -> None:
        self._unstick(key)
        self._explained.pop(key, None)

    def _unstick(self, key: str) -> None:
        self._stuck.discard(key)
        self.stuck_groups.set(len(self._stuck))

    def _check_leader(self) -> None:
        if not self.leading():
            raise NotLeader

    # ---- the loop step ----------------------------------------------------------------

    async def reconcile(
        self,
        observed: Observed,
        raw_pods: Mapping[str, Obj],
        sts_obj: Obj | None,
        nodes: Mapping[str, Obj],
        placeholder_pods: Iterable[Obj],
        settings: Settings,
        now: float,
    ) -> None:
        key = observed.key
        sts = observed.statefulset
        live = [p for p in observed.pods if p.live]
        group = group_spec(observed.namespace, observed.name, observed.pods)
        if sts is None or sts.deleting or not live or group is None:
            self.forget(key)
            return
        state = relocation.parse(sts.annotations)
        placed = [p for p in observed.placeholder_pods if not p.deleting and p.node_name]
        if state is not None:
            versions = {
                str((obj.get("metadata") or {}).get("name")): str(
                    (obj.get("metadata") or {}).get("resourceVersion") or ""
                )
                for obj in placeholder_pods
                if (obj.get("metadata") or {}).get("namespace") == observed.namespace
            }
            await self._strays(key, observed, placed, nodes, state, versions)
        here = [p for p in placed if p.node_name in nodes]
        grace = float(settings.stuck_grace_seconds)
        if not here:
            # The placeholder is being (re)scheduled: its pods wait for it. Say so if the
            # scheduler cannot place it either (never a silent hang).
            await self._placeholder_pending(observed, placeholder_pods, state, grace, now)
            return
        node = parse_node(nodes[here[0].node_name])
        if state is not None and now < state.at + grace:
            # Just moved: give the scheduler a grace period to place the run's pods there.
            self.queue.add_after(key, state.at + grace - now + RECHECK_MARGIN)
            return
        claims_of = {p.name: p.claims for p in observed.pods}
        pending = [
            found
            for name, obj in raw_pods.items()
            if (found := stuck.pending_pod(obj, claims_of.get(name, ()))) is not None
        ]
        pod, wait = stuck.find_stuck(pending, now, grace)
        if wait is not None:
            self.queue.add_after(key, wait + RECHECK_MARGIN)
        if pod is None:
            if key in self._stuck:
                log.info("run no longer stuck", extra={"placeholder": key, "run": group.run})
            self.forget(key)
            return
        await self._decide(
            _Case(
                observed,
                sts,
                group,
                raw_pods,
                sts_obj,
                nodes,
                placeholder_pods,
                settings,
                now,
                pod,
                node,
                state,
            )
        )

    async def _decide(self, case: _Case) -> None:
        observed, sts, group, pod, node = case.observed, case.sts, case.group, case.pod, case.node
        claims = await self.claim_states(
            observed.namespace,
            [*group.claims, *(marks.placeholder_claim(t, sts.name) for t in sts.templates)],
        )
        findings = stuck.diagnose(pod, node, await self._usage(node.name), claims)
        diagnosed = bool(findings)
        if not findings:
            findings = stuck.from_message(pod, node.name)
        running = [
            stuck.Running(name, str((obj.get("spec") or {}).get("nodeName")))
            for name, obj in sorted(case.raw_pods.items())
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
        target: Node | None = None
        if not blockers:
            target = await self._target(case, claims, blockers, options)
        if target is not None:
            await self._relocate(case, target, findings)
            return
        await self._explain(observed, pod, node, findings, blockers, options)
        self.queue.add_after(
            observed.key, max(MIN_STUCK_RECHECK_SECONDS, float(case.settings.stuck_grace_seconds))
        )

    async def _target(
        self,
        case: _Case,
        claims: Sequence[stuck.ClaimState],
        blockers: list[str],
        options: list[str],
    ) -> Node | None:
        pod = case.pod
        others = {
            str((obj.get("spec") or {}).get("nodeName"))
            for obj in case.placeholder_pods
            if (obj.get("spec") or {}).get("nodeName")
            and (obj.get("metadata") or {}).get("name") != f"{case.observed.name}-0"
        }
        left = set(case.state.left) if case.state is not None else set()
        candidates = stuck.static_candidates(
            pod,
            [parse_node(obj) for obj in case.nodes.values()],
            topology_key=case.topology_key,
            current=case.node,
            left=left,
            claims=claims,
            excluded=others if case.group.mode is Mode.ISOLATE_PIPELINERUN else (),
            placeholder_tolerations=case.group.tolerations,
        )
        if candidates.volume_blocked:
            blockers.append(
                "the run's volumes can only be used where it is: "
                + ", ".join(candidates.volume_blocked)
            )
            options.extend(stuck.volume_options(candidates.volume_blocked))
            return None
        usage = {n.name: await self._usage(n.name) for n in candidates.nodes}
        requests = resources(case.settings.placeholder_resources.get("requests"))
        requests[fit.PODS] = Decimal(1)
        target, rejected = stuck.choose_target(pod, candidates.nodes, usage, requests, others)
        if target is None:
            why = {**candidates.rejected, **rejected}
            listed = "; ".join(f"{name}: {reason}" for name, reason in sorted(why.items()))
            blockers.append("no other node can take the pod" + (f" ({listed})" if listed else ""))
            options.append("add capacity: a node where the pod fits next to the placeholder")
        return target

    # ---- acting -----------------------------------------------------------------------

    async def _relocate(self, case: _Case, target: Node, findings: Sequence[stuck.Finding]) -> None:
        observed, sts, group, pod, node = case.observed, case.sts, case.group, case.pod, case.node
        state, topology_key, now = case.state, case.topology_key, case.now
        domain = node.domain(topology_key) or node.name
        hostname = target.labels.get(HOSTNAME, target.name)
        moved = (
            state.moved(topology_key, domain, hostname, now)
            if state is not None
            else relocation.first(topology_key, domain, hostname, now)
        )
        annotations = {relocation.ANNOTATION_RELOCATIONS: moved.encode()}
        template = relocation.steer(
            pod_template(group, case.settings, observed.claim_templates), annotations
        )
        annotations[ANNOTATION_TEMPLATE_HASH] = template_hash(template)
        patch = {
            "metadata": {"annotations": annotations, "resourceVersion": sts.resource_version},
            "spec": {"template": template},
        }
        cause = findings[0].cause
        because = "; ".join(f.text for f in findings)
        self._check_leader()
        await self.client.patch(
            object_path("apps/v1", "statefulsets", observed.namespace, observed.name), patch
        )
        for placeholder in observed.placeholder_pods:
            if placeholder.node_name == node.name and not placeholder.deleting:
                self._check_leader()
                await self.client.delete(
                    object_path("v1", "pods", observed.namespace, placeholder.name)
                )
        self.relocations.labels(cause.value).inc()
        self.forget(observed.key)
        message = (
            f"moved the placeholder of {_run(observed)} from node {node.name} towards node "
            f"{target.name}: pod {pod.name} could not be scheduled on {node.name} ({because}) "
            "and no pod of the run was running there"
        )
        log.info(
            "relocated placeholder",
            extra={
                "placeholder": observed.key,
                "run": group.run,
                "from": node.name,
                "to": target.name,
                "reason": cause.value,
                "pod": pod.key,
                "why": because,
            },
        )
        uid = str(((case.sts_obj or {}).get("metadata") or {}).get("uid") or sts.uid)
        await self._event(
            observed.namespace,
            {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": sts.name, "uid": uid},
            "PlaceholderRelocated",
            message,
        )
        await self._run_events(observed, "RunRelocated", message, pod=pod)

    async def _explain(
        self,
        observed: Observed,
        pod: stuck.PendingPod,
        node: Node,
        findings: Sequence[stuck.Finding],
        blockers: Sequence[str],
        options: Sequence[str],
    ) -> None:
        key = observed.key
        self._stuck.add(key)
        self.stuck_groups.set(len(self._stuck))
        fingerprint = (pod.name, node.name, tuple(f.cause for f in findings), tuple(blockers))
        if self._explained.get(key) == fingerprint:
            return
        self._explained[key] = fingerprint
        text = stuck.explanation(pod, _run(observed), node.name, findings, blockers, options)
        log.warning(
            "run stuck",
            extra={
                "placeholder": key,
                "run": _run(observed),
                "pod": pod.key,
                "node": node.name,
                "reason": findings[0].cause.value if findings else "",
                "explain": text,
            },
        )
        await self._run_events(observed, "RunStuck", text, "Warning", pod=pod)

    async def _placeholder_pending(
        self,
        observed: Observed,
        placeholder_pods: Iterable[Obj],
        state: relocation.Relocations | None,
        grace: float,
        now: float,
    ) -> None:
        key = observed.key
        name = f"{observed.name}-0"
        found = None
        for obj in placeholder_pods:
            meta = obj.get("metadata") or {}
            if meta.get("namespace") == observed.namespace and meta.get("name") == name:
                found = stuck.unschedulable_since(obj)
        if found is None:
            self._unstick(key)
            return
        since, message = found
        if now < since + grace:
            self._unstick(key)
            self.queue.add_after(key, since + grace - now + RECHECK_MARGIN)
            return
        self._stuck.add(key)
        self.stuck_groups.set(len(self._stuck))
        self.queue.add_after(key, max(MIN_STUCK_RECHECK_SECONDS, grace))
        fingerprint = ("placeholder", tuple(r.cause for r in parse(message).reasons))
        if self._explained.get(key) == fingerprint:
            return
        self._explained[key] = fingerprint
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
        log.warning(
            "run stuck",
            extra={"placeholder": key, "run": _run(observed), "pod": name, "explain": text},
        )
        sts = observed.statefulset
        if sts is not None:
            await self._event(
                observed.namespace,
                {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": sts.name, "uid": sts.uid},
                "PlaceholderUnschedulable",
                text,
                "Warning",
            )
        await self._run_events(observed, "PlaceholderUnschedulable", text, "Warning")

    async def _strays(
        self,
        key: str,
        observed: Observed,
        placed: Sequence[Any],
        nodes: Mapping[str, Obj],
        state: relocation.Relocations,
        versions: Mapping[str, str],
    ) -> None:
        """A placeholder pod recreated in a domain it left (the StatefulSet controller used
        the template from before the move): delete it again, once per pod version."""
        for placeholder in placed:
            node_obj = nodes.get(placeholder.node_name)
            labels = ((node_obj or {}).get("metadata") or {}).get("labels") or {}
            domain = labels.get(state.topology_key, placeholder.node_name)
            if domain not in state.left:
                continue
            pod_key = f"{observed.namespace}/{placeholder.name}"
            version = versions.get(placeholder.name, "")
            if self._deleted.get(pod_key) == version:
                continue
            self._check_leader()
            await self.client.delete(
                object_path("v1", "pods", observed.namespace, placeholder.name)
            )
            self._deleted[pod_key] = version
            log.info(
                "deleted a placeholder pod back on a node it left",
                extra={"placeholder": key, "node": placeholder.node_name},
            )

    # ---- reading what the caches do not hold -------------------------------------------

    async def _usage(self, node: str) -> dict[str, Decimal]:
        """What the non-terminated pods bound to ``node`` request."""
        listed = await self.client.list("/api/v1/pods", {"fieldSelector": f"spec.nodeName={node}"})
        return fit.used(
            fit.pod_requests(item.get("spec") or {})
            for item in listed.get("items") or ()
            if (item.get("status") or {}).get("phase") not in TERMINAL_PHASES
            and (item.get("spec") or {}).get("nodeName") == node
        )

    async def claim_states(self, namespace: str, names: Sequence[str]) -> list[stuck.ClaimState]:
        """Each claim, bound or not, and where its volume can be used (two GETs each)."""
        result = []
        for name in dict.fromkeys(names):
            claim = await self.client.get(
                object_path("v1", "persistentvolumeclaims", namespace, name)
            )
            volume_name = str(((claim or {}).get("spec") or {}).get("volumeName") or "")
            if not volume_name:
                result.append(stuck.ClaimState(name, False, None))
                continue
            pv = await self.client.get(object_path("v1", "persistentvolumes", None, volume_name))
            result.append(
                stuck.ClaimState(name, True, volume_topology(pv) if pv is not None else None)
            )
        return result

    async def _event(
        self,
        namespace: str,
        involved: Mapping[str, str],
        reason: str,
        message: str,
        kind: str = "Normal",
    ) -> None:
        await record_event(self.client, namespace, involved, reason, message, kind)

    async def _run_events(
        self,
        observed: Observed,
        reason: str,
        message: str,
        kind: str = "Normal",
        *,
        pod: stuck.PendingPod | None = None,
    ) -> None:
        """The same Event on the stuck pod (if any) and on the run that owns the group, where
        its users look (``kubectl describe pipelinerun``)."""
        if pod is not None:
            involved = {"apiVersion": "v1", "kind": "Pod", "name": pod.name, "uid": pod.uid}
            await self._event(observed.namespace, involved, reason, message, kind)
        owner = observed.owner.root if observed.owner is not None else None
        if owner is not None:
            await self._event(observed.namespace, _involved(owner), reason, message, kind)


def _involved(owner: OwnerRef) -> dict[str, str]:
    return {
        "apiVersion": owner.api_version,
        "kind": owner.kind,
        "name": owner.name,
        "uid": owner.uid,
    }


def _run(observed: Observed) -> str:
    owner = observed.owner.root if observed.owner is not None else None
    if owner is not None:
        return f"{owner.kind} {owner.name}"
    first = observed.pods[0] if observed.pods else None
    return f"run {first.run}" if first is not None else f"placeholder {observed.name}"
