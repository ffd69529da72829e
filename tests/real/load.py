"""Sustained load with faults on the real stack: PipelineRuns created at a steady rate into
four namespaces ("lanes"), faults injected while they run (one at a time, each once the one
before recovered: the reconciler leader SIGKILLed, a node's machine gone, etcd paused, the
webhook SIGKILLed, kube-apiserver restarted), the fault tier's invariants checked all along,
and what a benchmark reports measured on the way. Used by tests/real/test_load.py
(a small load, ``make e2e-faults``) and bench/load.py (the full one, ``make bench-load``).

The lanes: ``off`` (coschedule not enabled: the webhook is not called; the latency
baseline), ``on`` (mode ``pipelineruns``, no ConcurrencyControl: the same runs with
coschedule), ``queue`` (``pipelineruns``, a ``Queue maxRunning: 2`` ConcurrencyControl) and
``wsqueue`` (``workspaces``, a ``Queue maxRunning: 2`` one); each gets three runs in a row
(``ORDER``). Each run has three tasks in sequence sharing one
volumeClaimTemplate workspace of the node-local class (write, append, check). A finished run
is deleted (as a pruner would) once recorded and once it is checked to have started each
task once, so the namespaces stay the size of what runs.

With a node fault in the plan, the runs' volumes are of the class every node mounts (a
node-local volume dies with its node: no run could go on elsewhere) and each task has
``retries: 1``: the node's kubelet and containerd are killed (the Node object left), the node
lifecycle controller marks it (tests/real/stack.py's settings: unreachable after 30 s), the
reconciler force-deletes the placeholders there and their StatefulSets make them again on a
live node; the operator then declares it out of service (non-graceful node shutdown), its pods
are deleted, Tekton fails the attempt that was running there and the task's retry runs where
the placeholder went. What is tolerated for a run that had pods there, and only for it: its
pods on that node besides the others' one node, a retried task, and (reported) a verdict
other than Succeeded. Then the node comes back.
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
from tests.e2e.test_outage import POLICY, RUNS_POLICY, gate_policy
from tests.e2e.world import (
    Ticker,
    make_namespace,
    unique,
    wait_webhook_sees,
    wait_webhook_sees_control,
)
from tests.real.faults import (
    NOT_BACK,
    PENDING,
    ApiRestart,
    Invariants,
    Takeover,
    declare_out_of_service,
    kill_leader,
    leftovers,
    node_back,
    node_down,
    node_ready,
    pause_etcd,
    readyz,
    restart_apiserver,
    undecided,
    wait_policies_active,
    webhook_up,
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


def load_run(ns: str, name: str, storage_class: str, sleep: int, retries: int = 0) -> Obj:
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
    if retries:
        for t in tasks:
            t["retries"] = retries
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
    retried: list[str] = field(default_factory=list)  # tasks that ran more than once


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
            record.retried = sorted(
                (tr["metadata"].get("labels") or {}).get("tekton.dev/pipelineTask", "?")
                for tr in taskruns
                if (tr.get("status") or {}).get("retriesStatus")
            )
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
    """When each fault comes, as a fraction of the creation period (None: not at all); one
    at a time, each once the one before recovered (so later than planned if one takes
    long). The API server restart last: it can leave kube-scheduler confused."""

    runs: int
    minutes: float
    sleep: int = 3  # the second task's sleep, seconds
    kill_leader_at: float | None = 0.1
    node_down_at: float | None = 0.2
    pause_etcd_at: float | None = 0.45
    kill_webhook_at: float | None = 0.6
    restart_apiserver_at: float | None = 0.75
    etcd_paused: float = 15.0
    webhook_down: float = 20.0
    drain_timeout: float = 600.0

    def no_faults(self) -> None:
        self.kill_leader_at = self.node_down_at = self.pause_etcd_at = None
        self.kill_webhook_at = self.restart_apiserver_at = None

    def schedule(self) -> list[tuple[float, str]]:
        planned = (
            (self.kill_leader_at, "leader"),
            (self.node_down_at, "node"),
            (self.pause_etcd_at, "etcd"),
            (self.kill_webhook_at, "webhook"),
            (self.restart_apiserver_at, "apiserver"),
        )
        return sorted((at, name) for at, name in planned if at is not None)


@dataclass
class NodeLoss:
    node: str
    runs: list[str]  # "ns/name" of the runs that had a pod there when it died
    marked_seconds: float  # killed -> Ready Unknown
    moved_seconds: float  # killed -> no placeholder of ours left there
    cleared_seconds: float  # killed -> declared out of service and no pod left there
    back_seconds: float  # its kubelet started again -> Ready


@dataclass
class WebhookKill:
    down_seconds: float  # SIGKILL -> the new process serving behind its readiness
    recovery_seconds: float  # back -> every pod gated and run held meanwhile decided
    marked_by_reconciler: int  # pods the reconciler marked in the webhook's place
    decided_by_reconciler: int  # held runs it decided


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
    etcd_recovery: float | None  # SIGCONT -> the reconciler ready and the API answering
    webhook_kill: WebhookKill | None
    node_loss: NodeLoss | None
    recoveries: dict[str, float]  # fault -> seconds to recover, as printed
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
    reconciler, ``reconciler-a``, leading; the webhook serving; every node up); the
    namespaces are deleted unless REAL_KEEP."""
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
    node_fault = plan.node_down_at is not None
    if node_fault:
        assert real.network_class is not None, "a node fault needs a class every node mounts"
    storage_class = real.network_class if node_fault and real.network_class else real.local_class
    retries = 1 if node_fault else 0

    def pids() -> dict[int, str]:
        out = {product.webhook.pid: "webhook"} if product.webhook is not None else {}
        out.update({p.pid: "reconciler" for p in product.reconcilers.values()})
        return out

    usage = Usage(api, pids)
    faults: dict[str, Any] = {}
    recoveries: dict[str, float] = {}
    fault_errors: list[str] = []
    period = plan.minutes * 60

    def inject() -> None:
        for at, name in plan.schedule():
            time.sleep(max(0.0, start + at * period - time.monotonic()))
            try:
                if name == "leader":
                    faults["leader_killed_at"] = time.monotonic()
                    faults["takeover"] = takeover = kill_leader(product)
                    recoveries["leader SIGKILL: another replica leads"] = takeover.seconds
                    log(f"fault: leader killed, {takeover}")
                elif name == "node":
                    faults["node_loss"] = loss = _lose_a_node(real, watch, namespaces, log)
                    recoveries["node down: its placeholders elsewhere, its pods gone"] = (
                        loss.cleared_seconds
                    )
                    log(f"fault: node down, {loss}")
                elif name == "etcd":
                    recoveries["etcd SIGSTOP 15 s: the reconciler ready after SIGCONT"] = faults[
                        "etcd_recovery"
                    ] = _pause_etcd(real, plan.etcd_paused)
                    log(f"fault: etcd paused, ready {faults['etcd_recovery']:.1f} s after")
                elif name == "webhook":
                    faults["webhook_kill"] = kill = _kill_webhook(
                        real, checked_ns, plan.webhook_down
                    )
                    recoveries["webhook SIGKILL: what it missed decided after it is back"] = (
                        kill.recovery_seconds
                    )
                    log(f"fault: webhook killed, {kill}")
                else:
                    port = product.reconciler_ports[product.leader() or "reconciler-a"]
                    restart = restart_apiserver(plane, port)
                    faults["api_restart"] = restart
                    faults["api_back_at"] = time.monotonic() - restart.fresh_seconds
                    recoveries["kube-apiserver restart: the reconciler fresh after it is back"] = (
                        restart.fresh_seconds
                    )
                    log(f"fault: API server restarted, {restart}")
            except Exception as exc:  # reported with the outcome; the next fault still comes
                fault_errors.append(f"{name}: {exc!r}")
                log(f"fault {name} did not go as planned: {exc!r}")

    with contextlib.ExitStack() as policies:
        if plan.kill_webhook_at is not None:
            # The shipped admission policies, which stand in for the webhook while it is away.
            # Seen active by a dry-run pod that the webhook keeps their mark on, which only a
            # ``pipelineruns`` namespace gives (in ``workspaces`` the probe has no claim and
            # the webhook clears the mark): those bound last, the API server loads the
            # others first (one watch, in order).
            by_mode = {ns: lanes[key].mode for key, ns in namespaces.items()}
            for ns in sorted(checked_ns, key=lambda n: by_mode[n] == "pipelineruns"):
                policies.enter_context(gate_policy(api, ns, POLICY))
                policies.enter_context(gate_policy(api, ns, RUNS_POLICY))
            wait_policies_active(api, [ns for ns in checked_ns if by_mode[ns] == "pipelineruns"])
        if plan.kill_leader_at is not None:
            assert product.start_reconciler(SPARE) is not None
        # What coschedule asks of the API server with nothing to do (Lease renewals, resyncs).
        before, idle_start = dispatched(api), time.monotonic()
        time.sleep(20)
        after = dispatched(api)
        idle = (after - before) / (time.monotonic() - idle_start) if before and after else 0.0

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
                _create(api, load_run(ns, name, storage_class, plan.sleep, retries), due + 600)
                with watch.lock:
                    watch.records[f"{ns}/{name}"] = Record(
                        key, time.monotonic(), create_wait=time.monotonic() - due
                    )
                if i % 20 == 0:
                    log(f"created {i + 1}/{plan.runs}; {_progress(watch)}")
            created = time.monotonic()
            injector.join(timeout=900)
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
    loss: NodeLoss | None = faults.get("node_loss")
    on_dead_node = set(loss.runs) if loss else set()
    for key, record in watch.records.items():
        if record.retried and key not in on_dead_node:
            watch.fail(f"{key}: {record.retried} retried, with no pod on a node that died")
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
    for what, seconds in recoveries.items():
        log(f"recovery: {what}: {seconds:.1f} s")
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
        etcd_recovery=faults.get("etcd_recovery"),
        webhook_kill=faults.get("webhook_kill"),
        node_loss=loss,
        recoveries=recoveries,
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


def _reconciler_ready(real: RealCluster) -> bool:
    product = real.product
    assert product is not None
    leader = product.leader()
    if leader is None or leader not in product.reconciler_ports:
        return False
    return readyz(product.reconciler_ports[leader])[0] == 200


def _pause_etcd(real: RealCluster, seconds: float) -> float:
    """etcd SIGSTOPped for ``seconds``: no coschedule process may exit; returns SIGCONT -> a
    reconciler leading with fresh caches and the API server answering a list."""
    product, plane = real.product, real.plane
    assert product is not None
    assert plane is not None
    procs = [p for p in (product.webhook, *product.reconcilers.values()) if p and p.alive()]
    pause_etcd(plane, seconds)
    resumed = time.monotonic()

    def ready() -> bool:
        with contextlib.suppress(httpx.HTTPError, ApiError):
            real.api.list("Namespace")
            return _reconciler_ready(real)
        return False

    wait_for("the reconciler ready after etcd's pause", ready, timeout=180, interval=0.5)
    recovery = time.monotonic() - resumed
    exited = [p.name for p in procs if not p.alive()]
    assert not exited, f"exited while etcd was paused: {exited}"
    return recovery


def _kill_webhook(real: RealCluster, namespaces: list[str], down: float) -> WebhookKill:
    """The webhook SIGKILLed for ``down`` s (the admission policies stand in), then back
    behind its readiness; waits for every pod gated and run held meanwhile to be decided."""
    product, api = real.product, real.api
    assert product is not None
    assert product.webhook is not None
    product.webhook.kill()
    killed = time.monotonic()
    try:
        time.sleep(down)
    finally:
        webhook_up(real)
    back = time.monotonic()
    missed = set(undecided(api, namespaces))
    wait_for(
        "what the webhook missed decided",
        lambda: not missed & set(undecided(api, namespaces)),
        timeout=120,
        interval=0.5,
        describe=lambda: str(sorted(missed & set(undecided(api, namespaces)))),
    )
    recovery = time.monotonic() - back

    def events(reason: str) -> int:
        return sum(
            1 for ns in namespaces for e in api.list("Event", ns) if e.get("reason") == reason
        )

    return WebhookKill(
        back - killed,
        recovery,
        events("MarkedWithoutWebhook"),
        events("AdmittedWithoutWebhook"),
    )


def _is_placeholder(pod: Obj) -> bool:
    labels = pod["metadata"].get("labels") or {}
    return labels.get("app.kubernetes.io/managed-by") == "coschedule"


def _pods_on(api: Api, namespaces: list[str], node: str) -> list[Obj]:
    return [
        p for ns in namespaces for p in api.list("Pod", ns, field_selector=f"spec.nodeName={node}")
    ]


def _run_of(pod: Obj) -> str | None:
    labels = pod["metadata"].get("labels") or {}
    run = labels.get("tekton.dev/pipelineRun")
    return f"{pod['metadata']['namespace']}/{run}" if run else None


def _lose_a_node(
    real: RealCluster, watch: LoadWatch, namespaces: dict[str, str], log: Callable[[str], None]
) -> NodeLoss:
    """The general node with the most placeholders of ours running dies (kubelet and
    containerd killed, the Node object left); once the reconciler moved its placeholders it
    is declared out of service, and once its pods are gone it comes back."""
    api = real.api
    every = list(namespaces.values())
    counts = {
        node: sum(1 for p in _pods_on(api, watch.namespaces, node) if _is_placeholder(p))
        for node in real.nodes
    }
    node = max(real.nodes, key=lambda n: counts[n])
    watch.dead[node] = NOT_BACK
    runs = {r for p in _pods_on(api, every, node) if (r := _run_of(p))}
    log(f"node {node} going down, placeholders per node {counts}, runs there {len(runs)}")
    started = time.monotonic()
    node_down(real, node)
    try:
        wait_for(
            f"node {node} marked Ready Unknown",
            lambda: node_ready(api, node) == "Unknown",
            timeout=120,
        )
        marked = time.monotonic() - started
        runs |= {r for p in _pods_on(api, every, node) if (r := _run_of(p))}
        wait_for(
            f"no placeholder of ours left on {node}",
            lambda: not [p for p in _pods_on(api, watch.namespaces, node) if _is_placeholder(p)],
            timeout=120,
            describe=lambda: str(
                [p["metadata"]["name"] for p in _pods_on(api, watch.namespaces, node)]
            ),
        )
        moved = time.monotonic() - started
        runs |= {r for p in _pods_on(api, every, node) if (r := _run_of(p))}
        declare_out_of_service(api, node)
        wait_for(
            f"no pod left on {node}",
            lambda: not _pods_on(api, every, node),
            timeout=180,
            describe=lambda: str([p["metadata"]["name"] for p in _pods_on(api, every, node)]),
        )
        cleared = time.monotonic() - started
    finally:
        rejoin = time.monotonic()
        node_back(real, node)
        wait_for(f"node {node} Ready again", lambda: node_ready(api, node) == "True", timeout=180)
        watch.dead[node] = time.time()
    return NodeLoss(node, sorted(runs), marked, moved, cleared, time.monotonic() - rejoin)


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
    """The stack as it was: reconciler-a leads, alone; the webhook serves."""
    webhook_up(real)
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
