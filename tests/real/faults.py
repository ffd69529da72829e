"""What the fault tier (test_faults.py) and the load (test_load.py, bench/load.py) share: the
invariants checked all along by a thread (``Invariants``), the end state (``assert_clean``),
the processes' probes and metrics, and the faults themselves (``kill_leader``,
``restart_apiserver``)."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import ClassVar

import httpx

from coschedule.engines import TEKTON_STOPPING
from coschedule.marks import GATE_PLACEHOLDER
from tests.e2e.cluster import ControlPlane, Proc, wait_healthy
from tests.e2e.install import SYSTEM_NAMESPACE, Coschedule
from tests.e2e.kube import Api, Obj, wait_for
from tests.e2e.world import Ticker
from tests.real.runs import describe, done, succeeded
from tests.real.stack import RealCluster

PENDING = "PipelineRunPending"
GATED_BOUND = 90.0  # no pod held by our scheduling gate longer than this


@dataclass
class Invariants(Ticker):
    """Checked every ``interval`` seconds in the scenario's namespaces; what breaks is kept
    (the API server being away only skips a look): at most ``max_running`` runs started, not
    told to stop and not done per namespace (when given; ``limits`` gives a namespace its
    own); a run once cancelled never started or pending again, a run once started never
    pending again; at most one StatefulSet per run and one live placeholder pod per
    StatefulSet; every run's bound pods on one node; no pod behind our scheduling gate longer
    than ``GATED_BOUND``."""

    thread_name: ClassVar[str] = "invariants"
    api: Api
    namespaces: list[str]
    max_running: int | None = None
    limits: dict[str, int] = field(default_factory=dict)
    interval: float = field(default=0.5, kw_only=True)
    broken: list[str] = field(default_factory=list)
    most_running: int = 0
    most_running_in: dict[str, int] = field(default_factory=dict)
    gated_since: dict[str, float] = field(default_factory=dict)
    gated_last: dict[str, float] = field(default_factory=dict)
    stopped: set[str] = field(default_factory=set)
    started: set[str] = field(default_factory=set)
    looks: int = 0

    @property
    def longest_gated(self) -> float:
        """The longest any pod was seen behind our gate (first to last look)."""
        return max(
            (self.gated_last[k] - since for k, since in self.gated_since.items()), default=0.0
        )

    def fail(self, what: str) -> None:
        if what not in self.broken:
            self.broken.append(what)

    def step(self) -> None:
        for ns in self.namespaces:
            runs = self.api.list("PipelineRun", ns)
            pods = self.api.list("Pod", ns)
            sets = self.api.list("StatefulSet", ns)
            self.observe(ns, runs, pods, sets)
        self.looks += 1

    def observe(self, ns: str, runs: list[Obj], pods: list[Obj], sets: list[Obj]) -> None:
        limit = self.limits.get(ns, self.max_running)
        if limit is not None:
            # Started and not told to stop (a run being cancelled is stopping: Cancel
            # starts its successor while the engine ends it).
            running = [
                r["metadata"]["name"] for r in runs if not r["spec"].get("status") and is_running(r)
            ]
            self.most_running = max(self.most_running, len(running))
            self.most_running_in[ns] = max(self.most_running_in.get(ns, 0), len(running))
            if len(running) > limit:
                self.fail(f"{ns}: {len(running)} running at once: {sorted(running)}")
        for r in runs:
            key = f"{ns}/{r['metadata']['name']}"
            status = r["spec"].get("status")
            if status in TEKTON_STOPPING:
                self.stopped.add(key)
            elif key in self.stopped:
                self.fail(f"{key}: cancelled, then {status or 'started'} again")
            if not status and is_running(r):
                self.started.add(key)
            elif status == PENDING and key in self.started:
                self.fail(f"{key}: started, then pending again")
        names = [s["metadata"]["name"] for s in sets]
        if len(names) != len(set(names)):
            self.fail(f"{ns}: duplicate StatefulSets {names}")
        live_placeholders: dict[str, int] = {}
        nodes_of_run: dict[str, set[str]] = {}
        now = time.monotonic()
        for pod in pods:
            meta, spec = pod["metadata"], pod.get("spec") or {}
            labels = meta.get("labels") or {}
            instance = labels.get("app.kubernetes.io/instance", "")
            if labels.get("app.kubernetes.io/managed-by") == "coschedule" and instance:
                if not meta.get("deletionTimestamp"):
                    live_placeholders[instance] = live_placeholders.get(instance, 0) + 1
                continue
            run = labels.get("tekton.dev/pipelineRun")
            if run and spec.get("nodeName"):
                nodes_of_run.setdefault(run, set()).add(spec["nodeName"])
            key = f"{ns}/{meta['name']}/{meta.get('uid')}"
            gates = [g.get("name") for g in spec.get("schedulingGates") or []]
            if GATE_PLACEHOLDER in gates:
                since = self.gated_since.setdefault(key, now)
                self.gated_last[key] = now
                if now - since > GATED_BOUND:
                    self.fail(f"{ns}: pod {meta['name']} gated for over {GATED_BOUND:.0f} s")
        for instance, count in live_placeholders.items():
            if count > 1:
                self.fail(f"{ns}: {count} live placeholder pods of {instance}")
        for run, nodes in nodes_of_run.items():
            if len(nodes) > 1:
                self.fail(f"{ns}: run {run}'s pods on {sorted(nodes)}")


def is_running(run: Obj) -> bool:
    """Tekton says it runs (started, not done)."""
    return not done(run) and (succeeded(run) or {}).get("reason") == "Running"


@contextlib.contextmanager
def checked(
    api: Api, namespaces: list[str], max_running: int | None = None
) -> Iterator[Invariants]:
    invariants = Invariants(api, namespaces, max_running)
    invariants.start()
    try:
        yield invariants
    finally:
        invariants.stop()


def leftovers(api: Api, ns: str) -> list[str]:
    """What of ours is left in the namespace: StatefulSets, claims its templates made, gated
    pods, held runs and runs not terminal."""
    left = [f"StatefulSet {s['metadata']['name']}" for s in api.list("StatefulSet", ns)]
    left += [
        f"claim {c['metadata']['name']}"
        for c in api.list("PersistentVolumeClaim", ns)
        if c["metadata"]["name"].startswith("affinity-assistant-")
        or any(
            ref.get("kind") == "StatefulSet" for ref in c["metadata"].get("ownerReferences") or []
        )
    ]
    left += [
        f"gated pod {p['metadata']['name']}"
        for p in api.list("Pod", ns)
        if any(g.get("name") == GATE_PLACEHOLDER for g in p["spec"].get("schedulingGates") or [])
    ]
    for run in api.list("PipelineRun", ns):
        if run["spec"].get("status") == PENDING:
            left.append(f"held run {run['metadata']['name']}")
        if not done(run):
            left.append(f"run {run['metadata']['name']} not terminal")
    return left


def assert_clean(real: RealCluster, ns: str, timeout: float = 120) -> None:
    """Every run terminal, and nothing of ours left: no StatefulSet, no claim its templates
    made, no gated pod, no held run; the reconciler Lease has a holder."""
    api = real.api
    wait_for(
        "nothing of ours left behind",
        lambda: not leftovers(api, ns),
        timeout=timeout,
        describe=lambda: f"{leftovers(api, ns)}\n{describe(api, ns)}",
    )
    holders = [
        (lease.get("spec") or {}).get("holderIdentity")
        for lease in api.list("Lease", SYSTEM_NAMESPACE)
    ]
    assert holders, "no reconciler Lease"
    assert all(holders), f"a Lease without an owner: {holders}"


def metric_series(port: int, name: str) -> dict[str, float]:
    """Each series of the metric by its label set (the text between the braces)."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    pattern = "^" + re.escape(name) + r"(?:\{([^}]*)\})? (\S+)$"
    return {m.group(1) or "": float(m.group(2)) for m in re.finditer(pattern, text, re.MULTILINE)}


def readyz(port: int) -> tuple[int, str]:
    response = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5)
    return response.status_code, response.text


def health_port(proc: Proc) -> int:
    return int(proc.argv[proc.argv.index("--health-port") + 1])


# The faults ---------------------------------------------------------------------------------


@dataclass
class Takeover:
    killed: str
    leader: str
    seconds: float  # from the SIGKILL to the other replica holding the Lease


def kill_leader(product: Coschedule, timeout: float = 60) -> Takeover:
    """SIGKILL the replica holding the reconciler Lease (another must run) and wait for another
    to take the Lease over."""
    leader = product.leader()
    assert leader is not None, f"no leader: {product.leases()}"
    others = [n for n, p in product.reconcilers.items() if n != leader and p.alive()]
    assert others, "kill_leader needs a second replica running"
    product.reconcilers[leader].kill()
    killed = time.monotonic()
    wait_for(
        "another replica to take the Lease over",
        lambda: product.leader() in others,
        timeout=timeout,
        describe=lambda: str(product.leases()),
    )
    new = product.leader()
    assert new is not None
    return Takeover(leader, new, time.monotonic() - killed)


@dataclass
class ApiRestart:
    down_seconds: float  # SIGKILL to started again
    back_seconds: float  # started again to its /readyz answering 200
    fresh_seconds: float  # that to the reconciler's /readyz 200 (its caches fresh)
    starts: int = 1  # how many times it was started before it served


def restart_apiserver(
    plane: ControlPlane,
    reconciler_port: int,
    down: float = 14,
    while_down: Callable[[], None] | None = None,
) -> ApiRestart:
    """SIGKILL kube-apiserver, start it again ``down`` seconds later (``while_down`` is called
    meanwhile), and wait for it and for the reconciler's caches to be fresh again."""
    apiserver = plane.procs["kube-apiserver"]
    apiserver.kill()
    killed = time.monotonic()
    if while_down is not None:
        while_down()
    time.sleep(max(0.0, down - (time.monotonic() - killed)))
    apiserver.start()
    started = time.monotonic()
    assert plane.pki is not None
    # Started again as a kubelet restarts a static pod when it exits: on a CPU-starved machine
    # a fresh kube-apiserver can fail its own start (its RBAC bootstrap hook times out;
    # seen three times in a row at a load average of 29).
    starts = 1
    deadline = time.monotonic() + 600
    while True:
        try:
            wait_healthy(
                f"{plane.server}/readyz",
                apiserver,
                timeout=max(1.0, deadline - time.monotonic()),
                ca_file=plane.pki.ca_crt,
                headers={"Authorization": f"Bearer {plane.pki.admin_token}"},
            )
            break
        except RuntimeError:
            if apiserver.alive() or time.monotonic() > deadline:
                raise
            time.sleep(min(10.0 * starts, 30.0))  # the kubelet's restart back-off, shortened
            apiserver.start()
            starts += 1
    back = time.monotonic()
    wait_for(
        "the reconciler ready again",
        lambda: readyz(reconciler_port)[0] == 200,
        timeout=120,
        describe=lambda: readyz(reconciler_port)[1],
    )
    return ApiRestart(started - killed, back - started, time.monotonic() - back, starts)
