"""Run concurrency control (docs/concurrency.md) with real PipelineRuns: Tekton's own verdict
for every run. Each strategy has its own namespace; all start together."""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

import pytest

from coschedule.cli.main import main
from coschedule.marks import ANNOTATION_RUN_ADMITTED
from tests.e2e.kube import Api, ApiError, Obj, wait_for
from tests.e2e.world import make_namespace, run_events, unique, wait_webhook_sees_control
from tests.real.runs import (
    assert_succeeded,
    claim_template,
    describe,
    pipeline_run,
    task,
    task_pods,
    verdict,
    wait_runs,
)
from tests.real.stack import RealCluster

PENDING = "PipelineRunPending"
PENDING_BY = "coschedule.dev/pending-by"
WAITING = "coschedule.dev/waiting"
# Strategy -> (control name, extra spec): the key names what the held runs' reasons say.
CONTROLS: dict[str, tuple[str, Obj]] = {
    "Cancel": ("cancel", {"strategy": "Cancel", "key": ""}),
    "GracefullyCancel": ("gracefullycancel", {"strategy": "GracefullyCancel", "key": ""}),
    "Queue": ("queue", {"strategy": "Queue", "maxRunning": 1, "key": ""}),
    "Replace": ("replace", {"strategy": "Replace", "maxRunning": 1, "key": "preview"}),
    "Newest": ("newest", {"strategy": "Queue", "order": "newest-first", "key": "line"}),
}
# How long the first run of Replace and of newest-first works: long enough for the later
# runs to be held, and for the held runs' reasons to be read and explained, while it runs.
FIRST_SECONDS = {"Replace": 25, "Newest": 45}


def _control(namespace: str, strategy: str) -> Obj:
    name, spec = CONTROLS[strategy]
    return {
        "apiVersion": "coschedule.dev/v1alpha1",
        "kind": "ConcurrencyControl",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"selector": {}, "kinds": ["PipelineRun"], **spec},
    }


def _run(
    namespace: str,
    name: str,
    seconds: int,
    storage_class: str,
    *,
    status: str | None = None,
    labels: dict[str, str] | None = None,
) -> Obj:
    """``work`` sleeps; the finally task ``cleanup`` says it ran. (Not what work wrote: a run
    cancelled while its step's entrypoint still waits to start has written nothing.)"""
    tasks = [task("work", f"echo {name} > $(workspaces.ws.path)/w\nsleep {seconds}\n", ["ws"])]
    finally_ = [task("cleanup", "echo cleanup of $(context.pipelineRun.name)\n", ["ws"])]
    return pipeline_run(
        namespace,
        name,
        tasks,
        {"ws": {"volumeClaimTemplate": claim_template(storage_class)}},
        finally_=finally_,
        status=status,
        labels=labels,
    )


def _work_running(api: Api, namespace: str, run: str) -> bool:
    pod = task_pods(api, namespace, run).get("work")
    return bool(pod) and (pod or {}).get("status", {}).get("phase") == "Running"


def _held_by_us(api: Api, namespace: str, run: str) -> bool:
    obj = api.must_get("PipelineRun", run, namespace)
    ours = (obj["metadata"].get("annotations") or {}).get(PENDING_BY) == "concurrency"
    return ours and obj["spec"].get("status") == PENDING


def _wait_running(api: Api, strategy: str, namespace: str, run: str) -> None:
    wait_for(
        f"{strategy}: {run}'s task to run",
        functools.partial(_work_running, api, namespace, run),
        timeout=120,
        describe=functools.partial(describe, api, namespace),
    )


@dataclass
class Groups:
    namespaces: dict[str, str]  # strategy -> namespace


@pytest.fixture(scope="module")
def groups(real: RealCluster) -> Iterator[Groups]:
    """Cancel and GracefullyCancel: an old run, running, then a newer one; Queue: three runs
    and one its author created pending."""
    api = real.api
    namespaces: dict[str, str] = {}
    for strategy in CONTROLS:
        ns = unique(f"real-{strategy.lower()}")
        make_namespace(api, ns, None)
        api.create(_control(ns, strategy))
        namespaces[strategy] = ns
    for strategy in CONTROLS:  # a run created before the webhook sees its control is free
        probe = _run(namespaces[strategy], "probe", 1, real.local_class)
        wait_webhook_sees_control(api, namespaces[strategy], CONTROLS[strategy][0], probe)
    for strategy in ("Cancel", "GracefullyCancel"):
        api.create(_run(namespaces[strategy], "old", 120, real.local_class))
    queue = namespaces["Queue"]
    for index in range(3):
        api.create(_run(queue, f"q{index}", 2, real.local_class))
    api.create(_run(queue, "held", 1, real.local_class, status=PENDING))
    for strategy, first in (("Replace", "r1"), ("Newest", "n0")):
        api.create(_run(namespaces[strategy], first, FIRST_SECONDS[strategy], real.local_class))
    for strategy in ("Cancel", "GracefullyCancel"):
        _wait_running(api, strategy, namespaces[strategy], "old")
        api.create(_run(namespaces[strategy], "new", 1, real.local_class))
    # Replace: r2 waits behind r1; r3 then replaces it.
    replace = namespaces["Replace"]
    _wait_running(api, "Replace", replace, "r1")
    api.create(_run(replace, "r2", 1, real.local_class))
    wait_for(
        "Replace: r2 held",
        functools.partial(_held_by_us, api, replace, "r2"),
        timeout=30,
        describe=functools.partial(describe, api, replace),
    )
    api.create(_run(replace, "r3", 1, real.local_class))
    # Queue newest-first: three runs wait behind n0; the newest goes first.
    newest = namespaces["Newest"]
    _wait_running(api, "Newest", newest, "n0")
    for name in NEWEST_WAITING:
        api.create(_run(newest, name, 1, real.local_class))
    yield Groups(namespaces)
    if os.environ.get("REAL_KEEP"):
        return
    for ns in namespaces.values():
        with contextlib.suppress(ApiError):
            api.delete("Namespace", ns)


NEWEST_WAITING = ("n1", "n2", "n3")


def test_held_runs_say_why_they_wait_and_explain_agrees(
    real: RealCluster, groups: Groups, capsys: pytest.CaptureFixture[str]
) -> None:
    """Queue newest-first, while n0 runs: each held run carries the `coschedule.dev/waiting`
    annotation naming its place and the run ahead, and one Waiting Event per reason it had
    (n1 moved back as n2 and n3 arrived), one of them saying what the annotation says;
    `coschedule explain --run pipelinerun/n1 --kubeconfig K` on the live run says why it
    waits. (First in this module: n0 must still run.)"""
    api = real.api
    ns = groups.namespaces["Newest"]
    line = "of ConcurrencyControl newest"
    want = {
        "n3": f"waiting: 2nd in queue for key line {line}, behind n0, which is running",
        "n2": f"waiting: 3rd in queue for key line {line}, behind n3, which is waiting",
        "n1": f"waiting: 4th in queue for key line {line}, behind n2, which is waiting",
    }
    want = {name: f"{text} (1 may run at once)" for name, text in want.items()}

    def said() -> dict[str, str]:
        return {
            name: (api.must_get("PipelineRun", name, ns)["metadata"].get("annotations") or {}).get(
                WAITING, ""
            )
            for name in want
        }

    wait_for(
        "each held run to say why it waits",
        lambda: said() == want,
        timeout=30,
        describe=lambda: f"{said()}\n{describe(api, ns)}",
    )
    assert _work_running(api, ns, "n0"), describe(api, ns)
    for name, why in want.items():
        # One Event each time its reason changed (a newer run arriving moves it back), so
        # exactly one saying what it says now.
        def told(name: str = name, why: str = why) -> bool:
            said = [m for reason, m in run_events(api, ns, name) if reason == "Waiting"]
            return said.count(why) == 1 and len(set(said)) == len(said)

        def events(name: str = name) -> str:
            return f"{run_events(api, ns, name)}\n{describe(api, ns)}"

        wait_for(f"one Waiting Event on {name}", told, timeout=15, describe=events)
    assert real.kubeconfig is not None
    argv = ["explain", "--kubeconfig", str(real.kubeconfig), "--run", "pipelinerun/n1"]
    capsys.readouterr()
    assert main([*argv, "--namespace", ns]) == 0
    shown = capsys.readouterr().out
    assert f"why:      {want['n1']}" in shown, shown
    assert "  - newest, key line (Queue, maxRunning 1): 1 running, 3 pending" in shown, shown
    assert _work_running(api, ns, "n0"), "n0 ended before the reasons were read: " + describe(
        api, ns
    )


def test_queue_newest_first_runs_the_newest_waiting_run_next(
    real: RealCluster, groups: Groups
) -> None:
    api = real.api
    ns = groups.namespaces["Newest"]
    order = ["n0", "n3", "n2", "n1"]
    runs = wait_runs(api, ns, order, timeout=300)
    assert_succeeded(runs, api, ns, *order)
    _assert_one_after_another(api, ns, runs, order)
    for name in order:  # a start removes the reason
        assert WAITING not in (runs[name]["metadata"].get("annotations") or {}), name


def test_replace_cancels_the_older_waiting_run_the_running_and_newest_succeed(
    real: RealCluster, groups: Groups
) -> None:
    api = real.api
    ns = groups.namespaces["Replace"]
    runs = wait_runs(api, ns, ["r1", "r2", "r3"], timeout=300)
    assert_succeeded(runs, api, ns, "r1", "r3")
    assert runs["r2"]["spec"].get("status") == "Cancelled", describe(api, ns)
    assert verdict(runs["r2"]) == ("False", "Cancelled"), describe(api, ns)
    assert not _taskruns(api, ns, "r2"), describe(api, ns)  # it never ran
    assert ("Cancelled", "cancelled by ConcurrencyControl replace: newer run r3, key preview") in (
        run_events(api, ns, "r2")
    ), describe(api, ns)
    assert all(reason != "Cancelled" for reason, _ in run_events(api, ns, "r1"))
    _assert_one_after_another(api, ns, runs, ["r1", "r3"])


def _assert_one_after_another(api: Api, ns: str, runs: dict[str, Obj], order: list[str]) -> None:
    """Each run's first TaskRun was created after the run before it in ``order`` ended."""
    for before, after in itertools.pairwise(order):
        finished = _time(runs[before]["status"]["completionTime"])
        first_task = min(
            _time(tr["metadata"]["creationTimestamp"]) for tr in _taskruns(api, ns, after).values()
        )
        assert first_task >= finished, f"{after} started before {before} ended\n{describe(api, ns)}"


def _taskruns(api: Api, namespace: str, run: str) -> dict[str, Obj]:
    return {
        (tr["metadata"].get("labels") or {}).get("tekton.dev/pipelineTask", ""): tr
        for tr in api.list("TaskRun", namespace, label_selector=f"tekton.dev/pipelineRun={run}")
    }


def test_cancel_ends_the_older_run_the_newer_succeeds(real: RealCluster, groups: Groups) -> None:
    api = real.api
    ns = groups.namespaces["Cancel"]
    runs = wait_runs(api, ns, ["old", "new"])
    assert_succeeded(runs, api, ns, "new")
    assert runs["old"]["spec"].get("status") == "Cancelled", describe(api, ns)
    assert verdict(runs["old"]) == ("False", "Cancelled"), describe(api, ns)
    old = _taskruns(api, ns, "old")
    assert verdict(old["work"])[0] == "False", describe(api, ns)
    assert "cleanup" not in old, describe(api, ns)  # Cancel: no finally


def test_gracefully_cancel_runs_the_finally_task(real: RealCluster, groups: Groups) -> None:
    api = real.api
    ns = groups.namespaces["GracefullyCancel"]
    runs = wait_runs(api, ns, ["old", "new"])
    assert_succeeded(runs, api, ns, "new")
    assert runs["old"]["spec"].get("status") == "CancelledRunFinally", describe(api, ns)
    assert verdict(runs["old"]) == ("False", "Cancelled"), describe(api, ns)
    old = _taskruns(api, ns, "old")
    assert verdict(old["work"])[0] == "False", describe(api, ns)
    assert verdict(old["cleanup"]) == ("True", "Succeeded"), describe(api, ns)
    pod = task_pods(api, ns, "old")["cleanup"]["metadata"]["name"]
    assert real.pod_log(ns, pod, "step-cleanup").strip() == "cleanup of old"


def _time(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def test_queue_runs_one_after_another_in_order(real: RealCluster, groups: Groups) -> None:
    api = real.api
    ns = groups.namespaces["Queue"]
    names = ["q0", "q1", "q2"]
    runs = wait_runs(api, ns, names, timeout=300)
    assert_succeeded(runs, api, ns, *names)
    _assert_one_after_another(api, ns, runs, names)
    # q1 and q2 waited, then the reconciler started them and stamped each with its start:
    # real Tekton gave that stamp to every pod of the run (its first pod waits for the
    # placeholder seeded from the start at any webhook replica).
    for name in names[1:]:
        meta = runs[name]["metadata"]
        stamp = (meta.get("annotations") or {}).get(ANNOTATION_RUN_ADMITTED)
        assert stamp, f"{name} started by the reconciler without the stamp: {meta}"
        assert _time(stamp) > _time(meta["creationTimestamp"]), (name, stamp)
        pods = task_pods(api, ns, name)
        assert pods, describe(api, ns)
        for task_name, pod in pods.items():
            got = (pod["metadata"].get("annotations") or {}).get(ANNOTATION_RUN_ADMITTED)
            assert got == stamp, f"{name}'s {task_name} pod has stamp {got!r}, the run {stamp!r}"


def test_a_run_its_author_created_pending_stays_pending(real: RealCluster, groups: Groups) -> None:
    api = real.api
    ns = groups.namespaces["Queue"]
    wait_runs(api, ns, ["q0", "q1", "q2"], timeout=300)
    held = api.must_get("PipelineRun", "held", ns)
    assert held["spec"].get("status") == PENDING, describe(api, ns)
    assert not _taskruns(api, ns, "held"), describe(api, ns)
    assert (held["metadata"].get("annotations") or {}).get("coschedule.dev/pending-by") is None


# ---- limit plus supersede, bounded and timed queues, priority ---------------------------

FEATURES: dict[str, Obj] = {
    "limit": {"strategy": "GracefullyCancel", "maxRunning": 2, "key": "main"},
    "bounded": {"strategy": "Queue", "key": "prod", "maxPending": 1, "overflow": "CancelNewest"},
    "timed": {"strategy": "Queue", "key": "prod", "maxWaitSeconds": 15},
    "prio": {"strategy": "Queue", "key": "prod", "priority": "$(labels.priority)"},
}
PRIORITIES = {"p1": "0", "p2": "5", "p3": "1"}  # created in this order while p0 runs


@pytest.fixture(scope="module")
def features(real: RealCluster) -> Iterator[Groups]:
    api, sc = real.api, real.local_class
    namespaces: dict[str, str] = {}
    for name, spec in FEATURES.items():
        ns = unique(f"real-{name}")
        make_namespace(api, ns, None)
        api.create(
            {
                "apiVersion": "coschedule.dev/v1alpha1",
                "kind": "ConcurrencyControl",
                "metadata": {"name": name, "namespace": ns},
                "spec": {"selector": {}, "kinds": ["PipelineRun"], **spec},
            }
        )
        namespaces[name] = ns
    for name, ns in namespaces.items():
        wait_webhook_sees_control(api, ns, name, _run(ns, "probe", 1, sc))
    limit, bounded, timed, prio = (namespaces[n] for n in FEATURES)
    api.create(_run(limit, "l1", 90, sc))
    api.create(_run(bounded, "b1", 30, sc))
    api.create(_run(timed, "w1", 50, sc))
    api.create(_run(prio, "p0", 30, sc))
    _wait_running(api, "limit", limit, "l1")
    api.create(_run(limit, "l2", 25, sc))
    _wait_running(api, "bounded", bounded, "b1")
    api.create(_run(bounded, "b2", 1, sc))
    wait_for("bounded: b2 held", functools.partial(_held_by_us, api, bounded, "b2"), timeout=30)
    api.create(_run(bounded, "b3", 1, sc))
    _wait_running(api, "timed", timed, "w1")
    api.create(_run(timed, "w2", 1, sc))
    _wait_running(api, "prio", prio, "p0")
    for name, priority in PRIORITIES.items():
        api.create(_run(prio, name, 1, sc, labels={"priority": priority}))
    _wait_running(api, "limit", limit, "l2")
    api.create(_run(limit, "l3", 1, sc))
    yield Groups(namespaces)
    if os.environ.get("REAL_KEEP"):
        return
    for ns in namespaces.values():
        with contextlib.suppress(ApiError):
            api.delete("Namespace", ns)


def test_limit_plus_supersede_cancels_the_oldest_running_run(
    real: RealCluster, features: Groups
) -> None:
    api = real.api
    ns = features.namespaces["limit"]
    runs = wait_runs(api, ns, ["l1", "l2", "l3"], timeout=300)
    assert_succeeded(runs, api, ns, "l2", "l3")
    assert runs["l1"]["spec"].get("status") == "CancelledRunFinally", describe(api, ns)
    assert verdict(runs["l1"]) == ("False", "Cancelled"), describe(api, ns)
    old = _taskruns(api, ns, "l1")
    assert verdict(old["work"])[0] == "False", describe(api, ns)
    assert verdict(old["cleanup"]) == ("True", "Succeeded"), describe(api, ns)
    assert (
        "Cancelled",
        "cancelled by ConcurrencyControl limit: newer run l3; maxRunning 2 keeps the 2 newest, "
        "key main",
    ) in run_events(api, ns, "l1"), describe(api, ns)
    # l3 started while l2 still ran: two at once, never three.
    l3_first = min(
        _time(tr["metadata"]["creationTimestamp"]) for tr in _taskruns(api, ns, "l3").values()
    )
    assert l3_first < _time(runs["l2"]["status"]["completionTime"]), describe(api, ns)


def test_a_bounded_queue_cancels_the_overflowing_arrival(
    real: RealCluster, features: Groups
) -> None:
    api = real.api
    ns = features.namespaces["bounded"]
    runs = wait_runs(api, ns, ["b1", "b2", "b3"], timeout=300)
    assert_succeeded(runs, api, ns, "b1", "b2")
    _assert_one_after_another(api, ns, runs, ["b1", "b2"])
    assert verdict(runs["b3"]) == ("False", "Cancelled"), describe(api, ns)
    assert not _taskruns(api, ns, "b3"), describe(api, ns)  # it never ran
    assert (
        "Cancelled",
        "cancelled by ConcurrencyControl bounded: the queue of its key was full (maxPending 1, "
        "overflow CancelNewest), key prod",
    ) in run_events(api, ns, "b3"), describe(api, ns)


def test_max_wait_seconds_cancels_a_run_that_waited_too_long(
    real: RealCluster, features: Groups
) -> None:
    api = real.api
    ns = features.namespaces["timed"]
    runs = wait_runs(api, ns, ["w1", "w2"], timeout=300)
    assert_succeeded(runs, api, ns, "w1")
    assert verdict(runs["w2"]) == ("False", "Cancelled"), describe(api, ns)
    assert not _taskruns(api, ns, "w2"), describe(api, ns)
    assert (
        "Cancelled",
        "cancelled by ConcurrencyControl timed: waited longer than maxWaitSeconds 15, key prod",
    ) in run_events(api, ns, "w2"), describe(api, ns)
    # Cancelled after its 15 s, while w1 still ran (not when the line moved).
    created = _time(runs["w2"]["metadata"]["creationTimestamp"])
    ended = _time(runs["w2"]["status"]["completionTime"])
    assert (ended - created).total_seconds() >= 14, describe(api, ns)
    assert ended < _time(runs["w1"]["status"]["completionTime"]), describe(api, ns)


def test_priority_orders_the_waiting_runs(real: RealCluster, features: Groups) -> None:
    api = real.api
    ns = features.namespaces["prio"]
    order = ["p0", "p2", "p3", "p1"]
    runs = wait_runs(api, ns, order, timeout=300)
    assert_succeeded(runs, api, ns, *order)
    _assert_one_after_another(api, ns, runs, order)
    for name, priority in PRIORITIES.items():
        notes = runs[name]["metadata"].get("annotations") or {}
        assert notes.get("priority.coschedule.dev/prio") == priority, name


def test_a_queue_loses_nothing_when_its_leader_is_killed_mid_queue(real: RealCluster) -> None:
    """Every reconciler killed (SIGKILL) while one run runs and two wait, then started again:
    the waiting runs start one after another, each once; nothing is cancelled or stranded."""
    real.require("own-stack")
    assert real.product is not None
    api, sc = real.api, real.local_class
    ns = unique("real-killed")
    make_namespace(api, ns, None)
    spec = {"selector": {}, "kinds": ["PipelineRun"], "strategy": "Queue", "key": "prod"}
    api.create(
        {
            "apiVersion": "coschedule.dev/v1alpha1",
            "kind": "ConcurrencyControl",
            "metadata": {"name": "killed", "namespace": ns},
            "spec": {**spec, "maxPending": 3, "maxWaitSeconds": 600},
        }
    )
    wait_webhook_sees_control(api, ns, "killed", _run(ns, "probe", 1, sc))
    names = ["k1", "k2", "k3"]
    api.create(_run(ns, "k1", 20, sc))
    _wait_running(api, "killed", ns, "k1")
    for name in names[1:]:
        api.create(_run(ns, name, 1, sc))
    for name in names[1:]:
        wait_for(f"{name} held", functools.partial(_held_by_us, api, ns, name), timeout=30)
    procs = list(real.product.reconcilers.values())
    for proc in procs:
        proc.kill()
    for proc in procs:
        proc.start()
    runs = wait_runs(api, ns, names, timeout=300)
    assert_succeeded(runs, api, ns, *names)
    _assert_one_after_another(api, ns, runs, names)
    for name in names:
        reasons = [reason for reason, _ in run_events(api, ns, name)]
        assert reasons.count("Started") == 1, (name, reasons)
        assert "Cancelled" not in reasons, (name, reasons)
    if not os.environ.get("REAL_KEEP"):
        with contextlib.suppress(ApiError):
            api.delete("Namespace", ns)
