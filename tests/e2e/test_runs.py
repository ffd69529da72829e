"""A Tekton-shaped run in each mode lands on one node with its placeholder; runs spread
over nodes (isolate mode: one per node); placeholders go when the run is done or its owner
is deleted."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from coschedule.marks import claim_placeholder, run_placeholder
from tests.e2e.conftest import E2E
from tests.e2e.kube import dump, wait_for
from tests.e2e.runs import (
    PLACEHOLDER_LABELS,
    claim_names,
    node,
    wait_bound,
    wait_placeholder_bound,
    wait_statefulset,
    wait_statefulset_gone,
)
from tests.e2e.world import (
    TektonRun,
    bound_claim,
    create_pod,
    describe_namespace,
    pod_phase,
    strip_service_account_volume,
    unique,
)
from tests.fixtures import load_pod

pytestmark = pytest.mark.e2e

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
NEEDS = ("scheduler", "controller-manager", "reconciler")


def owner_uids(obj: dict[str, object]) -> dict[str, str]:
    meta = obj["metadata"]
    assert isinstance(meta, dict)
    return {str(ref["kind"]): str(ref["uid"]) for ref in meta.get("ownerReferences") or []}


def start_run(e2e: E2E, ns: str, per_run: bool) -> tuple[TektonRun, str, list[str]]:
    """Claims, a PipelineRun and its first task pods; returns (run, placeholder, tasks)."""
    api = e2e.api
    bound_claim(api, ns, "source")
    bound_claim(api, ns, "cache")
    run = TektonRun(api, ns, unique("pr")).create()
    run.create_pod("build", claims={"pvc-1f1344866c": "source"})
    if per_run:
        run.create_pod(
            "test",
            fixture="tekton-taskrun-two-workspaces",
            claims={"pvc-1f1344866c": "source", "pvc-f87b6a85f3": "cache"},
        )
        run.create_pod("report", fixture="tekton-taskrun-no-workspace")
        return run, run_placeholder(ns, run.name), ["build", "test", "report"]
    run.create_pod("lint", claims={"pvc-1f1344866c": "source"})
    return run, claim_placeholder(ns, "source"), ["build", "lint"]


@pytest.mark.parametrize("mode", ["workspaces", "pipelineruns", "isolate-pipelinerun"])
def test_run_lands_on_one_node(e2e: E2E, namespace: Callable[..., str], mode: str) -> None:
    e2e.require(*NEEDS)
    api = e2e.api
    ns = namespace(mode=mode)
    per_run = mode != "workspaces"
    run, placeholder, tasks = start_run(e2e, ns, per_run)

    sts = wait_statefulset(api, ns, placeholder)
    assert sts["spec"]["replicas"] == 1, dump(sts)
    template = sts["spec"]["template"]
    for key, value in PLACEHOLDER_LABELS.items():
        assert template["metadata"]["labels"].get(key) == value, dump(sts)
    assert template["metadata"]["labels"]["app.kubernetes.io/instance"] == placeholder
    # The placeholder mounts every claim of the run (of the group's claim in workspaces
    # mode); pods arrive one by one, so the StatefulSet converges to that.
    expected_claims = {"source", "cache"} if per_run else {"source"}
    sts = wait_for(
        f"placeholder {placeholder} to mount {sorted(expected_claims)}",
        lambda: (
            current
            if (current := api.get("StatefulSet", placeholder, ns)) is not None
            and set(claim_names(current)) == expected_claims
            else None
        ),
        describe=lambda: dump(api.get("StatefulSet", placeholder, ns)),
    )
    if per_run:
        assert owner_uids(sts).get("PipelineRun") == run.uid, dump(sts["metadata"])
    anti = (template["spec"].get("affinity") or {}).get("podAntiAffinity") or {}
    if mode == "isolate-pipelinerun":
        assert anti.get(REQUIRED), f"isolate mode needs required anti-affinity:\n{dump(sts)}"
    else:
        # Kept apart by the spread constraint alone: no inter-pod term on the placeholder.
        assert not anti, dump(sts)
        [spread] = template["spec"]["topologySpreadConstraints"]
        assert spread["whenUnsatisfiable"] == "ScheduleAnyway", dump(sts)

    pinned = node(wait_placeholder_bound(api, ns, placeholder))
    for task in tasks:
        wait_bound(api, ns, run.pod_name(task), node=pinned)
    if not per_run:
        # In workspaces mode a task without a claim is not grouped: it goes anywhere.
        other = run.create_pod("report", fixture="tekton-taskrun-no-workspace")
        assert "coschedule.dev/placeholder" not in other["metadata"]["labels"], dump(other)
    # Exactly one placeholder for the run.
    names = [s["metadata"]["name"] for s in api.list("StatefulSet", ns)]
    assert names == [placeholder], describe_namespace(api, ns)


def runs_on_nodes(e2e: E2E, ns: str, count: int, tasks: tuple[str, ...]) -> list[str]:
    """Make ``count`` runs of claimless ``tasks`` at once; each run's node, once its
    placeholder is bound and every task pod is bound beside it."""
    api = e2e.api
    runs = [TektonRun(api, ns, unique("pr")).create() for _ in range(count)]
    for run in runs:
        for task in tasks:
            run.create_pod(task, fixture="tekton-taskrun-no-workspace")
    nodes = []
    for run in runs:
        pinned = node(wait_placeholder_bound(api, ns, run_placeholder(ns, run.name)))
        for task in tasks:
            wait_bound(api, ns, run.pod_name(task), node=pinned)
        nodes.append(pinned)
    return nodes


def test_isolate_mode_puts_two_runs_on_two_nodes(e2e: E2E, namespace: Callable[..., str]) -> None:
    e2e.require(*NEEDS)
    ns = namespace(mode="isolate-pipelinerun")
    nodes = runs_on_nodes(e2e, ns, 2, ("report", "notify"))
    assert nodes[0] != nodes[1], describe_namespace(e2e.api, ns)


def test_runs_of_a_namespace_spread_over_nodes(e2e: E2E, namespace: Callable[..., str]) -> None:
    """Not isolated, the runs may share a node, but their placeholders' spread constraint
    makes the real kube-scheduler put three runs on three nodes while nodes are free."""
    e2e.require(*NEEDS)
    ns = namespace(mode="pipelineruns")
    nodes = runs_on_nodes(e2e, ns, 3, ("report",))
    assert len(set(nodes)) == 3, (nodes, describe_namespace(e2e.api, ns))


def test_teardown_after_completion(e2e: E2E, namespace: Callable[..., str]) -> None:
    e2e.require(*NEEDS)
    api = e2e.api
    ns = namespace(mode="pipelineruns")
    bound_claim(api, ns, "source")
    run = TektonRun(api, ns, unique("pr")).create()
    run.create_pod("build", claims={"pvc-1f1344866c": "source"})
    placeholder = run_placeholder(ns, run.name)
    sts = wait_statefulset(api, ns, placeholder)
    pinned = node(wait_bound(api, ns, run.pod_name("build")))

    # A gap between tasks: the only pod is done, the run is not. The placeholder stays.
    pod_phase(api, api.must_get("Pod", run.pod_name("build"), ns), "Succeeded")
    time.sleep(3)
    still = api.get("StatefulSet", placeholder, ns)
    gap = "the placeholder went during a gap between tasks of a running PipelineRun\n"
    assert still is not None, gap + describe_namespace(api, ns)
    assert still["metadata"]["uid"] == sts["metadata"]["uid"], gap + describe_namespace(api, ns)
    # The next task follows the placeholder.
    run.create_pod("report", fixture="tekton-taskrun-no-workspace")
    wait_bound(api, ns, run.pod_name("report"), node=pinned)

    run.finish("True")
    wait_statefulset_gone(api, ns, placeholder, "the PipelineRun reports Succeeded=True")
    # The user's claim is never the reconciler's to delete.
    claim = api.get("PersistentVolumeClaim", "source", ns)
    assert claim is not None, "the user's claim was deleted"
    assert not claim["metadata"].get("deletionTimestamp"), dump(claim)


def test_teardown_after_owner_deletion(e2e: E2E, namespace: Callable[..., str]) -> None:
    e2e.require(*NEEDS)
    api = e2e.api
    ns = namespace(mode="pipelineruns")
    run = TektonRun(api, ns, unique("pr")).create()
    run.create_pod("report", fixture="tekton-taskrun-no-workspace")
    placeholder = run_placeholder(ns, run.name)
    sts = wait_statefulset(api, ns, placeholder)
    assert owner_uids(sts).get("PipelineRun") == run.uid, dump(sts["metadata"])
    wait_bound(api, ns, run.pod_name("report"))

    api.delete("PipelineRun", run.name, ns)
    wait_statefulset_gone(api, ns, placeholder, "its PipelineRun was deleted")


def test_later_task_with_a_new_claim_keeps_the_run_on_its_node(
    e2e: E2E, namespace: Callable[..., str]
) -> None:
    """Tekton creates task pods one after the other: the placeholder learns of a claim only
    when the first pod mounting it arrives. Growing the placeholder must not move the run
    away from the pods already running (their RWO volumes are attached there)."""
    e2e.require(*NEEDS)
    api = e2e.api
    ns = namespace(mode="pipelineruns")
    bound_claim(api, ns, "source")
    bound_claim(api, ns, "cache")
    run = TektonRun(api, ns, unique("pr")).create()
    run.create_pod("build", claims={"pvc-1f1344866c": "source"})
    placeholder = run_placeholder(ns, run.name)
    pinned = node(wait_placeholder_bound(api, ns, placeholder))
    wait_bound(api, ns, run.pod_name("build"), node=pinned)

    run.create_pod(
        "test",
        fixture="tekton-taskrun-two-workspaces",
        claims={"pvc-1f1344866c": "source", "pvc-f87b6a85f3": "cache"},
    )
    wait_bound(api, ns, run.pod_name("test"), node=pinned)
    ph = wait_placeholder_bound(api, ns, placeholder)
    assert node(ph) == pinned, describe_namespace(api, ns)
    build = api.must_get("Pod", run.pod_name("build"), ns)
    assert node(build) == pinned
    assert not build["metadata"].get("deletionTimestamp")


def test_argo_workflow_run_lands_together_and_is_torn_down(
    e2e: E2E, namespace: Callable[..., str]
) -> None:
    """The same for an Argo Workflow: run identity from its label, the Workflow as owner,
    done when its status.phase is Succeeded."""
    e2e.require(*NEEDS)
    api = e2e.api
    ns = namespace(mode="pipelineruns")
    bound_claim(api, ns, "workdir")
    name = unique("wf")
    workflow = api.create(
        {
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Workflow",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"entrypoint": "main"},
        }
    )
    api.patch("Workflow", name, {"status": {"phase": "Running"}}, ns, subresource="status")
    owner = {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "name": name,
        "uid": workflow["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    pods = []
    for step in ("build", "test"):
        pod = load_pod("argo-workflow-pod")
        pod["metadata"].update(name=f"{name}-{step}", namespace=ns, ownerReferences=[owner])
        pod["metadata"]["labels"]["workflows.argoproj.io/workflow"] = name
        pod["spec"]["serviceAccountName"] = "ci-builder"
        for volume in pod["spec"]["volumes"]:
            if "persistentVolumeClaim" in volume:
                volume["persistentVolumeClaim"]["claimName"] = "workdir"
        strip_service_account_volume(pod["spec"])
        pods.append(create_pod(api, pod))

    placeholder = run_placeholder(ns, name)
    sts = wait_statefulset(api, ns, placeholder)
    assert owner_uids(sts).get("Workflow") == workflow["metadata"]["uid"], dump(sts["metadata"])
    pinned = node(wait_placeholder_bound(api, ns, placeholder))
    for pod in pods:
        wait_bound(api, ns, pod["metadata"]["name"], node=pinned)

    for pod in pods:
        pod_phase(api, pod, "Succeeded")
    api.patch("Workflow", name, {"status": {"phase": "Succeeded"}}, ns, subresource="status")
    wait_statefulset_gone(api, ns, placeholder, "the Workflow's phase is Succeeded")


def test_a_pod_pinned_by_tekton_s_own_assistant_too_is_told_once(
    e2e: E2E, namespace: Callable[..., str]
) -> None:
    """Tekton's assistant left on: its term on the TaskRun pod as well as our placement. A
    Warning on the pod and one on the PipelineRun, once each; the pod cannot schedule (no such
    placeholder here), and the reconciler's looks at it do not repeat them."""
    e2e.require("reconciler")
    api = e2e.api
    ns = namespace(mode="pipelineruns")
    bound_claim(api, ns, "source")
    run = TektonRun(api, ns, unique("pr")).create()
    manifest = run.pod_manifest("build", claims={"pvc-1f1344866c": "source"})
    tekton = {
        "labelSelector": {
            "matchLabels": {
                "app.kubernetes.io/instance": "affinity-assistant-0123456789",
                "app.kubernetes.io/component": "affinity-assistant",
            }
        },
        "topologyKey": "kubernetes.io/hostname",
    }
    manifest["spec"]["affinity"] = {"podAffinity": {REQUIRED: [tekton]}}
    pod = create_pod(api, manifest)
    terms = pod["spec"]["affinity"]["podAffinity"][REQUIRED]
    # Tekton's term stays; ours is the placement by node name (placement auto): the gate.
    assert terms == [tekton], dump(pod)
    assert {"name": "coschedule.dev/placeholder"} in pod["spec"]["schedulingGates"], dump(pod)

    def told() -> list[tuple[str, str, str]]:
        return sorted(
            (e["involvedObject"]["kind"], e["involvedObject"]["name"], e["involvedObject"]["uid"])
            for e in api.list("Event", ns)
            if e.get("reason") == "TektonAffinityAssistantConflict"
        )

    want = [
        ("PipelineRun", run.name, run.uid),
        ("Pod", pod["metadata"]["name"], pod["metadata"]["uid"]),
    ]
    wait_for("a Warning on the pod and on its PipelineRun", lambda: told() == want, timeout=15)
    api.patch("Pod", pod["metadata"]["name"], {"metadata": {"labels": {"looked": "again"}}}, ns)
    time.sleep(2.0)
    assert told() == want
