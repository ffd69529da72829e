"""The fault tier (``make e2e-faults``): faults injected into live PipelineRuns on the real
stack, with the invariants checked all along by a thread (``Invariants``), not only at the
end, and each fault ending with every run terminal and nothing of ours left behind.

- kube-apiserver killed (SIGKILL) while a run is in its second task, back 14 s later: while
  it is away both processes' /readyz name their stale caches (the reconciler 503, the webhook
  200); the watches resume with at most one relist per cache, no placeholder is made twice,
  the run Succeeds;
- etcd paused (SIGSTOP) for 15 s mid-run: no process exits, nothing acted on stale state,
  the run Succeeds;
- the reconciler leader killed (SIGKILL) while a ``maxRunning: 2`` group holds runs, for
  ``Queue``, ``Replace`` and ``Cancel``: a second replica takes over; never more than 2
  running, none started twice, a cancelled run cancelled once and never started again, the
  newest Succeeded (every run, in order of creation, for ``Queue``);
- the webhook killed (SIGKILL) while runs arrive, away 45 s: the shipped admission policies
  gate pods and hold runs, the reconciler decides on them; nothing refused, no run fails,
  every run on one node, every gate lifted and held run decided soon after it is back;
- a node dies under a running task: tests/real/test_node_down.py (make e2e-real).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

import pytest

from coschedule.engines import TEKTON_STOPPING
from coschedule.marks import ANNOTATION_HELD_BY
from tests.e2e.cluster import wait_healthy
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
    assert_clean,
    checked,
    health_port,
    is_running,
    metric_series,
    readyz,
    undecided,
    wait_policies_active,
    webhook_up,
)
from tests.real.runs import (
    assert_succeeded,
    claim_template,
    describe,
    done,
    pipeline_run,
    succeeded,
    task,
    task_pods,
    verdict,
    wait_runs,
)
from tests.real.stack import RealCluster

pytestmark = pytest.mark.faults


def _in_task(api: Api, ns: str, run: str, name: str) -> bool:
    pod = task_pods(api, ns, run).get(name)
    return bool(pod) and (pod or {}).get("status", {}).get("phase") == "Running"


def three_tasks(ns: str, run: str, storage_class: str) -> Obj:
    tasks = [
        task("one", "echo one > $(workspaces.ws.path)/f\nsleep 5\n", ["ws"]),
        task("two", "sleep 25\necho two >> $(workspaces.ws.path)/f\n", ["ws"], run_after=["one"]),
        task("three", "grep -qx two $(workspaces.ws.path)/f\n", ["ws"], run_after=["two"]),
    ]
    return pipeline_run(
        ns, run, tasks, {"ws": {"volumeClaimTemplate": claim_template(storage_class)}}
    )


def _sets(api: Api, ns: str) -> dict[str, str]:
    return {s["metadata"]["name"]: s["metadata"]["uid"] for s in api.list("StatefulSet", ns)}


def test_etcd_paused_mid_run(real: RealCluster, namespace: Callable[..., str]) -> None:
    real.require("own-stack")
    assert real.plane is not None
    assert real.product is not None
    plane, product = real.plane, real.product
    api = real.api
    ns = namespace("pipelineruns", prefix="etcd")
    run = "etcd-pause"
    procs = [product.webhook, *product.reconcilers.values()]
    with checked(api, [ns]) as invariants:
        api.create(three_tasks(ns, run, real.local_class))
        wait_for(
            "the first task to run",
            lambda: _in_task(api, ns, run, "one"),
            timeout=180,
            describe=lambda: describe(api, ns),
        )
        before = _sets(api, ns)
        etcd = plane.procs["etcd"]
        os.kill(etcd.pid, signal.SIGSTOP)
        try:
            time.sleep(15)
        finally:
            os.kill(etcd.pid, signal.SIGCONT)
        runs = wait_runs(api, ns, [run], timeout=300)
        after = _sets(api, ns) or before
    assert all(p is not None and p.alive() for p in procs), "a coschedule process exited"
    assert_succeeded(runs, api, ns, run)
    assert after == before, f"placeholder made again: {before} -> {after}"
    assert not invariants.broken, invariants.broken
    assert_clean(real, ns)


QUEUE_RUNS = int(os.environ.get("COSCHEDULE_FAULTS_QUEUE_RUNS", "12"))


@dataclass(frozen=True)
class Contended:
    """How a ``maxRunning: 2`` group of ``QUEUE_RUNS`` one-task runs is driven through a
    leader kill: ``before`` of them created before the kill (the rest while no replica
    leads), each run's task ``seconds`` long; the leader is killed once two runs are done and
    ``running`` run."""

    strategy: str
    before: int
    seconds: int
    running: int = 0


CONTENDED = [
    # The queue full when the leader goes: 10 still waiting.
    Contended("Queue", QUEUE_RUNS, 4),
    # Half while the leader lives, half while none does: the new leader supersedes them.
    Contended("Replace", QUEUE_RUNS // 2, 4),
    # Long runs: the two the old leader kept still run when newer ones arrive leaderless, and
    # the new leader cancels them.
    Contended("Cancel", QUEUE_RUNS // 2, 30, running=2),
]


def _cancel_events(api: Api, ns: str) -> dict[str, int]:
    """The reconciler's ``Cancelled`` Events by run."""
    counts: dict[str, int] = {}
    for event in api.list("Event", ns):
        ours = (event.get("source") or {}).get("component") == "coschedule-reconciler"
        if ours and event.get("reason") == "Cancelled":
            name = event["involvedObject"]["name"]
            counts[name] = counts.get(name, 0) + int(event.get("count") or 1)
    return counts


@pytest.mark.parametrize("case", CONTENDED, ids=lambda c: c.strategy)
def test_leader_killed_with_a_contended_group(real: RealCluster, case: Contended) -> None:
    """Two replicas; the leader SIGKILLed while a ``maxRunning: 2`` group holds runs: the
    other takes the Lease over when it expires, and the group goes on as if nothing
    happened: never more than 2 running, no run started twice, a cancelled run cancelled once
    and never started again, the newest Succeeded."""
    real.require("own-stack")
    assert real.product is not None
    product = real.product
    api = real.api
    ns = unique(f"real-{case.strategy.lower()}-ha")
    # Mode pipelineruns: each run's placeholder goes when the run is done (in workspaces
    # mode a claim's placeholder waits out the idle grace: its claim outlives the run).
    make_namespace(api, ns, "pipelineruns")
    wait_webhook_sees(api, ns, "pipelineruns")
    control = {
        "apiVersion": "coschedule.dev/v1alpha1",
        "kind": "ConcurrencyControl",
        "metadata": {"name": "two", "namespace": ns},
        "spec": {
            "selector": {},
            "kinds": ["PipelineRun"],
            "strategy": case.strategy,
            "maxRunning": 2,
        },
    }
    api.create(control)

    def one_task(name: str, seconds: int) -> Obj:
        tasks = [task("work", f"sleep {seconds}\n", ["ws"])]
        return pipeline_run(
            ns, name, tasks, {"ws": {"volumeClaimTemplate": claim_template(real.local_class)}}
        )

    wait_webhook_sees_control(api, ns, "two", one_task("probe", 1))
    spare = "reconciler-b"
    try:
        assert product.start_reconciler(spare) is not None
        names = [f"q{i:02d}" for i in range(QUEUE_RUNS)]
        with checked(api, [ns], max_running=2) as invariants:
            for name in names[: case.before]:
                api.create(one_task(name, case.seconds))

            def ready_to_kill() -> bool:
                runs = api.list("PipelineRun", ns)
                running = [r for r in runs if not r["spec"].get("status") and is_running(r)]
                return sum(done(r) for r in runs) >= 2 and len(running) >= case.running

            wait_for(
                f"two runs done and {case.running} running",
                ready_to_kill,
                timeout=240,
                describe=lambda: describe(api, ns),
            )
            leader = product.leader()
            assert leader is not None
            product.reconcilers[leader].kill()
            killed = time.monotonic()
            # What the dead leader cancelled (its Event may have died with it).
            cancelled_before = {
                r["metadata"]["name"]
                for r in api.list("PipelineRun", ns)
                if r["spec"].get("status") in TEKTON_STOPPING
            }
            for name in names[case.before :]:
                api.create(one_task(name, case.seconds))
            other = next(n for n in product.reconcilers if n != leader)
            wait_for(
                f"{other} to take the Lease over",
                lambda: product.leader() == other,
                timeout=60,
                describe=lambda: str(product.leases()),
            )
            takeover = time.monotonic() - killed
            runs = wait_runs(api, ns, names, timeout=600)
        real.notes.append(f"leader killed ({case.strategy}): {other} led {takeover:.1f} s later")
        assert not invariants.broken, invariants.broken
        assert invariants.most_running == 2, invariants.most_running
        taskruns = {name: 0 for name in names}
        for t in api.list("TaskRun", ns):
            run = (t["metadata"].get("labels") or {}).get("tekton.dev/pipelineRun", "")
            if run in taskruns:
                taskruns[run] += 1
        ran = {n for n in names if taskruns[n]}
        assert all(taskruns[n] <= 1 for n in names), f"started more than once: {taskruns}"
        cancelled = {n for n in names if runs[n]["spec"].get("status") in TEKTON_STOPPING}
        events = _cancel_events(api, ns)
        # Cancelled once: one Event each (the dead leader may have died between its patch
        # and its Event), none for a run not cancelled.
        assert all(events.get(n, 0) <= 1 for n in names), f"cancelled twice: {events}"
        assert set(events) <= cancelled, (events, cancelled)
        assert cancelled - cancelled_before <= set(events), (events, cancelled)
        for name in names:
            want = ("False", "Cancelled") if name in cancelled else ("True", "Succeeded")
            assert verdict(runs[name]) == want, (name, succeeded(runs[name]), describe(api, ns))
        # The newest ends Succeeded (Cancel keeps the 2 newest).
        newest = names[-2:] if case.strategy == "Cancel" else names[-1:]
        assert not cancelled & set(newest), (newest, cancelled)
        if case.strategy == "Queue":
            assert not cancelled, cancelled
            # In order of creation (two start at once: neighbours may swap within a second).
            starts = sorted(names, key=lambda n: runs[n]["status"]["startTime"])
            assert all(abs(starts.index(n) - i) <= 1 for i, n in enumerate(names)), starts
        elif case.strategy == "Replace":
            # A running run is never cancelled: what Replace cancels never ran.
            assert not cancelled & ran, f"cancelled after starting: {sorted(cancelled & ran)}"
            assert cancelled, "nothing superseded"
        else:
            # Cancel: the dead leader's two survivors were still running when the newer
            # runs came; the new leader cancelled them.
            assert cancelled & ran - cancelled_before, (cancelled, ran, cancelled_before)
        real.notes.append(
            f"leader killed ({case.strategy}): {len(names) - len(cancelled)} Succeeded, "
            f"{len(cancelled)} cancelled ({len(cancelled & ran)} while running)"
        )
        assert_clean(real, ns)
    finally:
        # The stack as it was: reconciler-a leads, alone.
        for name in list(product.reconcilers):
            if not product.reconcilers[name].alive() or name == spare:
                product.reconcilers.pop(name).stop()
        if "reconciler-a" not in product.reconcilers:
            product.start_reconciler("reconciler-a")
        if not os.environ.get("REAL_KEEP"):
            with contextlib.suppress(ApiError):
                api.delete("Namespace", ns)


WEBHOOK_DOWN = 45.0  # seconds without a webhook: several runs' pods are created in it
RECOVERY_BOUND = 60.0  # every gate lifted, every held run decided, this long after it is back


@dataclass(kw_only=True)
class Arrivals(Ticker):
    """A PipelineRun created every ``interval`` seconds, in each namespace in turn; what the
    API server refuses is kept."""

    thread_name: ClassVar[str] = "arrivals"
    api: Api
    namespaces: list[str]
    make: Callable[[str, str], Obj]
    interval: float = 4.0
    created: list[tuple[str, str]] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)

    def step(self) -> None:
        count = len(self.created) + len(self.refused)
        ns, name = self.namespaces[count % len(self.namespaces)], f"w{count:02d}"
        try:
            self.api.create(self.make(ns, name))
        except ApiError as exc:
            self.refused.append(f"{ns}/{name}: {exc}")
        else:
            self.created.append((ns, name))


def test_webhook_killed_while_runs_are_admitted(
    real: RealCluster, namespace: Callable[..., str]
) -> None:
    """The webhook SIGKILLed while PipelineRuns arrive every few seconds (in a namespace
    without a control and in one with a ``Queue maxRunning: 2``), away for
    ``WEBHOOK_DOWN`` s, then started again; the shipped admission policies (bound to the two
    namespaces) gate pods and hold runs meanwhile, the reconciler decides on them: nothing is
    refused, no run fails, every run's pods on one node, the queue's limit holds, and every
    gate is lifted and every held run decided within ``RECOVERY_BOUND`` s of the webhook's
    return."""
    real.require("own-stack")
    product = real.product
    assert product is not None
    assert product.webhook is not None
    api = real.api
    plain = namespace("pipelineruns", prefix="webhook-kill")
    queued = namespace("pipelineruns", prefix="webhook-kill-queue")
    spaces = [plain, queued]

    def two_tasks(ns: str, name: str) -> Obj:
        tasks = [
            task("one", "echo one > $(workspaces.ws.path)/f\nsleep 3\n", ["ws"]),
            task("two", "grep -qx one $(workspaces.ws.path)/f\n", ["ws"], run_after=["one"]),
        ]
        return pipeline_run(
            ns, name, tasks, {"ws": {"volumeClaimTemplate": claim_template(real.local_class)}}
        )

    api.create(
        {
            "apiVersion": "coschedule.dev/v1alpha1",
            "kind": "ConcurrencyControl",
            "metadata": {"name": "two", "namespace": queued},
            "spec": {"selector": {}, "strategy": "Queue", "maxRunning": 2},
        }
    )
    wait_webhook_sees_control(api, queued, "two", two_tasks(queued, "probe"))
    arrivals = Arrivals(api=api, namespaces=spaces, make=two_tasks)
    with contextlib.ExitStack() as stack:
        for ns in spaces:
            stack.enter_context(gate_policy(api, ns, POLICY))
            stack.enter_context(gate_policy(api, ns, RUNS_POLICY))
        wait_policies_active(api, spaces)
        invariants = stack.enter_context(checked(api, spaces))
        invariants_queue = stack.enter_context(checked(api, [queued], max_running=2))
        arrivals.start()
        stack.callback(arrivals.stop)
        stack.callback(webhook_up, real)
        time.sleep(2.5 * arrivals.interval)
        product.webhook.kill()
        down = time.monotonic()
        time.sleep(WEBHOOK_DOWN)
        # Arrivals end as it comes back: registered by URL here, it is called before it is
        # ready (and refuses runs until it has read the ConcurrencyControls), where a
        # cluster's Service sends it nothing until its readiness probe passes.
        arrivals.stop()
        webhook_up(real)
        back = time.monotonic()
        outage = back - down
        wait_for(
            "every gate lifted and every held run decided",
            lambda: not undecided(api, spaces),
            timeout=RECOVERY_BOUND,
            describe=lambda: "\n".join(undecided(api, spaces)),
        )
        recovery = time.monotonic() - back
        # Admitted by the webhook again: a run in each namespace, decided at admission.
        after = {ns: api.create(two_tasks(ns, "after")) for ns in spaces}
        runs = {ns: {n for s, n in arrivals.created if s == ns} | {"after"} for ns in spaces}
        verdicts = {ns: wait_runs(api, ns, sorted(runs[ns]), timeout=600) for ns in spaces}
    marked_by_reconciler = [
        e["involvedObject"]["name"]
        for ns in spaces
        for e in api.list("Event", ns)
        if e.get("reason") == "MarkedWithoutWebhook"
    ]
    decided_by_reconciler = [
        e["involvedObject"]["name"]
        for e in api.list("Event", queued)
        if e.get("reason") == "AdmittedWithoutWebhook"
    ]
    real.notes.append(
        f"webhook killed for {outage:.0f} s: {len(arrivals.created)} runs created "
        f"({len(arrivals.refused)} refused), {len(marked_by_reconciler)} pods marked and "
        f"{len(decided_by_reconciler)} runs decided by the reconciler; nothing gated or held "
        f"{recovery:.1f} s after it was back; longest gate {invariants.longest_gated:.1f} s"
    )
    assert arrivals.refused == [], arrivals.refused
    assert not arrivals.errors, arrivals.errors
    for ns in spaces:
        assert_succeeded(verdicts[ns], api, ns, *sorted(runs[ns]))
        for run in runs[ns]:
            nodes = {p["spec"]["nodeName"] for p in task_pods(api, ns, run).values()}
            assert len(nodes) == 1, f"{run} ran on {nodes}\n{describe(api, ns)}"
    # Pods were made while no webhook answered, and runs held by the policy: the reconciler
    # took its place.
    assert marked_by_reconciler, "no pod created in the outage"
    assert decided_by_reconciler, "no run created in the outage"
    # Back: the webhook decides at admission (no policy mark left on the new run, and its
    # pods are not marked by the reconciler).
    for ns, stored in after.items():
        assert (stored["metadata"].get("annotations") or {}).get(ANNOTATION_HELD_BY) is None, ns
    assert not any(name.startswith("after-") for name in marked_by_reconciler)
    assert not invariants.broken, invariants.broken
    assert not invariants_queue.broken, invariants_queue.broken
    for ns in spaces:
        assert_clean(real, ns)


# Last: a control plane restarted under it can leave kube-scheduler (run here without leader
# election, so nothing restarts it) confused for later scenarios.
def test_apiserver_killed_in_the_second_task(
    real: RealCluster, namespace: Callable[..., str]
) -> None:
    real.require("own-stack")
    assert real.plane is not None
    assert real.product is not None
    webhook = real.product.webhook
    assert webhook is not None
    plane, product = real.plane, real.product
    api = real.api
    ns = namespace("pipelineruns", prefix="apiserver")
    run = "api-restart"
    [leader] = list(product.reconcilers)
    reconciler_port = product.reconciler_ports[leader]
    webhook_port = health_port(webhook)
    relists_before = metric_series(reconciler_port, "coschedule_watch_relists_total")
    with checked(api, [ns]) as invariants:
        api.create(three_tasks(ns, run, real.local_class))
        wait_for(
            "the second task to run",
            lambda: _in_task(api, ns, run, "two"),
            timeout=180,
            describe=lambda: describe(api, ns),
        )
        before = _sets(api, ns)
        apiserver = plane.procs["kube-apiserver"]
        apiserver.kill()
        down = time.monotonic()
        # While it is away: both say their caches are stale after 10 s without word.
        time.sleep(12)
        reconciler_says = readyz(reconciler_port)
        webhook_says = readyz(webhook_port)
        time.sleep(max(0.0, 14 - (time.monotonic() - down)))
        apiserver.start()
        assert plane.pki is not None
        wait_healthy(
            f"{plane.server}/readyz",
            apiserver,
            timeout=90,
            ca_file=plane.pki.ca_crt,
            headers={"Authorization": f"Bearer {plane.pki.admin_token}"},
        )
        back = time.monotonic()
        wait_for(
            "the reconciler ready again",
            lambda: readyz(reconciler_port)[0] == 200,
            timeout=60,
            describe=lambda: readyz(reconciler_port)[1],
        )
        fresh = time.monotonic() - back
        runs = wait_runs(api, ns, [run], timeout=300)
        after = _sets(api, ns) or before
    real.notes.append(f"apiserver restart: reconciler caches fresh {fresh:.1f} s after it")
    assert reconciler_says[0] == 503, reconciler_says
    assert "caches stale" in reconciler_says[1], reconciler_says
    assert webhook_says[0] == 200, webhook_says
    assert "caches stale" in webhook_says[1], webhook_says
    assert_succeeded(runs, api, ns, run)
    assert after == before, f"placeholder made again: {before} -> {after}"
    relists = {
        cache: count - relists_before.get(cache, 0.0)
        for cache, count in metric_series(reconciler_port, "coschedule_watch_relists_total").items()
    }
    # No relist storm: at most one full list per watch-fed cache after the restart.
    assert all(n <= 1 for n in relists.values()), f"relists after one restart: {relists}"
    assert not invariants.broken, invariants.broken
    assert len({p["spec"]["nodeName"] for p in task_pods(api, ns, run).values()}) == 1
    assert_clean(real, ns)
