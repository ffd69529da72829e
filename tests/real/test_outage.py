"""A webhook outage with real Tekton: every ``coschedule serve`` stopped for two minutes while
PipelineRuns are created and running, with the admission policies of manifests/base (bound
to the scenario's namespaces) and the webhooks failing open, as shipped.

Nothing is refused: every PipelineRun is created, every TaskRun pod too (Tekton fails a
TaskRun whose pod is refused, and does not retry). Every run Succeeds with all its pods on
its placeholder's node, the run that was mid-way when the webhook went too. Under a Queue
ConcurrencyControl (maxRunning 1) the second run starts only after the first is done.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from datetime import datetime

from tests.e2e.cluster import Proc, wait_healthy
from tests.e2e.kube import Api, ApiError, Obj, wait_for
from tests.e2e.test_outage import POLICY, RUNS_POLICY, gate_policy
from tests.e2e.world import wait_webhook_sees_control
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

OUTAGE_SECONDS = 120


def _runs(real: RealCluster, namespace: str, name: str, seconds: int = 0) -> Obj:
    tasks, finally_ = write_read_pipeline()
    if seconds:
        slow = task("slow", f"sleep {seconds}\n", ["src"])
        tasks[0]["runAfter"] = ["slow"]
        tasks = [slow, *tasks]
    return pipeline_run(
        namespace,
        name,
        tasks,
        {
            "src": {"volumeClaimTemplate": claim_template(real.local_class)},
            "cache": {"volumeClaimTemplate": claim_template(real.local_class)},
        },
        finally_=finally_,
    )


def _dry_run_pod(namespace: str) -> Obj:
    """A pod as Tekton makes one (its TaskRun its controller), for a server-side dry run."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "probe",
            "namespace": namespace,
            "labels": {"tekton.dev/pipelineRun": "probe"},
            "ownerReferences": [
                {
                    "apiVersion": "tekton.dev/v1",
                    "kind": "TaskRun",
                    "name": "probe",
                    "uid": "00000000-0000-0000-0000-000000000001",
                    "controller": True,
                }
            ],
        },
        "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
    }


def _policies_active(api: Api, plain: str, queued: str) -> bool:
    pod = api.create(_dry_run_pod(plain), dry_run=True)
    gated = bool(pod["spec"].get("schedulingGates"))
    run = api.create(_runs_probe(queued), dry_run=True)
    return gated and "coschedule.dev/held-by" in (run["metadata"].get("annotations") or {})


def _runs_probe(namespace: str) -> Obj:
    return {
        "apiVersion": "tekton.dev/v1",
        "kind": "PipelineRun",
        "metadata": {"name": "probe", "namespace": namespace},
        "spec": {"pipelineRef": {"name": "none"}},
    }


def _restart(old: Proc) -> Proc:
    proc = Proc(old.name, old.argv, old.log_path, env=old.env, cwd=old.cwd).start()
    port = old.argv[old.argv.index("--health-port") + 1]
    wait_healthy(f"http://127.0.0.1:{port}/readyz", proc, timeout=60)
    return proc


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_a_two_minute_webhook_outage_fails_no_run(
    real: RealCluster, namespace: Callable[..., str]
) -> None:
    real.require("own-stack")
    product = real.product
    assert product is not None
    assert product.webhook is not None
    plane = real.plane
    assert plane is not None
    api = real.api
    plain = namespace("pipelineruns", prefix="outage")
    queued = namespace("pipelineruns", prefix="outage-queue")
    api.create(
        {
            "apiVersion": "coschedule.dev/v1alpha1",
            "kind": "ConcurrencyControl",
            "metadata": {"name": "deploy", "namespace": queued},
            "spec": {"selector": {}, "strategy": "Queue", "maxRunning": 1, "key": "env"},
        }
    )
    wait_webhook_sees_control(api, queued, "deploy", _runs_probe(queued))
    recorder = Recorder(api)
    seen = {ns: recorder.watch(ns) for ns in (plain, queued)}
    refused: list[str] = []
    created_in_outage: list[str] = []

    def create(run: Obj) -> None:
        try:
            api.create(run)
        except ApiError as exc:
            refused.append(f"{run['metadata']['name']}: {exc}")

    with contextlib.ExitStack() as stack:
        for ns in (plain, queued):
            stack.enter_context(gate_policy(api, ns, POLICY))
            stack.enter_context(gate_policy(api, ns, RUNS_POLICY))
        recorder.start()
        try:
            # Mid-way when the webhook goes: its later tasks' pods are made in the outage.
            create(_runs(real, plain, "before", seconds=20))
            wait_for(
                "run before's first task to run",
                lambda: (
                    (task_pods(api, plain, "before").get("slow") or {})
                    .get("status", {})
                    .get("phase")
                    == "Running"
                ),
                timeout=120,
                describe=lambda: describe(api, plain),
            )
            product.webhook.stop()
            down = time.monotonic()
            # Active once dry runs come back gated and held (with the webhook up, it decides
            # on the run and removes the policy's mark in the same admission).
            wait_for(
                "the admission policies to be active",
                lambda: _policies_active(api, plain, queued),
                timeout=60,
            )
            for name in ("during-1", "during-2"):
                create(_runs(real, plain, name))
                created_in_outage.append(name)
            for name in ("queued-1", "queued-2"):
                create(_runs(real, queued, name, seconds=15))
                created_in_outage.append(name)
            time.sleep(max(0.0, OUTAGE_SECONDS - (time.monotonic() - down)))
            # Registered with the control plane too, so that its teardown stops the new
            # process (a restarted webhook was left running after the suite).
            product.webhook = plane.procs["coschedule-serve"] = _restart(product.webhook)
            outage = time.monotonic() - down
            done_plain = wait_runs(api, plain, ["before", "during-1", "during-2"], timeout=420)
            done_queued = wait_runs(api, queued, ["queued-1", "queued-2"], timeout=420)
        finally:
            recorder.stop()
    assert refused == [], refused
    assert_succeeded(done_plain, api, plain, "before", "during-1", "during-2")
    assert_succeeded(done_queued, api, queued, "queued-1", "queued-2")
    for ns, runs in (
        (plain, ("before", "during-1", "during-2")),
        (queued, ("queued-1", "queued-2")),
    ):
        for run in runs:
            pods = task_pods(api, ns, run)
            nodes = {p["spec"]["nodeName"] for p in pods.values()}
            assert len(nodes) == 1, f"{run} ran on {nodes}\n{describe(api, ns)}"
            assert seen[ns].placeholder_nodes(placeholder_name(ns, run)) == nodes, describe(api, ns)
    # The queue's limit held: the second run's first pod came after the first run ended.
    first = done_queued["queued-1"]["status"]["completionTime"]
    second_pods = task_pods(api, queued, "queued-2").values()
    earliest = min(_time(p["metadata"]["creationTimestamp"]) for p in second_pods)
    assert earliest >= _time(first), (first, earliest)
    print(
        f"\n[outage] webhook down {outage:.0f}s; {len(created_in_outage)} PipelineRuns created "
        f"in it, 5 runs Succeeded, {len(refused)} refused admissions"
    )
