"""Run concurrency control (docs/concurrency.md) with real PipelineRuns: Tekton's own verdict
for every run. Each strategy has its own namespace; the three start together."""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

import pytest

from tests.e2e.kube import Api, ApiError, Obj, wait_for
from tests.e2e.world import make_namespace, unique
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


def _control(namespace: str, strategy: str) -> Obj:
    spec: Obj = {"selector": {}, "kinds": ["PipelineRun"], "key": "", "strategy": strategy}
    if strategy == "Queue":
        spec["maxRunning"] = 1
    return {
        "apiVersion": "coschedule.dev/v1alpha1",
        "kind": "ConcurrencyControl",
        "metadata": {"name": strategy.lower(), "namespace": namespace},
        "spec": spec,
    }


def _run(
    namespace: str, name: str, seconds: int, storage_class: str, *, status: str | None = None
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
    )


def _work_running(api: Api, namespace: str, run: str) -> bool:
    pod = task_pods(api, namespace, run).get("work")
    return bool(pod) and (pod or {}).get("status", {}).get("phase") == "Running"


@dataclass
class Groups:
    namespaces: dict[str, str]  # strategy -> namespace


@pytest.fixture(scope="module")
def groups(real: RealCluster) -> Iterator[Groups]:
    """Cancel and GracefullyCancel: an old run, running, then a newer one; Queue: three runs
    and one its author created pending."""
    api = real.api
    namespaces: dict[str, str] = {}
    for strategy in ("Cancel", "GracefullyCancel", "Queue"):
        ns = unique(f"real-{strategy.lower()}")
        make_namespace(api, ns, None)
        api.create(_control(ns, strategy))
        namespaces[strategy] = ns
    for strategy in ("Cancel", "GracefullyCancel"):
        api.create(_run(namespaces[strategy], "old", 120, real.local_class))
    queue = namespaces["Queue"]
    for index in range(3):
        api.create(_run(queue, f"q{index}", 2, real.local_class))
    api.create(_run(queue, "held", 1, real.local_class, status=PENDING))
    for strategy in ("Cancel", "GracefullyCancel"):
        ns = namespaces[strategy]
        wait_for(
            f"{strategy}: the old run's task to run",
            functools.partial(_work_running, api, ns, "old"),
            timeout=120,
            describe=functools.partial(describe, api, ns),
        )
        api.create(_run(ns, "new", 1, real.local_class))
    yield Groups(namespaces)
    if os.environ.get("REAL_KEEP"):
        return
    for ns in namespaces.values():
        with contextlib.suppress(ApiError):
            api.delete("Namespace", ns)


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
    for before, after in itertools.pairwise(names):
        finished = _time(runs[before]["status"]["completionTime"])
        first_task = min(
            _time(tr["metadata"]["creationTimestamp"]) for tr in _taskruns(api, ns, after).values()
        )
        assert first_task >= finished, f"{after} started before {before} ended\n{describe(api, ns)}"


def test_a_run_its_author_created_pending_stays_pending(real: RealCluster, groups: Groups) -> None:
    api = real.api
    ns = groups.namespaces["Queue"]
    wait_runs(api, ns, ["q0", "q1", "q2"], timeout=300)
    held = api.must_get("PipelineRun", "held", ns)
    assert held["spec"].get("status") == PENDING, describe(api, ns)
    assert not _taskruns(api, ns, "held"), describe(api, ns)
    assert (held["metadata"].get("annotations") or {}).get("coschedule.dev/pending-by") is None
