"""What the API server stores once the real MutatingWebhookConfiguration calls the webhook,
and what kubectl users see when a pod is refused. Placement is the default, ``auto``: a
TaskRun's pod is placed by node name (here, before any placeholder is bound: gated); other
pods carry the pod-affinity term."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from coschedule.marks import GATE_PLACEHOLDER, claim_placeholder, run_placeholder
from tests.e2e.conftest import E2E
from tests.e2e.kube import Obj, dump
from tests.e2e.world import TektonRun, bare_pod, bound_claim, create_pod, unique

pytestmark = pytest.mark.e2e

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


def placeholder_terms(pod: Obj) -> list[Obj]:
    affinity = (pod.get("spec") or {}).get("affinity") or {}
    terms = (affinity.get("podAffinity") or {}).get(REQUIRED) or []
    return [
        t
        for t in terms
        if ((t.get("labelSelector") or {}).get("matchLabels") or {}).get(
            "app.kubernetes.io/component"
        )
        == "affinity-assistant"
    ]


def gated(pod: Obj) -> bool:
    return {"name": GATE_PLACEHOLDER} in ((pod.get("spec") or {}).get("schedulingGates") or [])


def test_workspaces_pod_is_stored_with_its_placement_and_mark(
    e2e: E2E, namespace: Callable[..., str]
) -> None:
    """A TaskRun's pod (placement auto): no pod-affinity term; its placeholder is not bound
    yet, so it waits behind the placeholder's scheduling gate (the reconciler pins it)."""
    ns = namespace()
    run = TektonRun(e2e.api, ns, unique("pr")).create()
    stored = run.create_pod("build", claims={"pvc-1f1344866c": "source"})

    placeholder = claim_placeholder(ns, "source")
    meta = stored["metadata"]
    assert meta["labels"].get("coschedule.dev/placeholder") == placeholder, dump(stored)
    annotations = meta.get("annotations") or {}
    assert annotations.get("coschedule.dev/mode") == "workspaces", dump(stored)
    assert annotations.get("coschedule.dev/run") == run.name, dump(stored)
    assert placeholder_terms(stored) == [], dump(stored)
    assert gated(stored), dump(stored)
    # What Tekton set is still there: labels, owner, the workspace claim.
    assert meta["labels"]["tekton.dev/pipelineRun"] == run.name
    assert meta["ownerReferences"][0]["kind"] == "TaskRun"
    claims = [
        v["persistentVolumeClaim"]["claimName"]
        for v in stored["spec"]["volumes"]
        if "persistentVolumeClaim" in v
    ]
    assert claims == ["source"], dump(stored)


def test_user_affinity_is_kept(e2e: E2E, namespace: Callable[..., str]) -> None:
    ns = namespace(mode="pipelineruns")
    bound_claim(e2e.api, ns, "source", wait=False)  # the webhook needs it to exist
    run = TektonRun(e2e.api, ns, unique("pr")).create()
    manifest = run.pod_manifest(
        "build", fixture="tekton-taskrun-user-affinity", claims={"pvc-1dd779aeb3": "source"}
    )
    submitted = manifest["spec"]["affinity"]
    # A TaskRun's pod (placement auto): every rule of the user's as submitted, and the gate.
    taskrun_pod = create_pod(e2e.api, copy.deepcopy(manifest))
    assert taskrun_pod["spec"]["affinity"] == submitted, dump(taskrun_pod)
    assert gated(taskrun_pod), dump(taskrun_pod)
    # The same pod without an owner that makes it again: the pod-affinity term.
    manifest["metadata"]["name"] += "-bare"
    del manifest["metadata"]["ownerReferences"]
    stored = create_pod(e2e.api, manifest)
    affinity = stored["spec"]["affinity"]
    # Node affinity and anti-affinity untouched; pod affinity grew by exactly our term.
    assert affinity["nodeAffinity"] == submitted["nodeAffinity"], dump(stored)
    assert affinity["podAntiAffinity"] == submitted["podAntiAffinity"], dump(stored)
    before = (submitted.get("podAffinity") or {}).get(REQUIRED) or []
    after = affinity["podAffinity"].get(REQUIRED) or []
    assert after[: len(before)] == before, dump(stored)
    assert len(after) == len(before) + 1, dump(stored)
    assert placeholder_terms(stored)[0]["labelSelector"]["matchLabels"][
        "app.kubernetes.io/instance"
    ] == run_placeholder(ns, run.name)
    assert stored["spec"]["nodeSelector"] == manifest["spec"]["nodeSelector"]
    assert (
        stored["spec"]["tolerations"][: len(manifest["spec"]["tolerations"])]
        == (manifest["spec"]["tolerations"])
    )


def test_pipelineruns_mode_groups_pods_without_claims(
    e2e: E2E, namespace: Callable[..., str]
) -> None:
    ns = namespace(mode="pipelineruns")
    run = TektonRun(e2e.api, ns, unique("pr")).create()
    stored = run.create_pod("report", fixture="tekton-taskrun-no-workspace")
    assert stored["metadata"]["labels"].get("coschedule.dev/placeholder") == run_placeholder(
        ns, run.name
    ), dump(stored)
    assert gated(stored), dump(stored)
    # A pod of the run without a TaskRun to make it again: tied by pod affinity.
    bare = e2e.api.create(bare_pod(ns, "bare", {"tekton.dev/pipelineRun": run.name}))
    assert bare["metadata"]["labels"]["coschedule.dev/placeholder"] == run_placeholder(
        ns, run.name
    ), dump(bare)
    assert len(placeholder_terms(bare)) == 1, dump(bare)
    assert not gated(bare), dump(bare)


def test_pods_that_are_not_ours_are_left_alone(e2e: E2E, namespace: Callable[..., str]) -> None:
    ns = namespace(mode="pipelineruns")
    # No run label: not part of a run.
    plain = e2e.api.create(bare_pod(ns, "plain"))
    assert "coschedule.dev/placeholder" not in (plain["metadata"].get("labels") or {})
    assert not placeholder_terms(plain)
    # Disabled by label on the run.
    optout = e2e.api.create(
        bare_pod(ns, "optout", {"coschedule.dev/group": "g", "coschedule.dev/mode": "disabled"})
    )
    assert not placeholder_terms(optout), dump(optout)
    # A namespace that is not enabled: the namespaceSelector never calls the webhook.
    other = unique("e2e-not-enabled")
    e2e.api.create(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": other, "labels": {"e2e": "true"}},
        }
    )
    try:
        e2e.api.create(
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": "ci-builder", "namespace": other},
            }
        )
        untouched = e2e.api.create(bare_pod(other, "run-pod", {"coschedule.dev/group": "g"}))
        assert not placeholder_terms(untouched), dump(untouched)
    finally:
        e2e.api.delete("Namespace", other)


def test_dry_run_create_is_mutated_and_not_stored(e2e: E2E, namespace: Callable[..., str]) -> None:
    ns = namespace(mode="pipelineruns")
    pod = bare_pod(ns, "dry", {"coschedule.dev/group": "g1"})
    answered = e2e.api.create(pod, dry_run=True)
    assert answered["metadata"]["labels"]["coschedule.dev/placeholder"] == run_placeholder(ns, "g1")
    assert e2e.api.get("Pod", "dry", ns) is None


def test_two_claims_in_workspaces_mode_refused_by_kubectl(
    e2e: E2E, namespace: Callable[..., str], tmp_path: Path
) -> None:
    ns = namespace()
    run = TektonRun(e2e.api, ns, unique("pr")).create()
    manifest = run.pod_manifest(
        "test",
        fixture="tekton-taskrun-two-workspaces",
        claims={"pvc-1f1344866c": "source", "pvc-f87b6a85f3": "cache"},
    )
    path = tmp_path / "pod.json"
    path.write_text(json.dumps(manifest))
    done = e2e.kubectl_run("create", "-f", str(path))
    assert done.returncode != 0, f"kubectl create succeeded:\n{done.stdout}"
    assert "admission webhook" in done.stderr, done.stderr
    assert "denied the request" in done.stderr, done.stderr
    assert "workspaces-single-claim" in done.stderr, done.stderr
    assert "source" in done.stderr, done.stderr
    assert "cache" in done.stderr, done.stderr
    assert "pipelineruns" in done.stderr, done.stderr  # the suggested fix
    assert e2e.api.get("Pod", manifest["metadata"]["name"], ns) is None
