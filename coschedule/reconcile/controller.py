"""The reconciler's wiring: informers -> keyed work queue -> ``plan`` -> API calls.

Every event maps to placeholder keys (``namespace/name``): a marked pod to its label, a
placeholder pod or StatefulSet to its instance, a node to the placeholder pods on it. A
worker takes a key, gathers what the caches hold for it, asks ``plan`` and carries out the
actions. Only the leader runs workers; followers keep caches and the queue warm.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from coschedule.config.settings import Settings
from coschedule.k8s.nodes import Node, kubelet_silent, parse_node
from coschedule.k8s.taints import eviction_reason
from coschedule.k8s.timefmt import parse_time
from coschedule.k8s.volumes import VolumeTopology
from coschedule.kube.client import ApiError, KubeClient, object_path
from coschedule.kube.discovery import RETRY_SECONDS, wait_served
from coschedule.kube.events import record_event
from coschedule.kube.informer import IndexFunc, Informer, Obj, caches_readiness, object_key
from coschedule.kube.namespace_cache import NamespaceCache
from coschedule.marks import (
    ANNOTATION_CLAIMS,
    ANNOTATION_MODE,
    ANNOTATION_RUN,
    COMPONENT_AFFINITY_ASSISTANT,
    GATE_PLACEHOLDER,
    LABEL_COMPONENT,
    LABEL_MANAGED_BY,
    LABEL_PLACEHOLDER,
    MANAGED_BY,
    BadMark,
    ClaimTemplate,
    placeholder_claim,
)
from coschedule.placement import node_pin
from coschedule.reconcile import event_keys, node_pins, run_seed, shapes, stuck, stuck_facts
from coschedule.reconcile import plan as planning
from coschedule.reconcile.assistant_conflict import plan_assistant_conflict
from coschedule.reconcile.event_keys import BY_NAMESPACE, BY_NODE, BY_PLACEHOLDER
from coschedule.reconcile.executor import Executor
from coschedule.reconcile.gated import gated_pods
from coschedule.reconcile.model import (
    MarkedPod,
    Observed,
    ObservedSet,
    OwnerRef,
    OwnerState,
    OwnerStatus,
    PlaceholderPod,
    Plan,
)
from coschedule.reconcile.node_leases import NodeLeases
from coschedule.reconcile.placeholder import group_spec
from coschedule.reconcile.reconciler_metrics import ReconcileMetrics
from coschedule.reconcile.resolver import OwnerLookupFailed, OwnerResolver
from coschedule.reconcile.stuck_facts import StuckMemory, read_and_plan
from coschedule.reconcile.stuck_runs import StuckFacts
from coschedule.reconcile.topology import TopologyLabels
from coschedule.reconcile.workqueue import WorkQueue
from coschedule.wire.watch_events import EVERY_FIELD, POD_CACHE, EventShape

log = logging.getLogger("coschedule.reconcile")

# A pod found behind our gate this long after its creation when a reconciler takes the lead
# waited for one (a placeholder is made and bound within seconds once one leads).
GATED_REPORT_SECONDS = 60.0
REASON_GATED_WITHOUT_RECONCILER = "GatedWithoutReconciler"


def gated_too_long(pods: list[Obj], now: float) -> list[tuple[Obj, float]]:
    """The unbound pods behind our gate created more than ``GATED_REPORT_SECONDS`` ago,
    with how long they have waited. Pure."""
    found: list[tuple[Obj, float]] = []
    for obj in pods:
        spec = obj.get("spec") or {}
        if spec.get("nodeName") or node_pin.gate_index(spec) is None:
            continue
        created = parse_time((obj.get("metadata") or {}).get("creationTimestamp"))
        if created is not None and now - created > GATED_REPORT_SECONDS:
            found.append((obj, now - created))
    return found


PLACEHOLDER_POD_SELECTOR = (
    f"{LABEL_MANAGED_BY}={MANAGED_BY},{LABEL_COMPONENT}={COMPONENT_AFFINITY_ASSISTANT}"
)
STATEFULSET_SELECTOR = f"{LABEL_MANAGED_BY}={MANAGED_BY}"
DEFAULT_WORKERS = 4
# How long a run's pod changes that nothing waits on gather before one pass looks at them.
COALESCE_SECONDS = 0.2
# How many more parses than cached pods the parse memo may hold before it starts again.
_PARSED_SLACK = 1024


class Controller:
    """The placeholder controller: one key per placeholder (``namespace/name``)."""

    name = "placeholder"
    probe = "caches"
    log = log

    def __init__(
        self,
        client: KubeClient,
        settings: Callable[[], Settings],
        metrics: ReconcileMetrics,
        *,
        leading: Callable[[], bool],
        workers: int = DEFAULT_WORKERS,
        clock: Callable[[], float] = time.time,
        retry_base: float | None = None,
        owner_recheck: float = planning.OWNER_RECHECK_SECONDS,
        discovery_retry: float = RETRY_SECONDS,
    ) -> None:
        self.client = client
        self.settings = settings
        self.metrics = metrics
        self.clock = clock
        self.workers = workers
        self.owner_recheck = owner_recheck
        self.queue = WorkQueue() if retry_base is None else WorkQueue(retry_base=retry_base)
        self.owners = OwnerResolver(client, clock)
        self.node_leases = NodeLeases(client, clock)
        self.pods = self._informer(
            "/api/v1/pods",
            "pods",
            LABEL_PLACEHOLDER,
            stuck.with_scheduling(shapes.slim_marked_pod),
            event_keys.MARKED_POD_INDEXERS,
            POD_CACHE,  # every event of every run pod: only what the transform reads is built
        )
        self.placeholder_pods = self._informer(
            "/api/v1/pods",
            "placeholder-pods",
            PLACEHOLDER_POD_SELECTOR,
            stuck.with_condition(shapes.slim_placeholder_pod),
            event_keys.PLACEHOLDER_POD_INDEXERS,
            POD_CACHE,
        )
        self.nodes = self._informer(
            "/api/v1/nodes", "nodes", None, stuck.with_allocatable(shapes.slim_node)
        )
        self.statefulsets = self._informer(
            "/apis/apps/v1/statefulsets",
            "statefulsets",
            STATEFULSET_SELECTOR,
            shapes.slim_statefulset,
        )
        self.informers = [self.pods, self.placeholder_pods, self.nodes, self.statefulsets]
        # PipelineRuns and namespaces, for a run's placeholder made at its creation
        # (``run_seed``). Not in the readiness: until they sync (or while Tekton is not
        # installed) placeholders are made from the first pod, as before.
        self.discovery_retry = discovery_retry
        self.runs = self._informer(
            f"/apis/{run_seed.API_VERSION}/{run_seed.PLURAL}",
            run_seed.PLURAL,
            None,
            run_seed.slim_run,
            {BY_PLACEHOLDER: self._run_placeholder, BY_NAMESPACE: self._run_namespace},
        )
        self.runs.add_handler(self._on_run)
        self.namespaces = NamespaceCache(
            Informer(
                client,
                "/api/v1/namespaces",
                name="namespaces",
                on_relist=lambda: self.metrics.relists.labels("namespaces").inc(),
            )
        )
        self.namespaces.informer.add_handler(self._on_namespace)
        for informer in self.informers:
            self.metrics.cache_stale.labels(informer.name).set_function(informer.silent_for)
        self.topology = TopologyLabels(
            settings().topology_key, self.metrics.nodes_missing_topology.set
        )
        self._idle_since: dict[str, float] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._bad_logged: dict[str, str] = {}
        # Pod key -> (the cached pod, its parse): a pass reads every pod of its run, and a
        # run's pods change one at a time, so each version is parsed once, not once a pass.
        # The cache replaces a pod's object on every event, so the object itself is the key.
        self._parsed: dict[str, tuple[Obj, MarkedPod | BadMark]] = {}
        self.stuck = StuckMemory(metrics.stuck_groups)
        self.executor = Executor(
            client,
            metrics,
            leading=leading,
            run_of=self._run_of,
            pod_version=self._pod_version,
            torn_down=self._forget,
            stuck=self.stuck,
            release_failed=self._release_failed,
        )
        self.pods.add_handler(self._on_pod)
        # Counted at scrape time from the cache: the oldest pod's wait grows between events.
        metrics.gated_pods.set_function(lambda: gated_pods(self.pods.view().values(), clock())[0])
        metrics.gated_pod_oldest.set_function(
            lambda: gated_pods(self.pods.view().values(), clock())[1]
        )
        self.placeholder_pods.add_handler(self._on_placeholder_pod)
        self.nodes.add_handler(self._on_node)
        self.statefulsets.add_handler(self._on_statefulset)

    def _informer(
        self,
        path: str,
        name: str,
        selector: str | None,
        transform: Callable[[Obj], Obj],
        indexers: Mapping[str, IndexFunc] | None = None,
        shape: EventShape = EVERY_FIELD,
    ) -> Informer:
        return Informer(
            self.client,
            path,
            name=name,
            label_selector=selector,
            transform=transform,
            on_relist=lambda: self.metrics.relists.labels(name).inc(),
            indexers=indexers,
            shape=shape,
        )

    # ---- lifecycle ----------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        return all(informer.synced.is_set() for informer in self.informers)

    def readiness(self) -> tuple[bool, str | None]:
        return caches_readiness(self.informers, self.client)

    def informer_runs(self) -> list[Coroutine[Any, Any, None]]:
        seeding = [self._run_runs(), self.namespaces.informer.run()]
        return [*(informer.run() for informer in self.informers), *seeding]

    async def _run_runs(self) -> None:
        """Watch PipelineRuns once Tekton serves them."""
        await wait_served(
            self.client, run_seed.API_VERSION, run_seed.PLURAL, retry=self.discovery_retry
        )
        await self.runs.run()

    async def wait_synced(self) -> None:
        await asyncio.gather(*(i.synced.wait() for i in self.informers))

    def take_over(self) -> None:
        for key in self.known_keys():
            self.queue.add(key)
        waited = gated_too_long(self.pods.values(), self.clock())
        if waited:  # found on taking the lead: no reconciler led while they waited
            self._tasks.add(task := asyncio.get_running_loop().create_task(self._tell(waited)))
            task.add_done_callback(self._tasks.discard)

    def leader_runs(self) -> list[Coroutine[Any, Any, None]]:
        return self.executor.releases.runs()

    def _release_failed(self, key: str, exc: Exception, failures: int) -> None:
        """A release sent apart from its pass failed: the run is looked at again, with the
        backoff of its releases' failures in a row (its pass succeeded: the queue's own
        count for the key was reset)."""
        status = exc.status if isinstance(exc, ApiError) else 0
        self.metrics.errors.labels(self.name, str(status)).inc()
        delay = self.queue.back_off(key, failures - 1)
        self.log.warning(
            "release failed; retrying",
            extra={**self.log_fields(key), "error": repr(exc), "retry_in": round(delay, 3)},
        )

    async def _tell(self, waited: list[tuple[Obj, float]]) -> None:
        """One Warning Event per pod that waited behind our gate with no reconciler leading."""
        for obj, seconds in waited:
            meta = obj.get("metadata") or {}
            involved = {"apiVersion": "v1", "kind": "Pod", "name": str(meta.get("name") or "")}
            if meta.get("uid"):
                involved["uid"] = str(meta["uid"])
            await record_event(
                self.client,
                str(meta.get("namespace") or ""),
                involved,
                REASON_GATED_WITHOUT_RECONCILER,
                f"waited {seconds:.0f}s behind the {GATE_PLACEHOLDER} scheduling gate while no "
                "coschedule reconciler led (only the reconciler lifts it); a reconciler leads "
                "again now. If coschedule was uninstalled, `coschedule release-held` lifts "
                "every such gate",
                "Warning",
            )

    def known_keys(self) -> set[str]:
        return (
            self.pods.index_values(BY_PLACEHOLDER)
            | self.placeholder_pods.index_values(BY_PLACEHOLDER)
            | set(self.statefulsets.keys())
            | self.runs.index_values(BY_PLACEHOLDER)
        )

    def settings_changed(self) -> None:
        """After a config reload: the topology key may have changed; recount nodes."""
        self.topology.rekey(self.settings().topology_key, self.nodes.values())

    def _forget(self, key: str) -> None:
        """Drop what we remembered about a group that is gone."""
        self.owners.forget(key)
        self._idle_since.pop(key, None)
        self.stuck.clear(key)
        self.executor.forget_group(key)

    def _pod_version(self, pod_key: str) -> str:
        obj = self.placeholder_pods.get(pod_key) or {}
        return str((obj.get("metadata") or {}).get("resourceVersion") or "")

    # ---- event handlers: map every change to placeholder keys ----------------------------

    def _enqueue(self, keys: list[str]) -> None:
        for key in keys:
            self.queue.add(key)

    def _on_pod(self, event: str, obj: Obj, old: Obj | None) -> None:
        if event == "DELETED":
            self._bad_logged.pop(object_key(obj), None)
            self._parsed.pop(object_key(obj), None)
            self.executor.forget_pod(object_key(obj))
        elif (
            old is not None
            and event_keys.same_but_version(old, obj)
            and node_pin.gate_index(obj.get("spec") or {}) is None
        ):
            # Nothing a pass reads changed (the cache, which keeps only that, is updated):
            # most events of a running pod, its containers starting, its probes. A gated
            # pod's every event still starts one (a release refused as stale waits on it).
            return
        gated = event != "DELETED" and node_pin.gate_index(obj.get("spec") or {}) is not None
        for key in event_keys.marked_pod_keys(event, obj, old):
            if self.statefulsets.get(key) is None:
                # A run whose placeholder is still to make goes first (its pods wait on it).
                self.queue.add(key, urgent=True)
            elif gated:  # a pod behind our gate waits on a pass: its release
                self.queue.add(key)
            else:
                # Released, bound, started, ended, deleted: nothing waits on the pass, and a
                # run's pods do these one after another. One pass looks at them together.
                self.queue.add_soon(key, COALESCE_SECONDS)

    def _on_placeholder_pod(self, event: str, obj: Obj, old: Obj | None) -> None:
        if event == "DELETED":
            self.executor.forget_pod(object_key(obj))
        elif old is not None and event_keys.same_but_version(old, obj):
            # Nothing a pass reads changed (the cache keeps only that, and is updated): a
            # bound placeholder pod's kubelet status writes, its containers, its probes.
            return
        # Just bound: its run's gated pods are released first.
        bound = bool((obj.get("spec") or {}).get("nodeName")) and not (
            (old or {}).get("spec") or {}
        ).get("nodeName")
        for key in event_keys.placeholder_pod_keys(event, obj, old):
            self.queue.add(key, urgent=bound)

    def _on_node(self, event: str, obj: Obj, old: Obj | None) -> None:
        self.topology.node(event, obj)
        on_node = self.placeholder_pods.by_index(BY_NODE, object_key(obj))
        self._enqueue(event_keys.node_keys(event, obj, old, on_node))

    def _run_placeholder(self, obj: Obj) -> list[str]:
        """The index of runs that could hold a seed: their placeholder's key."""
        if not run_seed.candidate(obj):
            return []
        key = run_seed.placeholder_key(obj, self.settings())
        return [key] if key is not None else []

    def _run_namespace(self, obj: Obj) -> list[str]:
        """The index of runs that could hold a seed by namespace: looked at again when their
        namespace's labels change."""
        if not run_seed.candidate(obj):
            return []
        return [str((obj.get("metadata") or {}).get("namespace") or "")]

    def _on_namespace(self, event: str, obj: Obj, old: Obj | None) -> None:
        """A namespace enabled, or its mode changed (or seen after its runs): its runs are
        seeded, or not, by its labels, so each is looked at again."""
        if not run_seed.namespace_changed(event, obj, old):
            return
        namespace = str((obj.get("metadata") or {}).get("name") or "")
        runs = self.runs.by_index(BY_NAMESPACE, namespace)
        keys = {run_seed.placeholder_key(run, self.settings()) for run in runs}
        self._enqueue(sorted(k for k in keys if k is not None))

    def _on_run(self, event: str, obj: Obj, old: Obj | None) -> None:
        if event == "MODIFIED" and old is not None and run_seed.same_for_seed(old, obj):
            return  # a change of nothing a seed reads (most runs' status updates)
        keys = {run_seed.placeholder_key(o, self.settings()) for o in (obj, old) if o is not None}
        found = sorted(k for k in keys if k is not None)
        self._run_ended(found, None if event == "DELETED" else obj, obj)
        self._enqueue(found)

    def _run_ended(self, keys: list[str], run: Obj | None, last: Obj) -> None:
        """A run done or gone, as the runs' cache says, is its placeholder's owner state at
        once: no placeholder is made again for the last pods of a run deleted while they
        ran (the garbage collector takes the StatefulSet first), and a done run's goes when
        its pods end without asking the API server."""
        name = (last.get("metadata") or {}).get("name")
        for key in keys:
            state = self.owners.states.get(key)
            if (
                state is None
                or state.root is None
                or state.status is OwnerStatus.DONE
                or state.root.kind != run_seed.KIND
                or state.root.name != name
            ):
                continue
            why = run_seed.ended(state.root, run)
            if why is not None:
                self.owners.done(key, why)

    def _seed(
        self, key: str, pods: list[MarkedPod], now: float
    ) -> tuple[run_seed.Seed | None, float | None]:
        """(the run's seed or None, when the run began while it is cached and not done)."""
        runs = self.runs.by_index(BY_PLACEHOLDER, key)
        if len(runs) != 1:  # none, or two runs one placeholder (a shared group label)
            return None, None
        run = runs[0]
        begun = run_seed.run_begun(run, now)
        if pods:
            return None, begun
        namespace = str((run.get("metadata") or {}).get("namespace") or "")
        info = self.namespaces.get(namespace)
        labels = info.labels if info is not None else None
        return run_seed.seed(run, labels, self.settings(), now), begun

    def _on_statefulset(self, event: str, obj: Obj, old: Obj | None) -> None:
        # The informer's label selector keeps only ours in the store.
        self.metrics.placeholders.set(len(self.statefulsets))
        if event != "DELETED" and old is not None and event_keys.same_but_version(old, obj):
            # Nothing a pass reads changed (the cache keeps no status): the StatefulSet
            # controller's status writes, several per placeholder made or moved.
            return
        self.queue.add(object_key(obj))

    # ---- workers --------------------------------------------------------------------------

    def log_fields(self, key: str) -> dict[str, str]:
        return {"placeholder": key, "run": self._run_of(key)}

    def _run_of(self, key: str) -> str:
        """The run (or, in workspaces mode, the claim) a placeholder serves, for log lines."""
        for obj in self.pods.by_index(BY_PLACEHOLDER, key):
            meta = obj.get("metadata") or {}
            annotations = meta.get("annotations") or {}
            if annotations.get(ANNOTATION_MODE) == "workspaces":
                return f"claim/{annotations.get(ANNOTATION_CLAIMS, '')}"
            if annotations.get(ANNOTATION_RUN):
                return str(annotations[ANNOTATION_RUN])
        meta = (self.statefulsets.get(key) or {}).get("metadata") or {}
        run = (meta.get("annotations") or {}).get(ANNOTATION_RUN)
        if not run:  # made from the run itself: no pod and no StatefulSet yet
            runs = self.runs.by_index(BY_PLACEHOLDER, key)
            run = (runs[0].get("metadata") or {}).get("name") if len(runs) == 1 else ""
        return str(run or "")

    def observe_pods(self, key: str) -> list[MarkedPod]:
        pods: list[MarkedPod] = []
        memo = self._parsed
        for obj in self.pods.by_index(BY_PLACEHOLDER, key):
            pod_key = object_key(obj)
            seen = memo.get(pod_key)
            if seen is not None and seen[0] is obj:
                parsed = seen[1]
            else:
                parsed = shapes.parse_marked(obj)
                if len(memo) >= len(self.pods) + _PARSED_SLACK:
                    memo.clear()  # entries of pods gone without an event: stay bounded
                memo[pod_key] = (obj, parsed)
            if isinstance(parsed, BadMark):
                self._log_bad(pod_key, obj, parsed)
                continue
            pods.append(parsed)
        return pods

    def _log_bad(self, pod_key: str, obj: Obj, bad: BadMark) -> None:
        version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        if self._bad_logged.get(pod_key) == version:
            return
        self._bad_logged[pod_key] = version
        log.error(
            "skipping a pod with malformed coschedule marks",
            extra={"pod": pod_key, "placeholder": bad.placeholder, "why": bad.reason},
        )

    async def reconcile(self, key: str) -> Plan:
        """Observe, plan (placeholder and stuck runs: one plan), carry out; the plan (when to
        look again) goes back to the manager."""
        namespace, _, name = key.partition("/")
        settings = self.settings()
        now = self.clock()
        pods = self.observe_pods(key)
        sts_obj = self.statefulsets.get(key)
        sts = shapes.parse_statefulset(sts_obj) if sts_obj is not None else None
        ppods = [
            shapes.parse_placeholder_pod(obj)
            for obj in self.placeholder_pods.by_index(BY_PLACEHOLDER, key)
        ]
        nodes = {
            p.node_name: parse_node(obj)
            for p in ppods
            if p.node_name and (obj := self.nodes.get(p.node_name)) is not None
        }
        renewed = await self.node_leases.renewed(
            name for name, node in nodes.items() if kubelet_silent(node)
        )
        seed, run_begun = self._seed(key, pods, now)
        live = seed is not None or any(p.live for p in pods)
        if not pods and sts is None and not ppods and seed is None:
            self._forget(key)
            return Plan()
        if seed is not None:  # no pod yet: the run itself is the owner, and runs
            owner: OwnerState | None = OwnerState(seed.root, OwnerStatus.RUNNING, now)
        elif sts is None and not live:
            # Torn down, its last pods ended: nothing to make or tear down reads the owner
            # (it was forgotten at the teardown; walking to it again cost two GETs a run).
            owner = None
        else:
            owner = await self._owner(key, namespace, pods, sts, live, now)
        if live:
            self._idle_since.pop(key, None)
            idle = None
        else:
            idle = self._idle_since.setdefault(key, now)
        templates, claims_to_delete = self.volume_claims(key, pods, sts)
        volumes = await self._pinning_volumes(namespace, sts, pods, ppods, nodes)
        gone = await self._claims_gone(namespace, sts, pods, live)
        kept = await self._claims_kept(namespace, sts, pods)
        observed = Observed(
            namespace=namespace,
            name=name,
            pods=tuple(pods),
            statefulset=sts,
            placeholder_pods=tuple(ppods),
            nodes=nodes,
            owner=owner,
            idle_since=idle,
            claim_templates=templates,
            claims_to_delete=claims_to_delete,
            placeholder_volumes=volumes,
            claims_gone=gone,
            claims_kept=kept,
            all_nodes_silent=any(kubelet_silent(n) for n in nodes.values())
            and all(kubelet_silent(parse_node(obj)) for obj in self.nodes.values()),
            node_renewed=renewed,
            seed=seed.pod if seed is not None else None,
            seed_until=seed.expires if seed is not None else 0.0,
            run_begun=run_begun,
        )
        result = planning.plan(observed, settings, now, owner_recheck=self.owner_recheck)
        facts = StuckFacts(
            pods={
                p.name: obj
                for p in pods
                if (obj := self.pods.get(f"{p.namespace}/{p.name}")) is not None
            },
            nodes=self.nodes.view(),
            placeholder_pods=self.placeholder_pods.view(),
            explained=self.stuck.explained(key),
            was_stuck=self.stuck.is_stuck(key),
        )
        _, stuck_plan = await read_and_plan(self.client, observed, facts, settings, now)
        result = result.then(stuck_plan)
        result = node_pins.stranded_first(result, node_pins.plan_pins(observed, result.actions))
        result = result.then(plan_assistant_conflict(observed))
        await self.executor.execute(key, result.actions, sts_obj)
        return result

    async def _pinning_volumes(
        self,
        namespace: str,
        sts: ObservedSet | None,
        pods: list[MarkedPod],
        ppods: list[PlaceholderPod],
        nodes: Mapping[str, Node],
    ) -> tuple[tuple[str, VolumeTopology], ...]:
        """The placeholder's bound claims and their volumes' topology, read (claim and PV
        GETs) only while one of its pods is on a node it would otherwise leave."""
        leaving = any(
            (node := nodes.get(p.node_name)) is not None
            and (
                kubelet_silent(node) or (not p.deleting and eviction_reason(node, p.tolerations)[0])
            )
            for p in ppods
        )
        if sts is None or not leaving:
            return ()
        mounted = _mounted_claims(namespace, sts, pods)
        names = [*mounted, *(placeholder_claim(t, sts.name) for t in sorted(sts.templates))]
        states = await stuck_facts.claims(self.client, namespace, names)
        return tuple((s.claim, s.volume) for s in states if s.volume is not None)

    async def _claims_gone(
        self, namespace: str, sts: ObservedSet | None, pods: list[MarkedPod], live: bool
    ) -> tuple[str, ...]:
        """A quiet workspaces group's claims that are deleted or being deleted (claim GETs,
        only while its placeholder waits out the idle grace)."""
        if live or sts is None or sts.deleting or planning.per_run(pods, sts):
            return ()
        return await stuck_facts.claims_gone(
            self.client, namespace, _mounted_claims(namespace, sts, pods)
        )

    async def _claims_kept(
        self, namespace: str, sts: ObservedSet | None, pods: list[MarkedPod]
    ) -> tuple[str, ...]:
        """A run's claims its placeholder records and none of its pods names now, that
        still exist (claim GETs, only then). A seeded run (no pod yet) has its seed's."""
        if not pods or sts is None or sts.deleting or not planning.per_run(pods, sts):
            return ()
        named = {claim for pod in pods for claim in pod.marks.claims}
        missing = [c for c in _recorded_claims(sts) if c not in named]
        if not missing:
            return ()
        gone = await stuck_facts.claims_gone(self.client, namespace, missing)
        return tuple(c for c in missing if c not in gone)

    def volume_claims(
        self, key: str, pods: list[MarkedPod], sts: ObservedSet | None
    ) -> tuple[tuple[ClaimTemplate, ...], tuple[str, ...]]:
        templates, made, conflicts = planning.claim_templates(pods, sts)
        for template in conflicts:
            log.warning(
                "pods disagree on a claim template; the earliest pod's wins",
                extra={"placeholder": key, "template": template},
            )
        return templates, made

    async def _owner(
        self,
        key: str,
        namespace: str,
        pods: list[MarkedPod],
        sts: ObservedSet | None,
        live: bool,
        now: float,
    ) -> OwnerState | None:
        per_run = pods[0].marks.mode.per_run if pods else False
        from_sts = planning.known_root(sts)
        if not pods and sts is not None and key in self.owners.states:
            # Its pods gone, a run's StatefulSet without an owner reference (made for a run
            # already done whose last pod still lived: a new leader placing the pod of a run
            # it had just cancelled) is still the run's: the root cached when it was made
            # says the run is done, so it goes now, not after the idle grace.
            per_run = planning.per_run(pods, sts)
        if not pods and sts is not None and from_sts is None and key not in self.owners.states:
            return await self._orphan(namespace, sts, now)
        if not per_run and from_sts is None:
            return None
        try:
            state = await self.owners.resolve(key, namespace, pods, from_sts)
        except OwnerLookupFailed as exc:  # part of what was observed: ``plan`` decides
            return OwnerState(None, OwnerStatus.LOOKUP_FAILED, now, str(exc))
        quiet_for = now - planning.quiet_since(pods, self._idle_since.get(key), now)
        if planning.owner_check_due(live, state, now, self.owner_recheck, quiet_for):
            state = await self.owners.check(key, namespace)
        return state

    async def _orphan(self, namespace: str, sts: ObservedSet, now: float) -> OwnerState | None:
        """A run's StatefulSet with no owner reference, no pod left and no root cached: made
        by a leader that died before the run's pod went (for a run it had just cancelled, or
        that ended or was deleted meanwhile). A PipelineRun's (its annotations say) is read,
        and goes now when the run is done, being deleted or gone; any other, or a run that
        may still make pods, waits out the idle grace (None)."""
        name = run_seed.orphan_run(sts.annotations)
        if name is None:
            return None
        path = object_path(run_seed.API_VERSION, run_seed.PLURAL, namespace, name)
        try:
            # The API server's word, not the cache's: a run just created may not be in the
            # PipelineRuns' cache yet, and its placeholder must not go for that.
            stored = await self.client.get(path)
        except ApiError:  # not known: the idle grace stands
            return None
        why = run_seed.orphan_done(name, run_seed.slim_run(stored) if stored else None)
        if why is None:
            return None
        uid = str(((stored or {}).get("metadata") or {}).get("uid") or "")
        root = OwnerRef(run_seed.API_VERSION, run_seed.KIND, name, uid)
        return OwnerState(root, OwnerStatus.DONE, now, why)


def _mounted_claims(namespace: str, sts: ObservedSet, pods: list[MarkedPod]) -> tuple[str, ...]:
    """The claims the placeholder mounts as they are: those its StatefulSet's annotation
    names, and its group's (a template patch on its way)."""
    group = group_spec(namespace, sts.name, pods)
    named = group.claims if group is not None else ()
    return tuple(dict.fromkeys((*_recorded_claims(sts), *named)))


def _recorded_claims(sts: ObservedSet) -> tuple[str, ...]:
    """The claims the StatefulSet's template mounts, as its annotation records them."""
    return tuple(c for c in sts.annotations.get(ANNOTATION_CLAIMS, "").split(",") if c)
