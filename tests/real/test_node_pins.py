"""Placement by node name on real kubelets and the real Tekton controller (issue 20, item
4): a TaskRun's pod is pinned to its placeholder's node (``placement: auto``); it cannot fit
there beside another workload's pod, so the run's placeholder moves to the other pool node.
The pin cannot follow (a pod's node affinity is fixed once it is scheduling): the reconciler
deletes the pending pod, Tekton's TaskRun reconciler makes it again, the webhook pins the
new pod to the placeholder's new node, and the PipelineRun Succeeds there.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.e2e.kube import wait_for
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
from tests.real.stack import POOL_NODES, RealCluster
from tests.real.test_stuck import (
    BIG,
    IN_POOL,
    RUN,
    _events,
    _filler,
    _placeholder_node,
    pool,  # noqa: F401  (the fixture: the pool nodes empty, the second cordoned)
)
from tests.real.volumes import NETWORK_CLASS

PINNED_NODE = "coschedule.dev/pinned-node"


@pytest.mark.usefixtures("pool")
def test_a_pending_pinned_pod_of_a_moved_run_is_made_again_by_tekton_where_the_run_went(
    real: RealCluster, namespace: Callable[..., str]
) -> None:
    api = real.api
    busy, free = POOL_NODES  # the pool fixture: free is cordoned until it is let in
    ns = namespace("pipelineruns", prefix="pinned")
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
        # The first task's pod, pinned to the busy node (where the placeholder is), pending.
        first = wait_for(
            f"the first task's pod pinned to {busy}",
            lambda: (
                pod
                if (pod := task_pods(api, ns, RUN).get("first")) is not None
                and (pod["metadata"].get("annotations") or {}).get(PINNED_NODE) == busy
                and not pod["spec"].get("schedulingGates")
                else None
            ),
            timeout=90,
            describe=lambda: describe(api, ns),
        )
        assert _placeholder_node(api, ns) == busy, describe(api, ns)
        assert not first["spec"].get("nodeName"), describe(api, ns)
        cordon(api, free, False)  # room for the first task appears on the other node
        runs = wait_runs(api, ns, [RUN])
    finally:
        recorder.stop()
    assert_succeeded(runs, api, ns, RUN)
    pods = task_pods(api, ns, RUN)
    placed = {name: pod["spec"]["nodeName"] for name, pod in pods.items()}
    assert placed == {"first": free, "second": free}, f"{placed}\n{describe(api, ns)}"
    # Made again by Tekton (another pod), pinned by the webhook to where the run went.
    assert pods["first"]["metadata"]["uid"] != first["metadata"]["uid"], describe(api, ns)
    for pod in pods.values():
        assert (pod["metadata"].get("annotations") or {}).get(PINNED_NODE) == free
        assert "podAffinity" not in (pod["spec"].get("affinity") or {})
    assert seen.placeholder_nodes(placeholder_name(ns, RUN)) == {busy, free}
    recreated = _events(api, ns, "PodRecreated")
    assert f"PipelineRun/{RUN}" in recreated, describe(api, ns)
    assert f"was pending on node {busy}" in recreated[f"PipelineRun/{RUN}"]
    assert f"PipelineRun/{RUN}" in _events(api, ns, "RunRelocated"), describe(api, ns)
