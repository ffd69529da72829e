"""A node dies under a running task (realstack ``node down``: kubelet, containers and
containerd gone; the Node object left, as a cloud leaves it while the machine is not
deleted). The node lifecycle controller marks it (Ready Unknown, the unreachable taints);
the reconciler force-deletes the run's placeholder pod there, which a dead kubelet would
leave Terminating for ever, and the StatefulSet makes it again on a live node. The task that
was running there is Tekton's to judge: once the operator declares the node shut down
(``node.kubernetes.io/out-of-service``, Kubernetes' non-graceful node shutdown), its pod is
deleted, and the task's ``retries`` run it again, on the placeholder's new node, where the
later tasks follow with the data of the "network" volume; the run Succeeds."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

from tests.e2e.kube import Api, Obj, wait_for
from tests.real.faults import declare_out_of_service, node_back, node_down, node_ready
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
)
from tests.real.stack import RealCluster

RUN = "node-down"


def _running_on(api: Api, namespace: str, task_name: str) -> str | None:
    pod = task_pods(api, namespace, RUN).get(task_name)
    if pod and (pod.get("status") or {}).get("phase") == "Running":
        node: str = pod["spec"]["nodeName"]
        return node
    return None


def _placeholder_pod(api: Api, namespace: str) -> Obj | None:
    return api.get("Pod", f"{placeholder_name(namespace, RUN)}-0", namespace)


def test_a_node_dies_under_a_running_task(real: RealCluster, namespace: Callable[..., str]) -> None:
    real.require("own-stack", "network-class")
    assert real.network_class is not None
    api = real.api
    ns = namespace("pipelineruns", prefix="node-down")
    first = task(
        "first",
        "echo kept > $(workspaces.ws.path)/f\nsleep 20\n",
        ["ws"],
    )
    first["retries"] = 1
    tasks = [
        first,
        task("second", "grep -qx kept $(workspaces.ws.path)/f\n", ["ws"], run_after=["first"]),
    ]
    recorder = Recorder(api)
    seen = recorder.watch(ns)
    recorder.start()
    node: str | None = None
    timings: dict[str, float] = {}
    try:
        api.create(
            pipeline_run(
                ns, RUN, tasks, {"ws": {"volumeClaimTemplate": claim_template(real.network_class)}}
            )
        )
        node = wait_for(
            "the first task to run",
            lambda: _running_on(api, ns, "first"),
            timeout=120,
            describe=lambda: describe(api, ns),
        )
        dead = node
        first_pod = task_pods(api, ns, RUN)["first"]
        placeholder = _placeholder_pod(api, ns)
        assert placeholder is not None
        assert placeholder["spec"]["nodeName"] == node
        started = time.monotonic()
        node_down(real, node)
        wait_for(
            f"node {node} to be marked Ready Unknown",
            lambda: node_ready(api, dead) == "Unknown",
            timeout=90,
            describe=lambda: str(api.must_get("Node", dead).get("status", {}).get("conditions")),
        )
        timings["marked"] = time.monotonic() - started

        def moved() -> Obj | None:
            pod = _placeholder_pod(api, ns)
            if pod is None or pod["metadata"]["uid"] == placeholder["metadata"]["uid"]:
                return None
            return pod if pod["spec"].get("nodeName") else None

        new = wait_for(
            "the placeholder made again on a live node",
            moved,
            timeout=60,
            describe=lambda: describe(api, ns),
        )
        timings["moved"] = time.monotonic() - started
        assert new["spec"]["nodeName"] != dead, describe(api, ns)
        declare_out_of_service(api, dead)
        runs = wait_runs(api, ns, [RUN], timeout=240)
        timings["done"] = time.monotonic() - started
    finally:
        recorder.stop()
        if node is not None:
            with contextlib.suppress(Exception):
                node_back(real, node)
    real.notes.append(f"node down: {', '.join(f'{k} {v:.0f}s' for k, v in timings.items())}")
    assert_succeeded(runs, api, ns, RUN)
    pods = task_pods(api, ns, RUN)
    assert pods["second"]["spec"]["nodeName"] == new["spec"]["nodeName"], describe(api, ns)
    [first_run] = [
        tr
        for tr in api.list("TaskRun", ns)
        if (tr["metadata"].get("labels") or {}).get("tekton.dev/pipelineTask") == "first"
    ]
    # Tekton's verdict on the attempt that ran on the dead node (its pod deleted once the node
    # was declared out of service) takes one of two forms, both Tekton's own: a retry (the
    # attempt Failed in retriesStatus, a pod "-retry1"), or the pod made again under its
    # first name before an attempt was recorded. Either way the task ran again, in a new
    # pod, on the placeholder's new node.
    status = first_run.get("status") or {}
    attempts = status.get("retriesStatus") or []
    if attempts:
        [attempt] = attempts
        assert attempt.get("podName") == f"{RUN}-first-pod", attempt
        assert [(c.get("status"), c.get("reason")) for c in attempt.get("conditions") or []] == [
            ("False", "Failed")
        ], attempt
        assert status.get("podName") == f"{RUN}-first-pod-retry1", status
    else:
        assert status.get("podName") == f"{RUN}-first-pod", status
    again = api.must_get("Pod", status["podName"], ns)
    assert again["metadata"]["uid"] != first_pod["metadata"]["uid"], describe(api, ns)
    assert again["spec"]["nodeName"] == new["spec"]["nodeName"], describe(api, ns)
    events = [
        str(e.get("message"))
        for e in api.list("Event", ns)
        if e.get("reason") == "PlaceholderMoved"
    ]
    assert any(m.startswith("force-deleted placeholder pod") and node in m for m in events), events
    assert seen.placeholder_nodes(placeholder_name(ns, RUN)) == {node, new["spec"]["nodeName"]}
