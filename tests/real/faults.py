"""What the fault tier (test_faults.py, test_node_down.py) and the load (test_load.py,
bench/load.py) share: the invariants checked all along by a thread (``Invariants``), the end
state (``assert_clean``), the processes' probes and metrics, and the faults themselves
(``kill_leader``, ``restart_apiserver``, ``pause_etcd``, the webhook killed and brought back
behind its readiness by ``webhook_up``, a node's machine gone by ``node_down`` and back by
``node_back``)."""

from __future__ import annotations

import calendar
import contextlib
import math
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import ClassVar

import httpx

from coschedule.engines import TEKTON_STOPPING
from coschedule.marks import (
    ANNOTATION_HELD_BY,
    GATE_PLACEHOLDER,
    GATED_BY_POLICY,
    HELD_BY_POLICY,
    LABEL_GATED_BY,
)
from tests.e2e.cluster import ControlPlane, Proc, free_port, wait_healthy
from tests.e2e.install import SYSTEM_NAMESPACE, WEBHOOK_CONFIG_NAME, Coschedule
from tests.e2e.kube import Api, Obj, wait_for
from tests.e2e.world import Ticker
from tests.real.nodes import restore
from tests.real.runs import describe, done, succeeded
from tests.real.stack import NODES, RealCluster
from tests.real.test_outage import _dry_run_pod

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
    than ``GATED_BOUND``.

    A node that died (``dead``: node -> when it came back, epoch seconds, ``inf`` until then)
    legitimately leaves a run on two nodes: the pods it ran there before it died (a task done,
    or the attempt that was running, which Tekton fails once the node is declared out of
    service) and the ones on the node its placeholder moved to. Those pods alone are not
    counted; every other pod of the run must share one node."""

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
    dead: dict[str, float] = field(default_factory=dict)

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
            if run and spec.get("nodeName") and not self._from_before_death(pod):
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

    def _from_before_death(self, pod: Obj) -> bool:
        """On a node that died, made before it came back."""
        back = self.dead.get(pod["spec"].get("nodeName", ""))
        if back is None:
            return False
        created = pod["metadata"].get("creationTimestamp")
        return created is None or epoch(created) < back


def epoch(timestamp: str) -> float:
    """An RFC 3339 UTC timestamp as the API server writes them, in epoch seconds."""
    return float(calendar.timegm(time.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ")))


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


def pause_etcd(plane: ControlPlane, seconds: float = 15) -> None:
    """SIGSTOP etcd for ``seconds``, then SIGCONT."""
    etcd = plane.procs["etcd"]
    os.kill(etcd.pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        os.kill(etcd.pid, signal.SIGCONT)


def webhook_up(real: RealCluster) -> None:
    """The webhook serving again (after a failure left it dead), for the later scenarios.

    As a cluster's Service does, no API server call reaches it before its readiness passes:
    registered by URL here, the new process listens on a port of its own and the webhook
    configuration is pointed at it once ``/readyz`` says its caches are read. (On the old
    port it was called during its first second, before its namespace cache was read, and
    decided a pipelineruns namespace's pod with the cluster's mode.)"""
    product, plane = real.product, real.plane
    old = product.webhook if product is not None else None
    if product is None or plane is None or not old or old.alive():
        return
    port = free_port()
    argv = list(old.argv)
    argv[argv.index("--port") + 1] = str(port)
    webhook = Proc(old.name, argv, old.log_path, env=old.env, cwd=old.cwd).start()
    health = argv[argv.index("--health-port") + 1]
    wait_healthy(f"http://127.0.0.1:{health}/readyz", webhook, timeout=60)
    config = real.api.must_get("MutatingWebhookConfiguration", WEBHOOK_CONFIG_NAME)
    ops = [
        {
            "op": "replace",
            "path": f"/webhooks/{index}/clientConfig/url",
            "value": re.sub(r":\d+/", f":{port}/", hook["clientConfig"]["url"], count=1),
        }
        for index, hook in enumerate(config["webhooks"])
    ]
    real.api.patch("MutatingWebhookConfiguration", WEBHOOK_CONFIG_NAME, ops,
                   patch_type="application/json-patch+json")  # fmt: skip
    product.webhook = plane.procs["coschedule-serve"] = webhook
    product.webhook_port = port


def wait_policies_active(api: Api, namespaces: list[str]) -> None:
    """Wait for the admission policies bound to the namespaces to be active: a dry-run TaskRun
    pod comes back with the policy's label (the webhook keeps it on a pod it pins by node
    name)."""
    wait_for(
        "the admission policies to be active",
        lambda: all(
            (api.create(_dry_run_pod(ns), dry_run=True)["metadata"].get("labels") or {}).get(
                LABEL_GATED_BY
            )
            == GATED_BY_POLICY
            for ns in namespaces
        ),
        timeout=60,
    )


def undecided(api: Api, namespaces: list[str]) -> list[str]:
    """Pods behind our gate and runs the admission policy held that nobody decided on yet."""
    out = []
    for ns in namespaces:
        out += [
            f"{ns}/pod {p['metadata']['name']} gated"
            for p in api.list("Pod", ns)
            if any(
                g.get("name") == GATE_PLACEHOLDER for g in p["spec"].get("schedulingGates") or []
            )
        ]
        out += [
            f"{ns}/run {r['metadata']['name']} held by the policy"
            for r in api.list("PipelineRun", ns)
            if (r["metadata"].get("annotations") or {}).get(ANNOTATION_HELD_BY) == HELD_BY_POLICY
        ]
    return out


# A dead node (realstack ``node down``) and Kubernetes' non-graceful node shutdown: the taint
# an operator puts on a node that is shut down for good, after which its pods are deleted
# (the attempt that ran there fails; a task's ``retries`` run it again).
OUT_OF_SERVICE = {
    "key": "node.kubernetes.io/out-of-service",
    "value": "nodeshutdown",
    "effect": "NoExecute",
}


def node_ready(api: Api, node: str) -> str:
    """The node's Ready condition status ("True", "False", "Unknown"; "" without one)."""
    for cond in (api.must_get("Node", node).get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return str(cond.get("status"))
    return ""


def node_down(real: RealCluster, node: str) -> None:
    """realstack ``node down``, keeping the Node object (``DELETE_NODE=0``): what a dead
    machine leaves behind until a cloud controller or a person deletes it."""
    assert real.stack is not None
    subprocess.run(
        [real.stack.script, "node", "down", str(real.stack.workdir), node],
        env={**os.environ, "DELETE_NODE": "0"},
        check=True,
        capture_output=True,
        timeout=120,
    )


def declare_out_of_service(api: Api, node: str) -> None:
    """The operator's step for a node that is shut down for good (non-graceful shutdown)."""
    taints = api.must_get("Node", node)["spec"].get("taints") or []
    api.patch("Node", node, {"spec": {"taints": [*taints, OUT_OF_SERVICE]}})


def node_back(real: RealCluster, node: str) -> None:
    """The machine back: the operator lifts out-of-service, the node rejoins."""
    api = real.api
    taints = api.must_get("Node", node)["spec"].get("taints") or []
    kept = [t for t in taints if t.get("key") != OUT_OF_SERVICE["key"]]
    api.patch("Node", node, {"spec": {"taints": kept or None}})
    real.stack.add_node(node, **NODES[node])
    restore(api, node)


NOT_BACK = math.inf  # Invariants.dead: the node has not come back
