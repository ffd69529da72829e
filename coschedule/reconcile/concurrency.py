"""Run concurrency control in the reconciler: ConcurrencyControls and grouped runs ->
keyed work queue (one key per group: namespace/control/value) -> ``plan`` -> patches.

Runs are watched with a label selector (only those the webhook grouped); a run type whose
CRD is not installed is looked for again later. State lives on the runs (labels and the
pending-by annotation), so a restart or a new leader rebuilds everything from the watch.
Every patch carries the resourceVersion the decision was made on: a stale decision (another
replica, a cache behind the API server) gets 409 and is made again (the ``Manager`` retries
the key with backoff, as for any error), so nothing starts twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from coschedule.concurrency.admission import admit_run, policy_held
from coschedule.concurrency.control import Control
from coschedule.concurrency.names import API_VERSION, PLURAL
from coschedule.concurrency.plan import (
    Action,
    CancelRun,
    Group,
    GroupKey,
    MarkWaiting,
    StartRun,
    control_status,
    group_keys,
    next_deadline,
    plan,
)
from coschedule.concurrency.runs import (
    Run,
    State,
    cancel_patch,
    parse_run,
    run_labels,
    start_patch,
    waiting_patch,
)
from coschedule.engines import RUN_ENGINES, RUN_SPEC_FIELDS, Kind, Strategy
from coschedule.kube.client import ApiError, KubeClient, object_path
from coschedule.kube.controls_cache import ControlCache
from coschedule.kube.discovery import RETRY_SECONDS, wait_served
from coschedule.kube.events import record_event
from coschedule.kube.informer import IndexFunc, Informer, Obj
from coschedule.marks import (
    ANNOTATION_HELD_BY,
    ANNOTATION_PENDING_BY,
    ANNOTATION_PRIORITY_PREFIX,
    ANNOTATION_WAITING,
    ANNOTATION_WAITING_DATA,
    LABEL_CONCURRENCY_GROUPED,
    LABEL_CONCURRENCY_PREFIX,
)
from coschedule.reconcile.executor import JSON_PATCH, NotLeader
from coschedule.reconcile.workqueue import WorkQueue
from coschedule.wire import jsonpatch

log = logging.getLogger("coschedule.concurrency")

DEFAULT_WORKERS = 2
STATUS_DELAY_SECONDS = 1.0  # a control's status is written at most about once a second
STATUS_PREFIX = "status:"  # queue keys of control status updates (namespaces hold no ":")
# Queue keys of runs the admission policy held that no webhook decided (an outage):
# ``admit:<kind>/<namespace>/<name>``.
ADMIT_PREFIX = "admit:"


class ConcurrencyMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.cancellations = Counter(
            "coschedule_concurrency_cancellations_total",
            "Runs cancelled by concurrency control (superseded, or past maxPending or "
            "maxWaitSeconds), by strategy.",
            ["strategy"],
            registry=registry,
        )
        self.pending = Gauge(
            "coschedule_concurrency_pending_runs",
            "Runs held pending by coschedule, waiting for their group to let them start.",
            registry=registry,
        )
        self.start_delay = Histogram(
            "coschedule_concurrency_start_delay_seconds",
            "From a run's creation to coschedule starting it.",
            buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 14400),
            registry=registry,
        )
        self.starts = Counter(
            "coschedule_concurrency_starts_total",
            "Runs started by coschedule.",
            registry=registry,
        )
        for strategy in Strategy:  # Queue too: maxPending and maxWaitSeconds cancel
            self.cancellations.labels(strategy.value)


def slim_run(obj: Obj, kind: Kind) -> Obj:
    """What the decisions read of a run: identity, labels (with those its engine adds from
    the spec, which is not kept), our annotations, start state."""
    meta = obj.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    slim_status: dict[str, Any] = {}
    if "phase" in status:
        slim_status["phase"] = status["phase"]
    conditions = [
        c
        for c in status.get("conditions") or ()
        if isinstance(c, dict) and c.get("type") == "Succeeded"
    ]
    if conditions:
        slim_status["conditions"] = conditions
    return {
        "metadata": {
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion"),
            "creationTimestamp": meta.get("creationTimestamp"),
            "labels": run_labels(kind, obj),
            "annotations": {
                k: v
                for k, v in annotations.items()
                if k
                in (
                    ANNOTATION_PENDING_BY,
                    ANNOTATION_WAITING,
                    ANNOTATION_WAITING_DATA,
                    ANNOTATION_HELD_BY,
                )
                or k.startswith((LABEL_CONCURRENCY_PREFIX, ANNOTATION_PRIORITY_PREFIX))
            },
        },
        "spec": {k: spec[k] for k in RUN_SPEC_FIELDS if k in spec},
        "status": slim_status,
    }


# The runs' indexes: each group a run is in (``namespace/control/value``), each control that
# groups it (``namespace/control``), and whether coschedule holds it pending.
BY_GROUP = "group"
BY_CONTROL = "control"
BY_STATE = "state"
HELD = "pending-by-us"


def run_indexers(kind: Kind) -> dict[str, IndexFunc]:
    def groups(obj: Obj) -> list[str]:
        return [str(key) for key in group_keys(parse_run(kind, obj))]

    def controls(obj: Obj) -> list[str]:
        run = parse_run(kind, obj)
        return [f"{run.namespace}/{control}" for control in sorted(run.groups())]

    def state(obj: Obj) -> list[str]:
        return [HELD] if parse_run(kind, obj).state is State.PENDING_BY_US else []

    return {BY_GROUP: groups, BY_CONTROL: controls, BY_STATE: state}


class ConcurrencyController:
    """Run concurrency control: one key per group (``namespace/control/value``) and one per
    control's status (``status:namespace/name``)."""

    name = "concurrency"
    probe = "concurrency"
    log = log

    def __init__(
        self,
        client: KubeClient,
        registry: CollectorRegistry,
        *,
        leading: Callable[[], bool],
        workers: int = DEFAULT_WORKERS,
        clock: Callable[[], float] = time.time,
        discovery_retry: float = RETRY_SECONDS,
        retry_base: float | None = None,
    ) -> None:
        self.client = client
        self.leading = leading
        self.metrics = ConcurrencyMetrics(registry)
        self.clock = clock
        self.workers = workers
        self.discovery_retry = discovery_retry
        self.queue = WorkQueue() if retry_base is None else WorkQueue(retry_base=retry_base)
        self.controls = ControlCache(client, discovery_retry=discovery_retry)
        self.controls.listeners.append(self._on_control)
        self.runs: dict[Kind, Informer] = {}
        self.absent: dict[Kind, bool | None] = {}  # None: not asked yet
        self.discovered: dict[Kind, asyncio.Event] = {}
        for kind, engine in RUN_ENGINES.items():
            informer = Informer(
                client,
                f"/apis/{engine.api_version}/{engine.plural}",
                name=engine.plural,
                label_selector=LABEL_CONCURRENCY_GROUPED,
                transform=functools.partial(slim_run, kind=kind),
                indexers=run_indexers(kind),
            )
            informer.add_handler(self._handler(kind))
            self.runs[kind] = informer
            self.absent[kind] = None
            self.discovered[kind] = asyncio.Event()

    # ---- lifecycle ----------------------------------------------------------------------

    def _ready_parts(self) -> list[str]:
        waiting = []
        ok, _ = self.controls.readiness()
        if not ok:
            waiting.append("concurrencycontrols")
        for kind, informer in self.runs.items():
            if self.absent[kind] is None or (
                not self.absent[kind] and not informer.synced.is_set()
            ):
                waiting.append(informer.name)
        return waiting

    def readiness(self) -> tuple[bool, str | None]:
        waiting = self._ready_parts()
        if waiting:
            why = self.client.reachability.waiting_detail()
            detail = f"caches not synced: {', '.join(waiting)}"
            return False, f"{detail}; {why}" if why else detail
        absent = [self.runs[k].name for k, a in self.absent.items() if a]
        if self.controls.absent:
            absent.append("concurrencycontrols")
        return True, (f"not served (CRD not installed): {', '.join(absent)}" if absent else None)

    def settings_changed(self) -> None:
        """Nothing here reads the settings."""

    def log_fields(self, key: str) -> dict[str, str]:
        return {"group": key}

    def informer_runs(self) -> list[Coroutine[Any, Any, None]]:
        return [self.controls.run(), *(self._run_kind(kind) for kind in self.runs)]

    async def _run_kind(self, kind: Kind) -> None:
        engine = RUN_ENGINES[kind]

        def absent() -> None:
            self.absent[kind] = True
            self.discovered[kind].set()

        await wait_served(
            self.client,
            engine.api_version,
            engine.plural,
            retry=self.discovery_retry,
            on_absent=absent,
        )
        self.absent[kind] = False
        self.discovered[kind].set()
        await self.runs[kind].run()

    async def wait_synced(self) -> None:
        await self.controls.wait_synced()
        for kind, informer in self.runs.items():
            await self.discovered[kind].wait()
            if not self.absent[kind]:
                await informer.synced.wait()

    def take_over(self) -> None:
        for key in sorted(self.known_groups()):
            self.queue.add(key)
        for kind, informer in self.runs.items():
            for obj in informer.values():
                if policy_held(obj):
                    self._on_run(kind, "ADDED", obj, None)
        for namespace, controls in list(self.controls.by_namespace.items()):
            for name in list(controls):
                self._status_soon(namespace, name)

    # ---- what the indexes hold --------------------------------------------------------

    def known_groups(self) -> set[str]:
        """Every group with a run in the caches."""
        return set().union(*(informer.index_values(BY_GROUP) for informer in self.runs.values()))

    def groups_of(self, namespace: str, control: str) -> set[GroupKey]:
        """The groups of ``control`` that hold a run."""
        found: set[GroupKey] = set()
        for kind, informer in self.runs.items():
            for obj in informer.by_index(BY_CONTROL, f"{namespace}/{control}"):
                value = parse_run(kind, obj).groups().get(control)
                if value is not None:
                    found.add(GroupKey(namespace, control, value))
        return found

    # ---- event handlers -----------------------------------------------------------------

    def _handler(self, kind: Kind) -> Callable[[str, Obj, Obj | None], None]:
        def handle(event: str, obj: Obj, old: Obj | None) -> None:
            self._on_run(kind, event, obj, old)

        return handle

    def _on_run(self, kind: Kind, event: str, obj: Obj, old: Obj | None) -> None:
        """A run changed (the informer indexed it already): look at every group it was in
        or is in now; one the admission policy held and no webhook decided, decide."""
        if event != "DELETED" and policy_held(obj):
            meta = obj.get("metadata") or {}
            self.queue.add(f"{ADMIT_PREFIX}{kind.value}/{meta.get('namespace')}/{meta.get('name')}")
        before = set(group_keys(parse_run(kind, old))) if old is not None else set()
        after = set(group_keys(parse_run(kind, obj))) if event != "DELETED" else set()
        self.metrics.pending.set(
            sum(informer.index_count(BY_STATE, HELD) for informer in self.runs.values())
        )
        for group in before | after:
            self.queue.add(str(group))
            self._status_soon(group.namespace, group.control)

    def _on_control(self, namespace: str, name: str, control: Control | None) -> None:
        for group in sorted(self.groups_of(namespace, name), key=str):
            self.queue.add(str(group))
        if control is not None:
            self._status_soon(namespace, name)

    def _status_soon(self, namespace: str, name: str) -> None:
        with contextlib.suppress(RuntimeError):  # no running loop: nothing leads yet
            self.queue.add_after(f"{STATUS_PREFIX}{namespace}/{name}", STATUS_DELAY_SECONDS)

    # ---- workers --------------------------------------------------------------------------

    async def reconcile(self, key: str) -> None:
        """One group's plan carried out, or one control's status written. A patch that
        meets a newer version (409: our cache was behind) fails the reconcile: the key is
        retried with backoff and the watch brings the new version meanwhile."""
        if key.startswith(STATUS_PREFIX):
            namespace, _, name = key.removeprefix(STATUS_PREFIX).partition("/")
            await self.update_status(namespace, name)
            return
        if key.startswith(ADMIT_PREFIX):
            kind_text, namespace, name = key.removeprefix(ADMIT_PREFIX).split("/", 2)
            await self.admit(Kind(kind_text), namespace, name)
            return
        group = GroupKey.parse(key)
        observed = self.observe(group)
        now = self.clock()
        deadline = next_deadline(observed[group])
        if deadline is not None and deadline > now:
            # A run of the group reaches maxWaitSeconds then: look again (a second after,
            # so that clock skew with the API server's creation time cannot make it early).
            with contextlib.suppress(RuntimeError):
                self.queue.add_after(key, deadline - now + 1.0)
        for action in plan(group, observed, now):
            if not self.leading():
                raise NotLeader
            try:
                await self.execute(action)
            except ApiError as exc:
                if exc.status != 404:
                    raise
                # the run is gone: nothing to start or cancel

    async def admit(self, kind: Kind, namespace: str, name: str) -> None:
        """What the run webhook would have done to a run the admission policy held while
        no webhook answered: the run webhook's own decision (``admit_run``) on the run as
        stored, with the controls of its namespace, in one patch conditional on its
        resourceVersion. Labelled, it joins its groups (and is started when they let it);
        selected by no control, it is started as its author submitted it."""
        engine = RUN_ENGINES[kind]
        path = object_path(engine.api_version, engine.plural, namespace, name)
        stored = await self.client.get(path)  # the whole run: its params make the key
        if stored is None or not policy_held(stored):
            return
        decision = admit_run(kind, stored, namespace, self.controls.controls(namespace))
        version = str((stored.get("metadata") or {}).get("resourceVersion") or "")
        ops = [jsonpatch.test("/metadata/resourceVersion", version), *decision.ops]
        if not self.leading():
            raise NotLeader
        await self.client.patch(path, ops, content_type=JSON_PATCH)
        run = parse_run(kind, stored)
        controls = ", ".join(m.control.name for m in decision.matches) or "none"
        message = (
            f"created while the coschedule webhook was unreachable and held by the admission "
            f"policy; decided by the reconciler: {decision.outcome.value} "
            f"(ConcurrencyControls: {controls})"
        )
        log.info(
            "run admitted without the webhook decided",
            extra={"run": f"{namespace}/{name}", "kind": kind.value, "why": message},
        )
        await run_event(self.client, run, "AdmittedWithoutWebhook", message)

    def group(self, key: GroupKey) -> Group:
        """The group's control and runs (by kind, then namespace/name), from the caches."""
        runs = [
            parse_run(kind, obj)
            for kind in sorted(self.runs)
            for obj in self.runs[kind].by_index(BY_GROUP, str(key))
        ]
        return Group(key, self.controls.get(key.namespace, key.control), tuple(runs))

    def observe(self, key: GroupKey) -> dict[GroupKey, Group]:
        """The group and every other group its runs are in, from the caches."""
        groups = {key: self.group(key)}
        for run in groups[key].runs:
            for other in group_keys(run):
                if other not in groups:
                    groups[other] = self.group(other)
        return groups

    async def update_status(self, namespace: str, name: str) -> None:
        """Write the control's counts to its status subresource when they changed."""
        control = self.controls.get(namespace, name)
        stored = self.controls.stored(namespace, name)
        if control is None or stored is None or not self.leading():
            return
        groups = [self.group(k) for k in sorted(self.groups_of(namespace, name))]
        status: dict[str, Any] = control_status(control, groups)
        generation = (stored.get("metadata") or {}).get("generation")
        if isinstance(generation, int):
            status["observedGeneration"] = generation
        current = stored.get("status") or {}
        if all(current.get(k) == v for k, v in status.items()):
            return
        path = object_path(API_VERSION, PLURAL, namespace, name) + "/status"
        try:
            await self.client.patch(path, {"status": status})
        except ApiError as exc:
            if exc.status != 404:  # a control deleted meanwhile has no status to write
                raise

    async def execute(self, action: Action) -> None:
        run = action.run
        path = run_path(run)
        if isinstance(action, CancelRun):
            await self.client.patch(path, cancel_patch(run, action.value))
            self.metrics.cancellations.labels(action.strategy.value).inc()
            message = (
                f"cancelled by ConcurrencyControl {action.control}: {action.why}, key {action.key}"
            )
            log.info(
                "cancelled run",
                extra={
                    "run": f"{run.namespace}/{run.name}",
                    "kind": run.kind.value,
                    "why": message,
                },
            )
            await run_event(self.client, run, "Cancelled", message)
        elif isinstance(action, StartRun):
            await start_run(self.client, run, action.why, started=self._count_start)
        elif isinstance(action, MarkWaiting):
            # Written only when the reason changed (the plan compares it with the run's): one
            # Event per change, and nothing when a look changes nothing.
            await self.client.patch(path, waiting_patch(run, action.why, action.data))
            if action.why != run.annotations.get(ANNOTATION_WAITING):
                await run_event(self.client, run, "Waiting", action.why)

    def _count_start(self, run: Run) -> None:
        created = run.created_at
        if created:
            self.metrics.start_delay.observe(max(0.0, self.clock() - created))
        self.metrics.starts.inc()


def run_path(run: Run) -> str:
    engine = RUN_ENGINES[run.kind]
    return object_path(engine.api_version, engine.plural, run.namespace, run.name)


async def start_run(
    client: KubeClient, run: Run, why: str, *, started: Callable[[Run], None] | None = None
) -> None:
    """Let a run held pending by coschedule start: its engine's start patch, only if the run
    is unchanged since ``run`` was read (a stale one is 409), then ``started`` (the
    reconciler's metrics), a log line and a ``Started`` Event. The one start path: the
    reconciler's plans and ``coschedule release-held``."""
    await client.patch(run_path(run), start_patch(run))
    if started is not None:
        started(run)
    message = f"started by coschedule: {why}"
    log.info(
        "started run",
        extra={"run": f"{run.namespace}/{run.name}", "kind": run.kind.value, "why": message},
    )
    await run_event(client, run, "Started", message)


async def run_event(
    client: KubeClient, run: Run, reason: str, message: str, kind: str = "Normal"
) -> None:
    involved = {
        "apiVersion": RUN_ENGINES[run.kind].api_version,
        "kind": run.kind.value,
        "name": run.name,
        "uid": run.uid,
    }
    await record_event(client, run.namespace, involved, reason, message, kind)
