"""The webhook and the reconciler restarted mid-run (SIGTERM, then the same command again, as
a rollout does): every run still Succeeds, its pods with its placeholder, nothing recreated."""

from __future__ import annotations

from collections.abc import Callable

from tests.e2e.cluster import Proc, wait_healthy
from tests.e2e.kube import Api, wait_for
from tests.real.runs import (
    Recorder,
    assert_succeeded,
    claim_template,
    describe,
    pipeline_run,
    placeholder_name,
    task,
    task_pods,
    wait_runs,
    write_read_pipeline,
)
from tests.real.stack import RealCluster

RUNS = ("restart-a", "restart-b")


def _restart(proc: Proc) -> None:
    proc.stop()
    proc.start()
    port = proc.argv[proc.argv.index("--health-port") + 1]
    wait_healthy(f"http://127.0.0.1:{port}/readyz", proc, timeout=60)


def _first_tasks_running(api: Api, namespace: str) -> bool:
    for run in RUNS:
        pod = task_pods(api, namespace, run).get("slow")
        if not pod or (pod.get("status") or {}).get("phase") != "Running":
            return False
    return True


def test_restarts_mid_run_lose_nothing(real: RealCluster, namespace: Callable[..., str]) -> None:
    real.require("own-stack")
    assert real.product is not None
    api = real.api
    ns = namespace("pipelineruns", prefix="restart")
    tasks, finally_ = write_read_pipeline()
    slow = task("slow", "sleep 15\n", ["src"])
    tasks[0]["runAfter"] = ["slow"]  # write after slow: pods are created across the restarts
    recorder = Recorder(api)
    seen = recorder.watch(ns)
    recorder.start()
    try:
        for run in RUNS:
            api.create(
                pipeline_run(
                    ns,
                    run,
                    [slow, *tasks],
                    {
                        "src": {"volumeClaimTemplate": claim_template(real.local_class)},
                        "cache": {"volumeClaimTemplate": claim_template(real.local_class)},
                    },
                    finally_=finally_,
                )
            )
        wait_for(
            "both runs' first tasks to run",
            lambda: _first_tasks_running(api, ns),
            timeout=120,
            describe=lambda: describe(api, ns),
        )
        before = {s["metadata"]["name"]: s["metadata"]["uid"] for s in api.list("StatefulSet", ns)}
        assert real.product.webhook is not None
        _restart(real.product.webhook)
        for proc in real.product.reconcilers.values():
            _restart(proc)
        after = {s["metadata"]["name"]: s["metadata"]["uid"] for s in api.list("StatefulSet", ns)}
        runs = wait_runs(api, ns, list(RUNS))
    finally:
        recorder.stop()
    assert_succeeded(runs, api, ns, *RUNS)
    assert before == after, "a placeholder was recreated across the restarts"
    assert set(before) == {placeholder_name(ns, run) for run in RUNS}
    for run in RUNS:
        pods = task_pods(api, ns, run)
        assert set(pods) == {"slow", "write", "build", "lint", "check", "report"}
        nodes = {p["spec"]["nodeName"] for p in pods.values()}
        assert len(nodes) == 1, f"{run} ran on {nodes}\n{describe(api, ns)}"
        assert seen.placeholder_nodes(placeholder_name(ns, run)) == nodes, describe(api, ns)
        report = real.pod_log(ns, pods["report"]["metadata"]["name"], "step-report")
        assert f"data of {run}" in report, report
