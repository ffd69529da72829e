"""Stuck runs on the small pool nodes (0.5 CPU each): the run's next task cannot fit on the
placeholder's node because another workload's pod (a filler) takes the CPU there.

- Nothing of the run runs yet and its volume can be mounted anywhere: the placeholder is
  moved to the node where the task fits, and the run Succeeds there.
- A task of the run runs: nothing is moved; the stuck pod and the PipelineRun get a Warning
  Event that says why; once room appears (the other pod ends) the run Succeeds where it is.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest

from tests.e2e.kube import Api, ApiError, Obj, wait_for
from tests.real.nodes import cordon
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
from tests.real.stack import POOL, POOL_LABEL, POOL_NODES, STEP_IMAGE, RealCluster
from tests.real.volumes import NETWORK_CLASS

RUN = "stuck"
TOLERATION = {"key": POOL_LABEL, "operator": "Equal", "value": POOL, "effect": "NoSchedule"}
IN_POOL = {"nodeSelector": {POOL_LABEL: POOL}, "tolerations": [TOLERATION]}
BIG = "300m"  # does not fit beside the filler on a 500m node
FILLER_CPU = "400m"


def _filler(api: Api, namespace: str, node: str, seconds: int = 3600) -> Obj:
    """Another workload's pod, bound to ``node`` without the scheduler, that ends by itself
    after ``seconds``."""
    return api.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "filler", "namespace": namespace},
            "spec": {
                "nodeName": node,
                "tolerations": [TOLERATION],
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 0,
                "automountServiceAccountToken": False,
                "containers": [
                    {
                        "name": "c",
                        "image": STEP_IMAGE,
                        "command": ["sleep", str(seconds)],
                        "resources": {"requests": {"cpu": FILLER_CPU, "memory": "16Mi"}},
                    }
                ],
            },
        }
    )


def _placeholder_node(api: Api, namespace: str) -> str | None:
    pod = api.get("Pod", f"{placeholder_name(namespace, RUN)}-0", namespace) or {}
    node: str | None = (pod.get("spec") or {}).get("nodeName")
    return node


def _events(api: Api, namespace: str, reason: str) -> dict[str, str]:
    """involved object kind/name -> message of the Events with ``reason``."""
    out: dict[str, str] = {}
    for event in api.list("Event", namespace):
        involved = event.get("involvedObject") or {}
        if event.get("reason") == reason:
            out[f"{involved.get('kind')}/{involved.get('name')}"] = str(event.get("message"))
    return out


def _pool_pods(api: Api) -> list[str]:
    """Pods on the pool nodes that hold resources there (not finished)."""
    return [
        f"{p['metadata']['namespace']}/{p['metadata']['name']} on {p['spec']['nodeName']}"
        for node in POOL_NODES
        for p in api.list("Pod", field_selector=f"spec.nodeName={node}")
        if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
    ]


@pytest.fixture
def pool(real: RealCluster) -> Iterator[tuple[str, str]]:
    """(busy, free): the first pool node takes the run's placeholder; the second is cordoned
    until the scenario lets it take pods. Both empty before (another scenario's pods may still
    be going away with its namespace: the kubelet would refuse a filler beside them) and
    schedulable again afterwards."""
    real.require("own-stack")
    api = real.api
    wait_for(
        "the pool nodes to be empty",
        lambda: not _pool_pods(api),
        timeout=120,
        describe=lambda: "\n".join(_pool_pods(api)),
    )
    busy, free = POOL_NODES
    cordon(api, free)
    try:
        yield busy, free
    finally:
        for node in POOL_NODES:
            with contextlib.suppress(ApiError):
                cordon(api, node, False)


def test_relocated_before_any_task_runs(
    real: RealCluster, namespace: Callable[..., str], pool: tuple[str, str]
) -> None:
    api = real.api
    busy, free = pool
    ns = namespace("pipelineruns", prefix="relocate")
    _filler(api, ns, busy)
    tasks = [
        task("first", "echo moved > $(workspaces.ws.path)/f\n", ["ws"], cpu=BIG),
        task("second", "grep -qx moved $(workspaces.ws.path)/f\n", ["ws"], run_after=["first"]),
    ]
    recorder = Recorder(api)
    seen = recorder.watch(ns)
    recorder.start()
    try:
        api.create(
            pipeline_run(
                ns,
                RUN,
                tasks,
                {"ws": {"volumeClaimTemplate": claim_template(NETWORK_CLASS)}},
                pod_template=IN_POOL,
            )
        )
        wait_for(
            f"the placeholder on {busy}",
            lambda: _placeholder_node(api, ns) == busy,
            timeout=90,
            describe=lambda: describe(api, ns),
        )
        cordon(api, free, False)  # the room the first task needs appears on the other node
        runs = wait_runs(api, ns, [RUN])
    finally:
        recorder.stop()
    assert_succeeded(runs, api, ns, RUN)
    placed = {name: pod["spec"]["nodeName"] for name, pod in task_pods(api, ns, RUN).items()}
    assert placed == {"first": free, "second": free}, f"{placed}\n{describe(api, ns)}"
    assert seen.placeholder_nodes(placeholder_name(ns, RUN)) == {busy, free}
    relocated = _events(api, ns, "RunRelocated")
    assert f"PipelineRun/{RUN}" in relocated, describe(api, ns)
    assert busy in relocated[f"PipelineRun/{RUN}"]


def test_explained_while_a_task_runs_then_succeeds(
    real: RealCluster, namespace: Callable[..., str], pool: tuple[str, str]
) -> None:
    api = real.api
    busy, _free = pool
    ns = namespace("pipelineruns", prefix="explain")
    # Room appears when the other workload ends (its pod Succeeded), after the run's first
    # task has run for a while.
    _filler(api, ns, busy, seconds=45)
    tasks = [
        task("long", "echo x > $(workspaces.ws.path)/long\nsleep 25\n", ["ws"]),
        task("big", "echo y > $(workspaces.ws.path)/big\n", ["ws"], cpu=BIG),
    ]
    recorder = Recorder(api)
    seen = recorder.watch(ns)
    recorder.start()
    try:
        api.create(
            pipeline_run(
                ns,
                RUN,
                tasks,
                {"ws": {"volumeClaimTemplate": claim_template(NETWORK_CLASS)}},
                pod_template=IN_POOL,
            )
        )
        wait_for(
            "the task that fits to run",
            lambda: (
                (task_pods(api, ns, RUN).get("long") or {}).get("status", {}).get("phase")
                == "Running"
            ),
            timeout=120,
            describe=lambda: describe(api, ns),
        )
        big_pod = f"{RUN}-big-pod"
        events = wait_for(
            "a RunStuck Event on the PipelineRun",
            lambda: e if f"PipelineRun/{RUN}" in (e := _events(api, ns, "RunStuck")) else None,
            timeout=90,
            describe=lambda: describe(api, ns),
        )
        assert busy in events[f"PipelineRun/{RUN}"], events
        assert big_pod in events[f"PipelineRun/{RUN}"], events
        assert f"Pod/{big_pod}" not in events, events  # one Event, on the run
        assert not task_pods(api, ns, RUN)["big"]["spec"].get("nodeName"), describe(api, ns)
        runs = wait_runs(api, ns, [RUN])
    finally:
        recorder.stop()
    assert_succeeded(runs, api, ns, RUN)
    placed = {name: pod["spec"]["nodeName"] for name, pod in task_pods(api, ns, RUN).items()}
    assert placed == {"long": busy, "big": busy}, f"{placed}\n{describe(api, ns)}"
    assert seen.placeholder_nodes(placeholder_name(ns, RUN)) == {busy}
