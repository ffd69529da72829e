"""The placeholder goes only where the run may run (every mode, started together).

Each run's podTemplate has a required node affinity allowing two of the three general nodes
(real-1, real-2), and those two are made busier than the third (another workload's pod takes
half their CPU there): the scheduler's scoring alone would send a placeholder that ignored
the affinity to real-3, and with it the run's node-local volume, where no task of the run
may go (the run would never start). Every run must Succeed with its placeholder, its task
pods and its volumes on an allowed node.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.e2e.kube import Api, ApiError, Obj, wait_for
from tests.e2e.world import make_namespace, unique, wait_webhook_sees
from tests.real.runs import (
    PLACEHOLDER_PREFIX,
    Recorder,
    Seen,
    assert_succeeded,
    claim_template,
    describe,
    pipeline_run,
    task,
    task_pods,
    wait_runs,
)
from tests.real.stack import CONFIG, GENERAL_NODES, STEP_IMAGE, RealCluster
from tests.real.volumes import volume_node

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
HOSTNAME = "kubernetes.io/hostname"
MODES = ("workspaces", "pipelineruns", "isolate-pipelinerun")
BUSY_CPU = "1"  # of the general nodes' 2: LeastAllocated then prefers the idle third node


@dataclass
class Scenario:
    namespace: str
    seen: Seen


def _allowed(real: RealCluster) -> tuple[str, ...]:
    return tuple(n for n in GENERAL_NODES if n in real.nodes)[:2]


def _pod_template(allowed: tuple[str, ...]) -> Obj:
    expression = {"key": HOSTNAME, "operator": "In", "values": list(allowed)}
    return {
        "affinity": {
            "nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": [expression]}]}}
        }
    }


def _run(namespace: str, storage_class: str, allowed: tuple[str, ...]) -> Obj:
    tasks = [
        task("write", "echo data > $(workspaces.ws.path)/a\n", ["ws"]),
        task("read", "grep -qx data $(workspaces.ws.path)/a\n", ["ws"], run_after=["write"]),
    ]
    return pipeline_run(
        namespace,
        "affine",
        tasks,
        {"ws": {"volumeClaimTemplate": claim_template(storage_class)}},
        pod_template=_pod_template(allowed),
    )


def _busy(api: Api, namespace: str, node: str) -> Obj:
    """Another workload's pod on ``node`` (bound without the scheduler), holding CPU."""
    return api.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"busy-{node}", "namespace": namespace},
            "spec": {
                "nodeName": node,
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 0,
                "automountServiceAccountToken": False,
                "containers": [
                    {
                        "name": "c",
                        "image": STEP_IMAGE,
                        "command": ["sleep", "3600"],
                        "resources": {"requests": {"cpu": BUSY_CPU, "memory": "64Mi"}},
                    }
                ],
            },
        }
    )


def make_busy(api: Api, namespace: str, nodes: tuple[str, ...], timeout: float = 120) -> None:
    """``_busy`` on each of ``nodes``, until those pods run."""
    for node in nodes:
        _busy(api, namespace, node)
    wait_for(
        "the busy pods to run",
        lambda: all(
            ((api.get("Pod", f"busy-{n}", namespace) or {}).get("status") or {}).get("phase")
            == "Running"
            for n in nodes
        ),
        timeout=timeout,
        describe=lambda: describe(api, namespace),
    )


@pytest.fixture(scope="module")
def started(real: RealCluster) -> Iterator[dict[str, Scenario]]:
    """The allowed nodes made busy, then one run per mode, created at once."""
    real.require("own-stack")
    api = real.api
    allowed = _allowed(real)
    if len(allowed) < 2 or len(real.nodes) < 3:
        pytest.skip(f"real: needs three general nodes (the cluster has {real.nodes})")
    made: list[str] = []
    busy = unique("real-busy")
    make_namespace(api, busy, None)
    made.append(busy)
    make_busy(api, busy, allowed)
    recorder = Recorder(api).start()
    out: dict[str, Scenario] = {}
    for mode in MODES:
        ns = unique(f"real-affine-{mode[:9]}")
        make_namespace(api, ns, mode)
        made.append(ns)
        if mode != CONFIG["coschedule"]:
            wait_webhook_sees(api, ns, mode)
        out[mode] = Scenario(ns, recorder.watch(ns))
    for scenario in out.values():
        api.create(_run(scenario.namespace, real.local_class, allowed))
    yield out
    recorder.stop()
    if os.environ.get("REAL_KEEP"):
        return
    for ns in made:
        with contextlib.suppress(ApiError):
            api.delete("Namespace", ns)


@pytest.mark.parametrize("mode", MODES)
def test_run_with_required_node_affinity_stays_on_allowed_nodes(
    real: RealCluster, started: dict[str, Scenario], mode: str
) -> None:
    api = real.api
    allowed = set(_allowed(real))
    scenario = started[mode]
    ns = scenario.namespace
    runs = wait_runs(api, ns, ["affine"], seen=scenario.seen)
    assert_succeeded(runs, api, ns, "affine")
    nodes = {p["spec"]["nodeName"] for p in task_pods(api, ns, "affine").values()}
    assert len(nodes) == 1, f"tasks ran on {nodes}\n{describe(api, ns)}"
    assert nodes <= allowed, f"tasks ran on {nodes}, outside {allowed}\n{describe(api, ns)}"
    placeholders = {
        node
        for pod, seen in scenario.seen.pods.items()
        if pod.startswith(PLACEHOLDER_PREFIX)
        for node in seen
    }
    # The placeholder was only ever where the tasks ran: never on the excluded node.
    assert placeholders == nodes, f"placeholder on {placeholders}\n{describe(api, ns)}"
    claims = {c["metadata"]["name"] for c in api.list("PersistentVolumeClaim", ns)}
    volumes = {
        volume_node(v)
        for v in api.list("PersistentVolume")
        if ((v.get("spec") or {}).get("claimRef") or {}).get("namespace") == ns
    }
    assert claims, describe(api, ns)
    assert volumes == nodes, f"volumes on {volumes}\n{describe(api, ns)}"
