"""Volume co-location (TEP-0135, issue 4). By default the placeholder mounts the run's
claims as the engine made them: a WaitForFirstConsumer claim is provisioned where the
placeholder runs (it is their first consumer: the run's pods wait for it), one volume per
workspace. With ``rewrite-claims`` on, a run's template workspaces become the placeholder's
volumeClaimTemplates instead. An existing claim is mounted by the placeholder either way, so
the run goes where its data is."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from coschedule.marks import run_placeholder
from tests.e2e.conftest import E2E
from tests.e2e.kube import Api, ApiError, Obj, dump, wait_for
from tests.e2e.runs import (
    node,
    wait_bound,
    wait_placeholder_bound,
    wait_statefulset,
    wait_statefulset_gone,
)
from tests.e2e.world import WFFC_CLASS, TektonRun, bound_claim, describe_namespace, unique

pytestmark = pytest.mark.e2e


def template_claim(api: Api, run: TektonRun, name: str) -> Obj:
    """A claim Tekton made from a volumeClaimTemplate workspace: owned by the PipelineRun,
    on a WaitForFirstConsumer class, unbound."""
    return api.create(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {
                "name": name,
                "namespace": run.namespace,
                "labels": {"tekton.dev/pipelineRun": run.name},
                "ownerReferences": [
                    {
                        "apiVersion": "tekton.dev/v1",
                        "kind": "PipelineRun",
                        "name": run.name,
                        "uid": run.uid,
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": WFFC_CLASS,
                "resources": {"requests": {"storage": "1Gi"}},
            },
        }
    )


def claims_by_volume(pod: Obj) -> dict[str, str]:
    return {
        v["name"]: v["persistentVolumeClaim"]["claimName"]
        for v in pod["spec"].get("volumes") or []
        if "persistentVolumeClaim" in v
    }


@pytest.fixture
def claim_rewrite_on(e2e: E2E) -> Iterator[None]:
    """``rewrite-claims: "true"`` in the cluster config for one scenario, then back off;
    ready once the webhook rewrites a dry-run pod of a probe run."""
    assert e2e.product.config_dir is not None
    path = e2e.product.config_dir / "rewrite-claims"
    path.write_text("true")
    try:
        yield
    finally:
        path.unlink()


def wait_rewrite_in_force(api: Api, run: TektonRun, claim: str) -> None:
    probe = run.pod_manifest("probe", claims={"pvc-1f1344866c": claim})

    def rewritten() -> bool:
        try:
            stored = api.create(probe, dry_run=True)
        except ApiError:
            return False  # e.g. the claim is not in the webhook's cache yet
        return claim not in claims_by_volume(stored).values()

    wait_for("the webhook to reload rewrite-claims: true", rewritten, timeout=15)


def test_by_default_one_volume_per_workspace_provisioned_where_the_placeholder_runs(
    e2e: E2E, namespace: Callable[..., str]
) -> None:
    """The default: Tekton's template claims are mounted as they are, by the pods and by the
    placeholder, and provisioned (WaitForFirstConsumer) on the placeholder's node; no other
    claim is made, none is left Pending, and the run's pods all land there."""
    e2e.require("scheduler", "controller-manager", "reconciler")
    api = e2e.api
    ns = namespace(mode="pipelineruns")
    run = TektonRun(api, ns, unique("pr")).create()
    source = template_claim(api, run, f"pvc-{unique('src')[4:]}")["metadata"]["name"]
    cache = template_claim(api, run, f"pvc-{unique('cch')[4:]}")["metadata"]["name"]
    run.create_pod("build", claims={"pvc-1f1344866c": source})
    run.create_pod(
        "test",
        fixture="tekton-taskrun-two-workspaces",
        claims={"pvc-1f1344866c": source, "pvc-f87b6a85f3": cache},
    )
    placeholder = run_placeholder(ns, run.name)
    sts = wait_statefulset(api, ns, placeholder)
    assert not sts["spec"].get("volumeClaimTemplates"), dump(sts["spec"])
    build = api.must_get("Pod", run.pod_name("build"), ns)
    test = api.must_get("Pod", run.pod_name("test"), ns)
    assert set(claims_by_volume(build).values()) == {source}
    assert set(claims_by_volume(test).values()) == {source, cache}

    pinned = node(wait_placeholder_bound(api, ns, placeholder))
    for task in ("build", "test"):
        wait_bound(api, ns, run.pod_name(task), node=pinned)
    keys = [f"{ns}/{claim}" for claim in (source, cache)]
    wait_for(
        f"{keys} provisioned",
        lambda: all(key in e2e.agents.provisioned for key in keys),
        describe=lambda: describe_namespace(api, ns),
    )
    for key in keys:
        assert e2e.agents.provisioned[key] == pinned, (
            f"{key} provisioned on {e2e.agents.provisioned[key]}, the run is on {pinned}"
        )

    def phases() -> dict[str, str]:
        return {
            c["metadata"]["name"]: str((c.get("status") or {}).get("phase"))
            for c in api.list("PersistentVolumeClaim", ns)
        }

    # Exactly the run's two workspaces, each with its one volume: nothing Pending, no copy.
    wait_for(
        "both claims Bound and no other claim",
        lambda: phases() == {source: "Bound", cache: "Bound"},
        describe=lambda: f"{phases()}\n{describe_namespace(api, ns)}",
    )
    run.finish("True")
    wait_statefulset_gone(api, ns, placeholder, "the PipelineRun reports Succeeded=True")
    assert sorted(phases()) == sorted([source, cache])  # the PipelineRun's, kept with it


@pytest.mark.usefixtures("claim_rewrite_on")
def test_two_template_workspaces_and_one_existing_claim(
    e2e: E2E, namespace: Callable[..., str]
) -> None:
    """With rewrite-claims on: the template claims become the placeholder's
    volumeClaimTemplates; the user's bound claim is mounted as it is."""
    e2e.require("scheduler", "controller-manager", "reconciler")
    api = e2e.api
    ns = namespace(mode="pipelineruns")
    bound_claim(api, ns, "shared-data")  # the user's, with data: never rewritten
    run = TektonRun(api, ns, unique("pr")).create()
    source = template_claim(api, run, f"pvc-{unique('src')[4:]}")["metadata"]["name"]
    cache = template_claim(api, run, f"pvc-{unique('cch')[4:]}")["metadata"]["name"]
    wait_rewrite_in_force(api, run, source)

    run.create_pod("build", claims={"pvc-1f1344866c": source})
    run.create_pod(
        "test",
        fixture="tekton-taskrun-two-workspaces",
        claims={"pvc-1f1344866c": source, "pvc-f87b6a85f3": cache},
    )
    run.create_pod("publish", claims={"pvc-1f1344866c": "shared-data"})

    placeholder = run_placeholder(ns, run.name)
    sts = wait_statefulset(api, ns, placeholder)
    pods = {
        task: api.must_get("Pod", run.pod_name(task), ns) for task in ("build", "test", "publish")
    }
    templates = [t["metadata"]["name"] for t in sts["spec"].get("volumeClaimTemplates") or []]
    assert len(templates) == 2, (
        f"expected two volumeClaimTemplates on {placeholder}, got {templates}; the pods mount "
        f"{ {task: claims_by_volume(pod) for task, pod in pods.items()} }\n"
        f"StatefulSet volumes: {sts['spec']['template']['spec'].get('volumes')}"
    )
    expected = {f"{t}-{placeholder}-0" for t in templates}

    # Every pod references the StatefulSet's claims, never the engine's originals.
    test_claims = claims_by_volume(pods["test"])
    assert set(test_claims.values()) == expected, dump(pods["test"]["spec"]["volumes"])
    build_claims = claims_by_volume(pods["build"])
    assert build_claims == {"ws-1bcf2": test_claims["ws-1bcf2"]}, (
        "the pods of one run disagree on the rewritten claim\n"
        f"build: {build_claims}\ntest: {test_claims}"
    )
    assert claims_by_volume(pods["publish"]) == {"ws-1bcf2": "shared-data"}

    # The StatefulSet controller made those claims; the placeholder mounts the user's.
    wait_for(
        f"claims {sorted(expected)} (made by the StatefulSet controller)",
        lambda: all(api.get("PersistentVolumeClaim", claim, ns) for claim in expected),
        describe=lambda: describe_namespace(api, ns),
    )

    # The placeholder converges to mounting the user's claim as it is (the publish pod
    # brought it), and never the engine's originals.
    def mounted() -> list[str]:
        current = api.must_get("StatefulSet", placeholder, ns)
        volumes = current["spec"]["template"]["spec"].get("volumes") or []
        return [
            v["persistentVolumeClaim"]["claimName"] for v in volumes if "persistentVolumeClaim" in v
        ]

    wait_for(
        f"placeholder {placeholder} to mount the existing claim shared-data",
        lambda: "shared-data" in mounted(),
        describe=lambda: f"it mounts {mounted()}\n{describe_namespace(api, ns)}",
    )
    assert source not in mounted(), mounted()
    assert cache not in mounted(), mounted()

    # Provisioned together where the placeholder runs, and the whole run goes there.
    pinned = node(wait_placeholder_bound(api, ns, placeholder))
    for task in pods:
        wait_bound(api, ns, run.pod_name(task), node=pinned)
    for claim in expected:
        key = f"{ns}/{claim}"
        assert e2e.agents.provisioned.get(key) == pinned, (
            f"{key} provisioned on {e2e.agents.provisioned.get(key)}, the run is on {pinned}"
        )

    # Teardown once the run is done: the StatefulSet and the claims it made go; the
    # engine's claims (the PipelineRun's to delete) and the user's stay.
    run.finish("True")
    wait_statefulset_gone(api, ns, placeholder, "the PipelineRun reports Succeeded=True")

    def gone(claim: str) -> bool:
        obj = api.get("PersistentVolumeClaim", claim, ns)
        return obj is None or bool(obj["metadata"].get("deletionTimestamp"))

    # Gone for good, storage released, although the run's finished pods (which Tekton keeps
    # until the PipelineRun is deleted) still name them: no pvc-protection left holding them.
    wait_for(
        f"the placeholder's claims {sorted(expected)} to be deleted and released",
        lambda: all(api.get("PersistentVolumeClaim", claim, ns) is None for claim in expected),
        describe=lambda: describe_namespace(api, ns),
    )
    for task in pods:
        finished = api.must_get("Pod", run.pod_name(task), ns)
        assert finished["status"]["phase"] == "Succeeded", describe_namespace(api, ns)
    for kept in (source, cache, "shared-data"):
        assert not gone(kept), f"claim {kept} was deleted\n{describe_namespace(api, ns)}"
