"""Sustained load with faults on the real stack: PipelineRuns created at a steady rate into
four namespaces ("lanes"), faults injected while they run, the fault tier's invariants checked
all along, and what a benchmark reports measured on the way. Used by tests/real/test_load.py
(a small load, ``make e2e-faults``) and bench/load.py (the full one, ``make bench-load``).

The lanes: ``off`` (coschedule not enabled: the webhook is not called; the latency
baseline), ``on`` (mode ``pipelineruns``, no ConcurrencyControl: the same runs with
coschedule), ``queue`` (``pipelineruns``, a ``Queue maxRunning: 2`` ConcurrencyControl) and
``wsqueue`` (``workspaces``, a ``Queue maxRunning: 2`` one); each gets three runs in a row
(``ORDER``). Each run has three tasks in sequence sharing one
volumeClaimTemplate workspace of the node-local class (write, append, check). A finished run
is deleted (as a pruner would) once recorded and once it is checked to have started each
task once, so the namespaces stay the size of what runs.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import httpx

from bench.servers import cpu_seconds, rss_bytes
from tests.e2e.install import SYSTEM_NAMESPACE
from tests.e2e.kube import Api, ApiError, Obj, wait_for
from tests.e2e.world import (
    Ticker,
    make_namespace,
    unique,
    wait_webhook_sees,
    wait_webhook_sees_control,
)
from tests.real.faults import (
    PENDING,
    ApiRestart,
    Invariants,
    Takeover,
    kill_leader,
    leftovers,
    restart_apiserver,
)
from tests.real.runs import claim_template, describe, done, pipeline_run, task, verdict
from tests.real.stack import CONFIG, RealCluster

TASKS = ("one", "two", "three")
SPARE = "reconciler-b"
FLOW_SCHEMA = "coschedule-load"
DISPATCHED = "apiserver_flowcontrol_dispatched_requests_total"


@dataclass(frozen=True)
class Lane:
    key: str
    mode: str | None  # None: coschedule not enabled there
    max_running: int | None = None  # a Queue ConcurrencyControl over the namespace


LANES = (
    Lane("off", None),
    Lane("on", "pipelineruns"),
    Lane("queue", "pipelineruns", 2),
    Lane("wsqueue", "workspaces", 2),
)
# The order runs are created in, over and over: three runs in a row into each controlled lane,
# so that its control holds the third back (the first is still running) at a rate it keeps up
# with.
ORDER = ("off", "on", "queue", "queue", "queue", "off", "on", "wsqueue", "wsqueue", "wsqueue")


def load_run(ns: str, name: str, storage_class: str, sleep: int) -> Obj:
    tasks = [
        task("one", "echo one > $(workspaces.ws.path)/f\n", ["ws"]),
        task(
            "two",
            f"sleep {sleep}\necho two >> $(workspaces.ws.path)/f\n",
            ["ws"],
            run_after=["one"],
        ),
        task("three", "grep -qx two $(workspaces.ws.path)/f\n", ["ws"], run_after=["two"]),
    ]
    return pipeline_run(
        ns, name, tasks, {"ws": {"volumeClaimTemplate": claim_template(storage_class)}}
    )


@dataclass
class Record:
    lane: str
    created: float  # monotonic, when the create returned
    create_wait: float = 0.0  # how late the create was (the API server away)
    first_running: float | None = None
    finished: float | None = None
    verdict: tuple[str, str] | None = None
    taskruns: int | None = None


@dataclass
class LoadWatch(Invariants):
    """The invariants in the coschedule lanes, and in every lane each run's first pod Running
    and verdict as seen by a look (every ``interval`` s); finished runs are pruned
    ``prune_after`` s after their verdict, once their TaskRuns are counted."""

    thread_name: ClassVar[str] = "load-watch"
    lanes: dict[str, str] = field(default_factory=dict)  # namespace -> lane key
    records: dict[str, Record] = field(default_factory=dict)  # "ns/name" -> record
    prune_after: float = 5.0
    held: set[str] = field(default_factory=set)  # runs seen held back by a control
    lock: threading.Lock = field(default_factory=threading.Lock)

    def step(self) -> None:
        for ns in self.lanes:
            runs = self.api.list("PipelineRun", ns)
            pods = self.api.list("Pod", ns)
            now = time.monotonic()
            self._record(ns, runs, pods, now)
            if ns in self.namespaces:
                self.observe(ns, runs, pods, self.api.list("StatefulSet", ns))
            self._prune(ns, runs, now)
        self.looks += 1

    def _record(self, ns: str, runs: list[Obj], pods: list[Obj], now: float) -> None:
        running = {
            (p["metadata"].get("labels") or {}).get("tekton.dev/pipelineRun")
            for p in pods
            if (p.get("status") or {}).get("phase") in ("Running", "Succeeded")
        }
        with self.lock:
            for run in runs:
                record = self.records.get(f"{ns}/{run['metadata']['name']}")
                if record is None:
                    continue
                if run["spec"].get("status") == PENDING:
                    self.held.add(f"{ns}/{run['metadata']['name']}")
                if record.first_running is None and run["metadata"]["name"] in running:
                    record.first_running = now
                if record.finished is None and done(run):
                    record.finished = now
                    record.verdict = verdict(run)
                    if record.first_running is None:  # a short run, between two looks
                        record.first_running = now

    def _prune(self, ns: str, runs: list[Obj], now: float) -> None:
        for run in runs:
            name = run["metadata"]["name"]
            record = self.records.get(f"{ns}/{name}")
            if (
                record is None
                or record.finished is None
                or now - record.finished < self.prune_after
            ):
                continue
            taskruns = self.api.list("TaskRun", ns, label_selector=f"tekton.dev/pipelineRun={name}")
            record.taskruns = len(taskruns)
            if len(taskruns) != len(TASKS) and record.verdict == ("True", "Succeeded"):
                self.fail(f"{ns}/{name}: {len(taskruns)} TaskRuns for {len(TASKS)} tasks")
            with contextlib.suppress(ApiError):
                self.api.delete("PipelineRun", name, ns, propagation="Background")


@dataclass
class Usage(Ticker):
    """Every ``interval`` s: CPU seconds and RSS of coschedule's processes (from /proc), and
    the API server's count of requests dispatched for coschedule's identities (its
    FlowSchema), summed across API server restarts (a counter that drops started again)."""

    thread_name: ClassVar[str] = "usage"
    api: Api
    pids: Callable[[], dict[int, str]]  # pid -> role ("webhook", "reconciler")
    interval: float = field(default=2.0, kw_only=True)
    cpu_first: dict[int, float] = field(default_factory=dict)
    cpu_last: dict[int, float] = field(default_factory=dict)
    role: dict[int, str] = field(default_factory=dict)
    rss_max: dict[str, int] = field(default_factory=dict)
    requests: float = 0.0
    _last_count: float | None = None

    def step(self) -> None:
        for pid, role in self.pids().items():
            try:
                cpu, rss = cpu_seconds(pid), rss_bytes(pid)
            except (OSError, RuntimeError):
                continue  # exited (killed by a fault): its last figures stand
            self.role[pid] = role
            self.cpu_first.setdefault(pid, cpu)
            self.cpu_last[pid] = cpu
            self.rss_max[role] = max(self.rss_max.get(role, 0), rss)
        count = dispatched(self.api)
        if count is None:
            return
        if self._last_count is not None:
            self.requests += count - self._last_count if count >= self._last_count else count
        self._last_count = count

    def cpu(self, role: str) -> float:
        return sum(
            self.cpu_last[pid] - self.cpu_first[pid] for pid, r in self.role.items() if r == role
        )


def install_flow_schema(api: Api) -> None:
    """A FlowSchema that matches only coschedule's ServiceAccounts, so that the API server
    counts their requests apart (``apiserver_flowcontrol_dispatched_requests_total``)."""
    body = {
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
        "kind": "FlowSchema",
        "metadata": {"name": FLOW_SCHEMA},
        "spec": {
            "matchingPrecedence": 500,
            "priorityLevelConfiguration": {"name": "workload-high"},
            "distinguisherMethod": {"type": "ByUser"},
            "rules": [
                {
                    "subjects": [
                        {
                            "kind": "ServiceAccount",
                            "serviceAccount": {"namespace": SYSTEM_NAMESPACE, "name": "*"},
                        }
                    ],
                    "resourceRules": [
                        {
                            "verbs": ["*"],
                            "apiGroups": ["*"],
                            "resources": ["*"],
                            "clusterScope": True,
                            "namespaces": ["*"],
                        }
                    ],
                    "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
                }
            ],
        },
    }
    with contextlib.suppress(ApiError):
        api.request("POST", "/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas", body)


def dispatched(api: Api) -> float | None:
    """Requests the API server dispatched for coschedule's FlowSchema so far (None: no
    answer)."""
    try:
        response = api.http.get("/metrics", timeout=10)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    total = 0.0
    for line in response.text.splitlines():
        if line.startswith(DISPATCHED + "{") and f'flow_schema="{FLOW_SCHEMA}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


@dataclass
class Plan:
    runs: int
    minutes: float
    sleep: int = 3  # the second task's sleep, seconds
    kill_leader_at: float | None = 1 / 3  # fraction of the creation period
    restart_apiserver_at: float | None = 2 / 3
    drain_timeout: float = 600.0


@dataclass
class Outcome:
    records: dict[str, Record]
    namespaces: dict[str, str]  # lane key -> namespace
    broken: list[str]
    watch_errors: list[str]
    looks: int
    most_running_in: dict[str, int]
    held: int  # runs seen held back by a control
    create_seconds: float  # first create to last create
    drain_seconds: float  # last create to every run done
    takeover: Takeover | None
    takeover_next_start: float | None  # kill -> the first run a queue lane started after it
    api_restart: ApiRestart | None
    api_first_verdict: float | None  # API server ready again -> the next run's verdict
    cpu: dict[str, float]
    rss_max: dict[str, int]
    requests: float
    idle_requests_per_s: float
    left: dict[str, list[str]]
    lease_holders: list[Any]


def _namespaces(real: RealCluster) -> dict[str, str]:
    api = real.api
    namespaces = {}
    for lane in LANES:
        ns = unique(f"load-{lane.key}")
        make_namespace(api, ns, lane.mode, enabled=lane.mode is not None)
        if lane.mode not in (None, CONFIG["coschedule"]):  # until seen, the cluster's applies
            wait_webhook_sees(api, ns, lane.mode)
        if lane.max_running is not None:
            control = {
                "apiVersion": "coschedule.dev/v1alpha1",
                "kind": "ConcurrencyControl",
                "metadata": {"name": "limit", "namespace": ns},
                "spec": {
                    "selector": {},
                    "kinds": ["PipelineRun"],
                    "strategy": "Queue",
                    "maxRunning": lane.max_running,
                },
            }
            api.create(control)
            probe = load_run(ns, "probe", real.local_class, 0)
            wait_webhook_sees_control(api, ns, "limit", probe)
        namespaces[lane.key] = ns
    return namespaces


def _create(api: Api, obj: Obj, deadline: float) -> None:
    """Create, retrying while the API server is away (a fault; on a loaded 2-core machine it
    took minutes to serve again)."""
    while True:
        try:
            api.create(obj)
            return
        except (httpx.HTTPError, ApiError) as exc:
            if isinstance(exc, ApiError) and exc.status == 409:
                return  # created by the try the API server did not answer
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def run_load(real: RealCluster, plan: Plan, log: Callable[[str], None] = print) -> Outcome:
    """Create ``plan.runs`` runs over ``plan.minutes``, inject the faults, wait for every
    verdict, prune, and look for what is left. Leaves the stack as it found it (one
    reconciler, ``reconciler-a``, leading); the namespaces are deleted unless REAL_KEEP."""
    assert real.plane is not None
    assert real.product is not None
    api, plane, product = real.api, real.plane, real.product
    install_flow_schema(api)
    namespaces = _namespaces(real)
    lanes = {lane.key: lane for lane in LANES}
    checked_ns = [ns for key, ns in namespaces.items() if lanes[key].mode is not None]
    watch = LoadWatch(
        api,
        checked_ns,
        limits={namespaces[k]: lane.max_running for k, lane in lanes.items() if lane.max_running},
        lanes={ns: key for key, ns in namespaces.items()},
        interval=1.0,
    )

    def pids() -> dict[int, str]:
        out = {product.webhook.pid: "webhook"} if product.webhook is not None else {}
        out.update({p.pid: "reconciler" for p in product.reconcilers.values()})
        return out

    usage = Usage(api, pids)
    if plan.kill_leader_at is not None:
        assert product.start_reconciler(SPARE) is not None
    # What coschedule asks of the API server with nothing to do (Lease renewals, resyncs).
    before, idle_start = dispatched(api), time.monotonic()
    time.sleep(20)
    after = dispatched(api)
    idle = (after - before) / (time.monotonic() - idle_start) if before and after else 0.0

    faults: dict[str, Any] = {}
    fault_errors: list[str] = []
    period = plan.minutes * 60

    def inject() -> None:
        try:
            schedule = sorted(
                (at, name)
                for at, name in (
                    (plan.kill_leader_at, "leader"),
                    (plan.restart_apiserver_at, "apiserver"),
                )
                if at is not None
            )
            for at, name in schedule:
                time.sleep(max(0.0, start + at * period - time.monotonic()))
                if name == "leader":
                    faults["leader_killed_at"] = time.monotonic()
                    faults["takeover"] = kill_leader(product)
                    log(f"fault: leader killed, {faults['takeover']}")
                else:
                    port = product.reconciler_ports[product.leader() or "reconciler-a"]
                    faults["api_back_at"] = None
                    restart = restart_apiserver(plane, port)
                    faults["api_restart"] = restart
                    faults["api_back_at"] = time.monotonic() - restart.fresh_seconds
                    log(f"fault: API server restarted, {restart}")
        except Exception as exc:  # reported with the outcome
            fault_errors.append(repr(exc))

    interval = period / plan.runs
    watch.start()
    usage.start()
    start = time.monotonic()
    injector = threading.Thread(target=inject, name="faults", daemon=True)
    injector.start()
    try:
        for i in range(plan.runs):
            due = start + i * interval
            time.sleep(max(0.0, due - time.monotonic()))
            key = ORDER[i % len(ORDER)]
            ns, name = namespaces[key], f"r{i:04d}"
            _create(api, load_run(ns, name, real.local_class, plan.sleep), due + 600)
            with watch.lock:
                watch.records[f"{ns}/{name}"] = Record(
                    key, time.monotonic(), create_wait=time.monotonic() - due
                )
            if i % 20 == 0:
                log(f"created {i + 1}/{plan.runs}; {_progress(watch)}")
        created = time.monotonic()
        injector.join(timeout=300)
        try:
            wait_for(
                "every run's verdict",
                lambda: all(r.finished is not None for r in watch.records.values()),
                timeout=plan.drain_timeout,
                interval=2,
                describe=lambda: _progress(watch, full=True),
            )
        except AssertionError:  # reported with the figures, which are still worth printing
            watch.fail(f"not every run had a verdict {plan.drain_timeout:.0f} s after the last")
        drained = time.monotonic()
        # Pruned with the rest: wait for the last verdicts' deletes, then for what is left.
        left: dict[str, list[str]] = {}
        deadline = time.monotonic() + 180
        while True:
            left = {ns: _left(api, ns) for ns in namespaces.values()}
            if not any(left.values()) or time.monotonic() > deadline:
                break
            time.sleep(2)
    finally:
        watch.stop()
        usage.stop()
        _restore(real)
    if fault_errors:
        watch.fail(f"a fault did not go as planned: {fault_errors}")
    killed_at = faults.get("leader_killed_at")
    next_start = None
    if killed_at is not None:
        starts = [
            r.first_running - killed_at
            for r in watch.records.values()
            if r.first_running is not None
            and r.first_running > killed_at
            and lanes[r.lane].max_running is not None
        ]
        next_start = min(starts, default=None)
    back = faults.get("api_back_at")
    first_verdict = None
    if back is not None:
        first_verdict = min(
            (r.finished - back for r in watch.records.values() if (r.finished or 0) > back),
            default=None,
        )
    return Outcome(
        records=dict(watch.records),
        namespaces=namespaces,
        broken=list(watch.broken),
        watch_errors=list(watch.errors),
        looks=watch.looks,
        most_running_in={
            k: watch.most_running_in.get(ns, 0)
            for k, ns in namespaces.items()
            if lanes[k].max_running
        },
        held=len(watch.held),
        create_seconds=created - start,
        drain_seconds=drained - created,
        takeover=faults.get("takeover"),
        takeover_next_start=next_start,
        api_restart=faults.get("api_restart"),
        api_first_verdict=first_verdict,
        cpu={role: usage.cpu(role) for role in ("webhook", "reconciler")},
        rss_max=dict(usage.rss_max),
        requests=usage.requests,
        idle_requests_per_s=idle,
        left=left,
        lease_holders=[
            (lease.get("spec") or {}).get("holderIdentity")
            for lease in api.list("Lease", SYSTEM_NAMESPACE)
        ],
    )


def _left(api: Api, ns: str) -> list[str]:
    """Everything of ours and of the runs' left in a namespace: the fault tier's leftovers,
    and any PipelineRun (each was pruned after its verdict), pod or claim."""
    left = leftovers(api, ns)
    left += [f"PipelineRun {r['metadata']['name']}" for r in api.list("PipelineRun", ns)]
    left += [f"pod {p['metadata']['name']}" for p in api.list("Pod", ns)]
    left += [f"claim {c['metadata']['name']}" for c in api.list("PersistentVolumeClaim", ns)]
    return sorted(set(left))


def _progress(watch: LoadWatch, *, full: bool = False) -> str:
    with watch.lock:
        records = list(watch.records.items())
    pending = [k for k, r in records if r.finished is None]
    text = f"{len(records) - len(pending)}/{len(records)} done, broken {len(watch.broken)}"
    if full and pending:
        namespaces = sorted({k.split("/")[0] for k in pending})
        text += f"; not done: {pending[:20]}\n" + "\n".join(
            describe(watch.api, ns) for ns in namespaces
        )
    return text


def _restore(real: RealCluster) -> None:
    """The stack as it was: reconciler-a leads, alone."""
    product = real.product
    assert product is not None
    for name in list(product.reconcilers):
        if not product.reconcilers[name].alive() or name == SPARE:
            product.reconcilers.pop(name).stop()
    if "reconciler-a" not in product.reconcilers:
        product.start_reconciler("reconciler-a")


def delete_namespaces(api: Api, namespaces: dict[str, str]) -> None:
    for ns in namespaces.values():
        with contextlib.suppress(ApiError):
            api.delete("Namespace", ns)


# Figures ------------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def latency(outcome: Outcome, lanes: tuple[str, ...]) -> dict[str, dict[str, float]]:
    """Per figure (creation -> first pod Running, -> Succeeded): p50, p99 and the count, over
    the Succeeded runs of the given lanes."""
    out: dict[str, dict[str, float]] = {}
    for key, attribute in (("first_running", "first_running"), ("succeeded", "finished")):
        values = [
            at - r.created
            for r in outcome.records.values()
            if r.lane in lanes
            and r.verdict == ("True", "Succeeded")
            and (at := getattr(r, attribute)) is not None
        ]
        if values:
            out[key] = {
                "p50": statistics.median(values),
                "p99": percentile(values, 99),
                "max": max(values),
                "n": float(len(values)),
            }
    return out
