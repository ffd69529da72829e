"""Cordon and a NoSchedule taint mid-run, on "network" volumes (any node mounts them): the
running task finishes where it is, the placeholder and the later tasks go elsewhere, and the
run Succeeds with its data."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import pytest

from tests.e2e.kube import Api, wait_for
from tests.real.nodes import MAINTENANCE_TAINT, add_taint, cordon, restore
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

RUN = "moved"


def _running_on(api: Api, namespace: str, task_name: str) -> str | None:
    pod = task_pods(api, namespace, RUN).get(task_name)
    if pod and (pod.get("status") or {}).get("phase") == "Running":
        node: str = pod["spec"]["nodeName"]
        return node
    return None


@pytest.mark.parametrize("change", ["cordon", "taint"])
def test_node_change_mid_run(real: RealCluster, namespace: Callable[..., str], change: str) -> None:
    real.require("network-class", "two-nodes")
    assert real.network_class is not None
    api = real.api
    ns = namespace("pipelineruns", prefix=change)
    tasks = [
        task("first", "echo kept > $(workspaces.ws.path)/f\nsleep 12\n", ["ws"]),
        task("second", "grep -qx kept $(workspaces.ws.path)/f\n", ["ws"], run_after=["first"]),
    ]
    finally_ = [task("last", "cat $(workspaces.ws.path)/f\n", ["ws"])]
    recorder = Recorder(api)
    seen = recorder.watch(ns)
    recorder.start()
    node: str | None = None
    try:
        api.create(
            pipeline_run(
                ns,
                RUN,
                tasks,
                {"ws": {"volumeClaimTemplate": claim_template(real.network_class)}},
                finally_=finally_,
            )
        )
        node = wait_for(
            "the first task to run",
            lambda: _running_on(api, ns, "first"),
            timeout=120,
            describe=lambda: describe(api, ns),
        )
        if change == "cordon":
            cordon(api, node)
        else:
            add_taint(api, node, MAINTENANCE_TAINT)
        runs = wait_runs(api, ns, [RUN])
    finally:
        recorder.stop()
        if node is not None:
            with contextlib.suppress(Exception):
                restore(api, node)
    assert_succeeded(runs, api, ns, RUN)
    pods = task_pods(api, ns, RUN)
    placed = {name: pod["spec"]["nodeName"] for name, pod in pods.items()}
    assert placed["first"] == node, describe(api, ns)
    assert placed["second"] == placed["last"] != node, f"{placed}\n{describe(api, ns)}"
    assert placed["second"] in real.nodes
    placeholder = placeholder_name(ns, RUN)
    assert seen.placeholder_nodes(placeholder) == {node, placed["second"]}, (
        f"placeholder on {seen.placeholder_nodes(placeholder)}\n{describe(api, ns)}"
    )
    assert "kept" in real.pod_log(ns, pods["last"]["metadata"]["name"], "step-last")
