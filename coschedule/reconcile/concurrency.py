"""Run concurrency control in the reconciler: ConcurrencyControls and grouped runs ->
keyed work queue (one key per group: namespace/control/value) -> ``run_plan`` -> a ``Plan``
whose starts, cancels, waiting marks and status writes the one ``Executor`` carries out.

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

from coschedule.concurrency.admission import policy_held
from coschedule.concurrency.control import Control
from coschedule.concurrency.plan import Group, GroupKey, group_keys
from coschedule.concurrency.runs import State, parse_run, run_labels
from coschedule.engines import (
    RUN_ENGINES,
    RUN_SPEC_FIELDS,
    SLIM_PER_TASK_PLACEMENT,
    Kind,
    tekton_per_task_placement,
)
from coschedule.kube.client import KubeClient, object_path
from coschedule.kube.controls_cache import ControlCache
from coschedule.kube.discovery import RETRY_SECONDS, wait_served
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
from coschedule.reconcile.executor import Executor
from coschedule.reconcile.model import Plan
from coschedule.reconcile.reconciler_metrics import ReconcileMetrics
from coschedule.reconcile.run_plan import plan_admit, plan_group, plan_status
from coschedule.reconcile.workqueue import WorkQueue

log = logging.getLogger("coschedule.concurrency")

DEFAULT_WORKERS = 2
STATUS_DELAY_SECONDS = 1.0  # a control's status is written at most about once a second
STATUS_PREFIX = "status:"  # queue keys of control status updates (namespaces hold no ":")
# Queue keys of runs the admission policy held that no webhook decided (an outage):
# ``admit:<kind>/<namespace>/<name>``.
ADMIT_PREFIX = "admit:"


def slim_run(obj: Obj, kind: Kind) -> Obj:
    """What the decisions read of a run: identity, labels (with those its engine adds from
    the spec, which is not kept), our annotations, start state, and whether a start seeds
    its placeholder (``runs.seedable``)."""
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
    slim_spec: dict[str, Any] = {k: spec[k] for k in RUN_SPEC_FIELDS if k in spec}
    if kind is Kind.PIPELINE_RUN and tekton_per_task_placement(spec):
        slim_spec[SLIM_PER_TASK_PLACEMENT] = True  # not seeded: its start is not stamped
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
        "spec": slim_spec,
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
        metrics: ReconcileMetrics,
        *,
        leading: Callable[[], bool],
        workers: int = DEFAULT_WORKERS,
        clock: Callable[[], float] = time.time,
        discovery_retry: float = RETRY_SECONDS,
        retry_base: float | None = None,
    ) -> None:
        self.client = client
        self.metrics = metrics.concurrency
        self.clock = clock
        # Leadership is checked by the executor, before each action (``NotLeader``).
        self.executor = Executor(client, metrics, leading=leading, clock=clock)
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

    def leader_runs(self) -> list[Coroutine[Any, Any, None]]:
        return []

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

    async def reconcile(self, key: str) -> Plan:
        """Observe one key, plan it purely (``run_plan``) and give the plan to the executor:
        a group's starts, cancels and waiting marks (and a look again at its next
        ``maxWaitSeconds``), a control's status, or a held run admitted. A patch that meets
        a newer version (409: our cache was behind) fails the reconcile: the manager retries
        the key with backoff and the watch brings the new version meanwhile."""
        if key.startswith(STATUS_PREFIX):
            namespace, _, name = key.removeprefix(STATUS_PREFIX).partition("/")
            control = self.controls.get(namespace, name)
            stored = self.controls.stored(namespace, name)
            groups = (
                [self.group(k) for k in sorted(self.groups_of(namespace, name))]
                if control is not None and stored is not None
                else []
            )
            result = plan_status(namespace, name, control, stored, groups)
        elif key.startswith(ADMIT_PREFIX):
            kind_text, namespace, name = key.removeprefix(ADMIT_PREFIX).split("/", 2)
            kind = Kind(kind_text)
            engine = RUN_ENGINES[kind]
            # The whole run, as stored: its params make the key.
            stored = await self.client.get(
                object_path(engine.api_version, engine.plural, namespace, name)
            )
            result = plan_admit(
                kind, namespace, stored, self.controls.controls(namespace), self.clock()
            )
        else:
            group = GroupKey.parse(key)
            result = plan_group(group, self.observe(group), self.clock())
        await self.executor.execute(key, result.actions, None)
        return result

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
