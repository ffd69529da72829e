"""The placeholder goes only where the run may run: a run whose pods' required node affinity
allows two of the four general nodes, those two made busier than the others (the
scheduler's scoring would send an unconstrained placeholder to the idle ones), lands its
placeholder and its pods on an allowed node, in every mode, with the real kube-scheduler.
A pod no node can take is refused at admission, naming the rule."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from coschedule.marks import claim_placeholder, run_placeholder
from tests.e2e.conftest import E2E
from tests.e2e.kube import Obj, dump
from tests.e2e.runs import node, wait_bound, wait_placeholder_bound, wait_statefulset
from tests.e2e.world import HOSTNAME, TektonRun, bare_pod, bound_claim, unique

pytestmark = pytest.mark.e2e

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
ALLOWED = ("e2e-node-a1", "e2e-node-b1")
NO_WORKSPACE = "tekton-taskrun-no-workspace"


def allowed_only(manifest: Obj) -> Obj:
    """The podTemplate's required node affinity, as Tekton copies it onto every pod."""
    manifest["spec"]["affinity"] = {
        **(manifest["spec"].get("affinity") or {}),
        "nodeAffinity": {
            REQUIRED: {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": HOSTNAME, "operator": "In", "values": list(ALLOWED)}
                        ]
                    }
                ]
            }
        },
    }
    return manifest


@pytest.fixture
def busy_allowed_nodes(e2e: E2E, namespace: Callable[..., str]) -> Iterator[None]:
    """Another workload's pods take 4 of the 8 CPUs of each allowed node: the run's pods
    (1 CPU each) still fit there, the idle nodes score higher."""
    ns = namespace(prefix="busy")
    for index, name in enumerate(ALLOWED):
        pod = bare_pod(ns, f"busy-{index}")
        pod["spec"]["nodeName"] = name
        pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "4", "memory": "1Gi"}}
        e2e.api.create(pod)
    yield
    # No kubelet here to finish a graceful deletion: the pods would hold their CPU.
    for index in range(len(ALLOWED)):
        e2e.api.delete("Pod", f"busy-{index}", ns, grace_period=0)


@pytest.mark.parametrize("mode", ["workspaces", "pipelineruns", "isolate-pipelinerun"])
def test_the_placeholder_and_the_run_land_only_on_allowed_nodes(
    e2e: E2E, namespace: Callable[..., str], busy_allowed_nodes: None, mode: str
) -> None:
    e2e.require("scheduler", "controller-manager", "reconciler")
    api = e2e.api
    ns = namespace(mode=mode)
    run = TektonRun(api, ns, unique("pr")).create()
    tasks = ("build", "lint")
    if mode == "workspaces":
        bound_claim(api, ns, "source")
        placeholder = claim_placeholder(ns, "source")
        for task in tasks:
            manifest = run.pod_manifest(task, claims={"pvc-1f1344866c": "source"})
            run.submit(task, allowed_only(manifest))
    else:
        placeholder = run_placeholder(ns, run.name)
        for task in tasks:
            run.submit(task, allowed_only(run.pod_manifest(task, fixture=NO_WORKSPACE)))

    sts = wait_statefulset(api, ns, placeholder)
    terms = sts["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][REQUIRED]
    assert terms["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": HOSTNAME, "operator": "In", "values": list(ALLOWED)}]}
    ], dump(sts)
    try:
        there = node(wait_placeholder_bound(api, ns, placeholder))
        assert there in ALLOWED, f"placeholder on {there}, outside {ALLOWED}"
        for task in tasks:
            wait_bound(api, ns, run.pod_name(task), node=there)
    finally:
        # No kubelet here to finish a graceful deletion: the pods would hold their CPU.
        for task in tasks:
            api.delete("Pod", run.pod_name(task), ns, grace_period=0)
        api.delete("StatefulSet", placeholder, ns)
        for pod in api.list("Pod", ns):
            api.delete("Pod", pod["metadata"]["name"], ns, grace_period=0)


def test_a_pod_no_node_can_take_is_refused_by_kubectl(
    e2e: E2E, namespace: Callable[..., str], tmp_path: Path
) -> None:
    ns = namespace(mode="pipelineruns")
    run = TektonRun(e2e.api, ns, unique("pr")).create()
    manifest = allowed_only(run.pod_manifest("build", fixture=NO_WORKSPACE))
    manifest["spec"]["nodeSelector"] = {HOSTNAME: "e2e-node-a2"}
    path = tmp_path / "pod.json"
    path.write_text(json.dumps(manifest))
    done = e2e.kubectl_run("create", "-f", str(path))
    assert done.returncode != 0, f"kubectl create succeeded:\n{done.stdout}"
    assert "denied the request" in done.stderr, done.stderr
    assert "policy-unsatisfiable-placement" in done.stderr, done.stderr
    assert f"nodeSelector {HOSTNAME}=e2e-node-a2" in done.stderr, done.stderr
    assert e2e.api.get("Pod", run.pod_name("build"), ns) is None
    assert e2e.api.get("StatefulSet", run_placeholder(ns, run.name), ns) is None
