"""Placement by node name (``placement: auto``), the webhook's half: a Tekton TaskRun's pod
admitted before its placeholder is bound carries the placeholder's scheduling gate and no
pod-affinity term; one admitted once the placeholder's pod is bound is pinned to that node by
name, and the real scheduler binds it there. With a zone topology key the pods keep the
pod-affinity term."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from coschedule.marks import ANNOTATION_PINNED_NODE, GATE_PLACEHOLDER, run_placeholder
from tests.e2e.conftest import E2E
from tests.e2e.kube import Api, Obj, dump, wait_for
from tests.e2e.runs import node, topology_key, wait_bound, wait_placeholder_bound
from tests.e2e.world import ZONE, TektonRun, bound_claim, unique

pytestmark = pytest.mark.e2e

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
NO_WORKSPACE = "tekton-taskrun-no-workspace"


def gated(pod: Obj) -> bool:
    return {"name": GATE_PLACEHOLDER} in (pod["spec"].get("schedulingGates") or [])


def pod_affinity_terms(pod: Obj) -> list[Obj]:
    affinity = pod["spec"].get("affinity") or {}
    return list((affinity.get("podAffinity") or {}).get(REQUIRED) or [])


def pinned_to(pod: Obj) -> list[str]:
    """The nodes the pod's required node affinity names by ``metadata.name``, per term."""
    affinity = pod["spec"].get("affinity") or {}
    terms = ((affinity.get("nodeAffinity") or {}).get(REQUIRED) or {}).get("nodeSelectorTerms")
    return [
        value
        for term in terms or []
        for field in term.get("matchFields") or []
        if field["key"] == "metadata.name" and field["operator"] == "In"
        for value in field["values"]
    ]


def admitted_pinned(api: Api, manifest: Obj, node_name: str) -> None:
    """Wait until the webhook (its placeholder cache fed by a watch) pins a dry-run of the
    pod to ``node_name``: the cache may trail the API by a moment."""
    wait_for(
        f"the webhook to see the placeholder bound to {node_name}",
        lambda: pinned_to(api.create(manifest, dry_run=True)) == [node_name],
        timeout=10,
    )


def test_taskrun_pods_are_gated_before_the_placeholder_is_bound_and_pinned_after(
    e2e: E2E, namespace: Callable[..., str]
) -> None:
    e2e.require("scheduler", "controller-manager", "reconciler")
    api = e2e.api
    ns = namespace(mode="pipelineruns")
    bound_claim(api, ns, "source")
    run = TektonRun(api, ns, unique("pr")).create()
    placeholder = run_placeholder(ns, run.name)
    # The run's first pod: nobody has chosen its node yet.
    first = run.create_pod("build", claims={"pvc-1f1344866c": "source"})
    assert gated(first), dump(first)
    assert pod_affinity_terms(first) == [], dump(first)
    assert pinned_to(first) == [], dump(first)
    assert ANNOTATION_PINNED_NODE not in first["metadata"]["annotations"], dump(first)
    assert first["metadata"]["labels"]["coschedule.dev/placeholder"] == placeholder

    # The reconciler makes the placeholder for the gated pod; the scheduler binds it.
    there = node(wait_placeholder_bound(api, ns, placeholder))

    # A later pod of the run: pinned to the placeholder's node, never gated.
    manifest = run.pod_manifest("test", fixture=NO_WORKSPACE)
    admitted_pinned(api, manifest, there)
    later = run.create_pod("test", fixture=NO_WORKSPACE)
    assert pinned_to(later) == [there], dump(later)
    assert not gated(later), dump(later)
    assert pod_affinity_terms(later) == [], dump(later)
    assert later["metadata"]["annotations"][ANNOTATION_PINNED_NODE] == there
    wait_bound(api, ns, run.pod_name("test"), node=there)

    # The first pod was held until the reconciler pinned it and lifted the gate: bound
    # beside its placeholder, the same pod.
    now = wait_bound(api, ns, run.pod_name("build"), node=there)
    assert now["metadata"]["uid"] == first["metadata"]["uid"], dump(now)
    assert not gated(now), dump(now)
    assert pinned_to(now) == [there], dump(now)


def test_with_a_zone_topology_key_taskrun_pods_keep_the_pod_affinity_term(
    e2e: E2E, namespace: Callable[..., str]
) -> None:
    api = e2e.api
    ns = namespace(mode="pipelineruns")
    with topology_key(e2e, ns, ZONE):
        run = TektonRun(api, ns, unique("pr")).create()
        stored = api.create(run.pod_manifest("build", fixture=NO_WORKSPACE), dry_run=True)
        [term] = pod_affinity_terms(stored)
        assert term["topologyKey"] == ZONE, dump(stored)
        assert term["labelSelector"]["matchLabels"]["app.kubernetes.io/instance"] == (
            run_placeholder(ns, run.name)
        )
        assert not gated(stored), dump(stored)
        assert pinned_to(stored) == [], dump(stored)
