"""Stuck runs (issue 12) on the real control plane: the placeholder's node cannot take the
run's next pod. When no pod of the run runs and no volume pins it, the placeholder moves
to a node where the pod fits; otherwise the pod and the PipelineRun get a Warning Event
that says why; a run that could never be placed is refused at admission.

The scenarios use two nodes of their own (``POOL_NODES``: 2 CPU, 6 pods, tainted so that
only these pods go there) and the suite's ``stuck-grace-seconds`` (``STUCK_GRACE``).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from coschedule.marks import run_placeholder
from tests.e2e.conftest import E2E, STUCK_GRACE
from tests.e2e.kube import Api, Obj, wait_for
from tests.e2e.runs import (
    leader_metric,
    node,
    topology_key,
    unschedulable,
    wait_bound,
    wait_placeholder_bound,
)
from tests.e2e.world import (
    HOSTNAME,
    POOL_NODES,
    ZONE,
    TektonRun,
    bare_pod,
    bound_claim,
    create_pod,
    describe_namespace,
    in_pool,
    pod_phase,
    pool_pods,
    unique,
)

pytestmark = pytest.mark.e2e

NO_WORKSPACE = "tekton-taskrun-no-workspace"
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
ONE_WORKSPACE = "tekton-taskrun"
TWO_WORKSPACES = "tekton-taskrun-two-workspaces"
# Written by the relocation scenarios when set; ``python -m bench.stuck`` reads it.
FIGURES_ENV = "COSCHEDULE_STUCK_FIGURES"


def filler(api: Api, namespace: str, name: str, node_name: str, cpu: str = "10m") -> Obj:
    """Another workload's pod, already on ``node_name`` (bound without the scheduler)."""
    pod = bare_pod(namespace, name)
    pod["spec"]["nodeName"] = node_name
    pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": cpu, "memory": "16Mi"}}
    return api.create(pod)


def events_on(api: Api, namespace: str, kind: str, name: str, reason: str) -> list[Obj]:
    return [
        e
        for e in api.list("Event", namespace, field_selector=f"involvedObject.name={name}")
        if e.get("reason") == reason and (e.get("involvedObject") or {}).get("kind") == kind
    ]


def fill(api: Api, namespace: str, node_name: str, cause: str) -> None:
    """Leave too little of ``node_name`` for a pod requesting 1 CPU: CPU, or pod slots."""
    if cause == "cpu":
        filler(api, namespace, "filler-cpu", node_name, cpu="1500m")
        return
    taken = len([p for p in pool_pods(api) if p["spec"]["nodeName"] == node_name])
    for index in range(6 - taken):
        filler(api, namespace, f"filler-{index}", node_name)


REASON = {"cpu": "Insufficient cpu", "pods": "Too many pods"}
METRIC_REASON = {"cpu": "insufficient-resources", "pods": "too-many-pods"}


def start(e2e: E2E, ns: str) -> tuple[TektonRun, str, Obj]:
    """A run whose first task ran on a pool node: (run, placeholder, its bound pod)."""
    api = e2e.api
    run = TektonRun(api, ns, unique("pr")).create()
    run.pods["build"] = create_pod(api, in_pool(run.pod_manifest("build", fixture=NO_WORKSPACE)))
    placeholder = run_placeholder(ns, run.name)
    first = wait_placeholder_bound(api, ns, placeholder)
    wait_bound(api, ns, run.pod_name("build"), node=node(first))
    return run, placeholder, first


def record(figures: dict[str, Any]) -> None:
    path = os.environ.get(FIGURES_ENV)
    if not path:
        return
    target = Path(path)
    found = json.loads(target.read_text()) if target.exists() else []
    found.append(figures)
    target.write_text(json.dumps(found, indent=2))


@pytest.mark.usefixtures("pool")
@pytest.mark.parametrize("cause", ["cpu", "pods"])
def test_no_task_running_the_placeholder_moves_and_the_run_follows(
    e2e: E2E, namespace: Callable[..., str], cause: str
) -> None:
    e2e.require("scheduler", "controller-manager", "reconciler")
    api = e2e.api
    ns = namespace(mode="pipelineruns")
    run, placeholder, first = start(e2e, ns)
    old_node = node(first)
    pod_phase(api, run.pods["build"], "Succeeded")  # the first task is done: nothing runs
    fill(api, ns, old_node, cause)

    run.submit("test", in_pool(run.pod_manifest("test", fixture=NO_WORKSPACE), cpu="1"))
    since, message = unschedulable(api, ns, run.pod_name("test"), REASON[cause])
    assert re.match(r"0/\d+ nodes are available: ", message), message

    moved = wait_placeholder_bound(
        api,
        ns,
        placeholder,
        not_node=old_node,
        not_uid=first["metadata"]["uid"],
        timeout=STUCK_GRACE + 20,
    )
    new_node = node(moved)
    # Pinned by name to the old node (placement auto), the pod cannot follow: the reconciler
    # deletes it and Tekton makes it again (played here), pinned to the new node.
    wait_bound(
        api,
        ns,
        run.pod_name("test"),
        node=new_node,
        timeout=STUCK_GRACE + 20,
        remake=lambda: run.remake("test"),
    )
    bound_at = time.time()
    took = bound_at - since
    # lastTransitionTime has a resolution of one second.
    assert took <= STUCK_GRACE + 5 + 1, (
        f"stuck since {since:.0f}, all bound {took:.1f}s later (goal {STUCK_GRACE} + 5 s)"
    )
    relocated = wait_for(
        f"a PlaceholderRelocated Event on {placeholder}",
        lambda: events_on(api, ns, "StatefulSet", placeholder, "PlaceholderRelocated") or None,
        timeout=10,
    )
    assert old_node in relocated[0]["message"], relocated[0]["message"]
    wait_for(
        f"a RunRelocated Event on PipelineRun {run.name}",
        lambda: events_on(api, ns, "PipelineRun", run.name, "RunRelocated") or None,
        timeout=10,
    )
    assert leader_metric(e2e, "coschedule_relocations_total", reason=METRIC_REASON[cause]) >= 1

    # Every live pod of the run is together on the new node; the next one follows.
    run.pods["report"] = create_pod(api, in_pool(run.pod_manifest("report", fixture=NO_WORKSPACE)))
    wait_bound(api, ns, run.pod_name("report"), node=new_node)
    assert node(api.must_get("Pod", run.pod_name("test"), ns)) == new_node
    # The run's started pod was never deleted.
    build = api.must_get("Pod", run.pod_name("build"), ns)
    assert build["metadata"]["uid"] == run.pods["build"]["metadata"]["uid"]
    assert not build["metadata"].get("deletionTimestamp")
    record(
        {
            "cause": cause,
            "grace_s": STUCK_GRACE,
            "unschedulable_to_all_bound_s": round(took, 2),
            "detection_to_all_bound_s": round(took - STUCK_GRACE, 2),
            "from": old_node,
            "to": new_node,
            "message": message,
        }
    )
    print(f"\n[stuck] {cause}: Unschedulable -> all pods bound on {new_node} in {took:.1f}s")


@pytest.mark.usefixtures("pool")
@pytest.mark.parametrize("cause", ["cpu", "pods"])
def test_a_running_task_is_never_split_the_stuck_pod_is_explained(
    e2e: E2E, namespace: Callable[..., str], cause: str
) -> None:
    e2e.require("scheduler", "controller-manager", "reconciler")
    api = e2e.api
    ns = namespace(mode="pipelineruns")
    run, placeholder, first = start(e2e, ns)
    old_node = node(first)
    pod_phase(api, run.pods["build"], "Running")
    fill(api, ns, old_node, cause)
    run.pods["test"] = create_pod(
        api, in_pool(run.pod_manifest("test", fixture=NO_WORKSPACE), cpu="1")
    )
    unschedulable(api, ns, run.pod_name("test"), REASON[cause])

    on_run = wait_for(
        "a RunStuck Warning on the PipelineRun",
        lambda: events_on(api, ns, "PipelineRun", run.name, "RunStuck") or None,
        timeout=STUCK_GRACE + 10,
        describe=lambda: describe_namespace(api, ns),
    )
    text = on_run[0]["message"]
    assert on_run[0]["type"] == "Warning"
    # One Event for the stuck run, on the run: none copied onto the pod.
    assert not events_on(api, ns, "Pod", run.pod_name("test"), "RunStuck")
    assert run.pod_name("test") in text, text
    assert old_node in text, text
    assert run.pod_name("build") in text, text  # why not moved: it runs there
    assert ("cpu" in text) if cause == "cpu" else ("pod cap" in text), text
    assert leader_metric(e2e, "coschedule_stuck_groups") >= 1

    # Never moved: the same placeholder pod stays where the run is.
    time.sleep(STUCK_GRACE + 1)
    still = api.must_get("Pod", f"{placeholder}-0", ns)
    assert still["metadata"]["uid"] == first["metadata"]["uid"], describe_namespace(api, ns)
    assert node(still) == old_node
    assert node(api.must_get("Pod", run.pod_name("build"), ns)) == old_node


@pytest.mark.usefixtures("pool")
def test_a_node_local_volume_pins_the_run_explained_never_moved(
    e2e: E2E, namespace: Callable[..., str]
) -> None:
    e2e.require("scheduler", "controller-manager", "reconciler")
    api = e2e.api
    ns = namespace(mode="pipelineruns")
    here = sorted(POOL_NODES)[0]
    bound_claim(api, ns, "source", pinned=(HOSTNAME, here))
    run = TektonRun(api, ns, unique("pr")).create()
    build = in_pool(
        run.pod_manifest("build", fixture=ONE_WORKSPACE, claims={"pvc-1f1344866c": "source"})
    )
    run.pods["build"] = create_pod(api, build)
    placeholder = run_placeholder(ns, run.name)
    first = wait_placeholder_bound(api, ns, placeholder)
    assert node(first) == here  # where the data is
    wait_bound(api, ns, run.pod_name("build"), node=here)
    pod_phase(api, run.pods["build"], "Succeeded")  # nothing runs: only the volume pins it
    fill(api, ns, here, "cpu")
    test = in_pool(
        run.pod_manifest("test", fixture=ONE_WORKSPACE, claims={"pvc-1f1344866c": "source"}),
        cpu="1",
    )
    run.pods["test"] = create_pod(api, test)
    unschedulable(api, ns, run.pod_name("test"), "Insufficient cpu")

    on_run = wait_for(
        "a RunStuck Warning on the PipelineRun",
        lambda: events_on(api, ns, "PipelineRun", run.name, "RunStuck") or None,
        timeout=STUCK_GRACE + 10,
        describe=lambda: describe_namespace(api, ns),
    )
    text = on_run[0]["message"]
    assert "claim source" in text, text
    assert f"usable on node {here}" in text, text
    time.sleep(STUCK_GRACE + 1)
    still = api.must_get("Pod", f"{placeholder}-0", ns)
    assert still["metadata"]["uid"] == first["metadata"]["uid"], describe_namespace(api, ns)
    assert not events_on(api, ns, "StatefulSet", placeholder, "PlaceholderRelocated")


def kubectl_create(e2e: E2E, manifest: Obj, tmp_path: Path, *extra: str) -> Any:
    path = tmp_path / f"{manifest['metadata']['name']}.json"
    path.write_text(json.dumps(manifest))
    return e2e.kubectl_run("create", "-f", str(path), *extra)


def test_claims_on_two_nodes_are_refused_by_kubectl(
    e2e: E2E, namespace: Callable[..., str], tmp_path: Path
) -> None:
    e2e.require("controller-manager", "kubectl")
    api = e2e.api
    ns = namespace(mode="pipelineruns")
    one, two = sorted(POOL_NODES)
    bound_claim(api, ns, "source", pinned=(HOSTNAME, one))
    bound_claim(api, ns, "cache", pinned=(HOSTNAME, two))
    run = TektonRun(api, ns, unique("pr")).create()
    manifest = run.pod_manifest(
        "test",
        fixture=TWO_WORKSPACES,
        claims={"pvc-1f1344866c": "source", "pvc-f87b6a85f3": "cache"},
    )
    # The volumes reach the webhook through its watch; a pod created before would pass.
    deadline = time.monotonic() + 15
    while True:
        done = kubectl_create(e2e, manifest, tmp_path, "--dry-run=server")
        if done.returncode != 0 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    done = kubectl_create(e2e, manifest, tmp_path)
    assert done.returncode != 0, f"kubectl create succeeded:\n{done.stdout}"
    assert "denied the request" in done.stderr, done.stderr
    assert "rule claims-conflict" in done.stderr, done.stderr
    assert f"claim source (volume pv-{ns}-source) on node {one}" in done.stderr, done.stderr
    assert f"claim cache (volume pv-{ns}-cache) on node {two}" in done.stderr, done.stderr
    assert api.get("Pod", manifest["metadata"]["name"], ns) is None


def test_zonal_volumes_in_one_zone_are_admitted_with_a_zone_topology_key(
    e2e: E2E, namespace: Callable[..., str], tmp_path: Path
) -> None:
    e2e.require("controller-manager", "kubectl")
    api = e2e.api
    ns = namespace(mode="pipelineruns")
    bound_claim(api, ns, "source", pinned=(ZONE, "e2e-zone-a"))
    bound_claim(api, ns, "cache", pinned=(ZONE, "e2e-zone-a"))
    bound_claim(api, ns, "far", pinned=(ZONE, "e2e-zone-b"))
    run = TektonRun(api, ns, unique("pr")).create()
    together = run.pod_manifest(
        "test",
        fixture=TWO_WORKSPACES,
        claims={"pvc-1f1344866c": "source", "pvc-f87b6a85f3": "cache"},
    )
    apart = run.pod_manifest(
        "lint",
        fixture=TWO_WORKSPACES,
        claims={"pvc-1f1344866c": "source", "pvc-f87b6a85f3": "far"},
    )
    with topology_key(e2e, ns, ZONE):
        # Give the volume watch a moment: the refusal below proves the cache has them.
        wait_for(
            "the webhook to refuse volumes in two zones",
            lambda: kubectl_create(e2e, apart, tmp_path, "--dry-run=server").returncode != 0,
            timeout=15,
        )
        refused = kubectl_create(e2e, apart, tmp_path)
        assert refused.returncode != 0
        assert "rule claims-conflict" in refused.stderr, refused.stderr
        assert "zone e2e-zone-a" in refused.stderr
        assert "zone e2e-zone-b" in refused.stderr
        admitted = kubectl_create(e2e, together, tmp_path, "--dry-run=server")
        assert admitted.returncode == 0, admitted.stderr
        # A zone is many nodes: placement auto keeps the pod-affinity term (with the zone
        # key) for a TaskRun's pod, no pin, no gate.
        stored = api.create(together, dry_run=True)
        affinity = (stored["spec"].get("affinity") or {}).get("podAffinity") or {}
        keys = [t.get("topologyKey") for t in affinity.get(REQUIRED) or []]
        assert keys == [ZONE], stored["spec"].get("affinity")
        assert not stored["spec"].get("schedulingGates"), stored["spec"]
        assert "nodeAffinity" not in (stored["spec"].get("affinity") or {})


@pytest.mark.usefixtures("pool")
def test_a_volume_only_usable_elsewhere_moves_the_run_to_it(
    e2e: E2E, namespace: Callable[..., str]
) -> None:
    """tektoncd/pipeline #3545: the run's next task mounts data that lives on another node
    than the one the run was put on. Nothing runs yet, so the run goes where the data is."""
    e2e.require("scheduler", "controller-manager", "reconciler")
    api = e2e.api
    ns = namespace(mode="pipelineruns")
    run, placeholder, first = start(e2e, ns)
    old_node = node(first)
    pod_phase(api, run.pods["build"], "Succeeded")
    data_node = next(name for name in sorted(POOL_NODES) if name != old_node)
    bound_claim(api, ns, "source", pinned=(HOSTNAME, data_node))
    manifest = run.pod_manifest("test", fixture=ONE_WORKSPACE, claims={"pvc-1f1344866c": "source"})
    run.submit("test", in_pool(manifest))
    since, message = unschedulable(api, ns, run.pod_name("test"), "PersistentVolume")
    moved = wait_placeholder_bound(
        api,
        ns,
        placeholder,
        not_node=old_node,
        not_uid=first["metadata"]["uid"],
        timeout=STUCK_GRACE + 20,
    )
    assert node(moved) == data_node
    wait_bound(
        api,
        ns,
        run.pod_name("test"),
        node=data_node,
        timeout=STUCK_GRACE + 20,
        remake=lambda: run.remake("test"),
    )
    took = time.time() - since
    assert took <= STUCK_GRACE + 5 + 1, f"{took:.1f}s; the scheduler said: {message}"
    relocated = wait_for(
        f"a PlaceholderRelocated Event on {placeholder}",
        lambda: events_on(api, ns, "StatefulSet", placeholder, "PlaceholderRelocated") or None,
        timeout=10,
    )
    assert "claim source" in relocated[0]["message"], relocated[0]["message"]
    assert leader_metric(e2e, "coschedule_relocations_total", reason="volume-node-affinity") >= 1
