"""The first pod sooner: a PipelineRun's placeholder is made when the run is created, so it
is bound before Tekton creates the first TaskRun's pod, and the webhook pins that pod at
admission (no scheduling gate, no release patch). A held run gets no placeholder until it is
started; a run deleted at once leaves none behind. Real kube-apiserver, scheduler and
controller-manager; the test plays Tekton (the run, then its first TaskRun's pod)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from coschedule.marks import ANNOTATION_PINNED_NODE, run_placeholder
from tests.e2e.conftest import E2E
from tests.e2e.kube import dump
from tests.e2e.runs import node, wait_bound, wait_placeholder_bound, wait_statefulset_gone
from tests.e2e.test_placement import admitted_pinned, gated, pinned_to
from tests.e2e.world import NODES, TektonRun, unique

pytestmark = pytest.mark.e2e

NO_WORKSPACE = "tekton-taskrun-no-workspace"
HOST = "kubernetes.io/hostname"


def test_a_started_runs_placeholder_is_bound_before_its_first_pod_which_is_pinned(
    e2e: E2E, namespace: Callable[..., str]
) -> None:
    e2e.require("scheduler", "controller-manager", "reconciler")
    api = e2e.api
    ns = namespace(mode="pipelineruns")
    # The run's podTemplate allows one node: the placeholder goes there, as its pods would.
    allowed = sorted(NODES)[1]
    template = {"nodeSelector": {HOST: allowed}}
    run = TektonRun(
        api, ns, unique("pr"), started=True, spec={"taskRunTemplate": {"podTemplate": template}}
    ).create()
    placeholder = run_placeholder(ns, run.name)

    # No pod of the run exists yet: the placeholder is made from the run and bound.
    bound = wait_placeholder_bound(api, ns, placeholder)
    assert node(bound) == allowed, dump(bound)
    assert api.list("Pod", namespace=ns, label_selector="tekton.dev/pipelineRun") == []
    sts = api.must_get("StatefulSet", placeholder, ns)
    [owner] = sts["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"]) == ("PipelineRun", run.uid), dump(sts)
    spec = sts["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == template["nodeSelector"], dump(sts)

    # Tekton's first TaskRun pod (its podTemplate applied): pinned at admission, not gated.
    manifest = run.pod_manifest("build", fixture=NO_WORKSPACE)
    manifest["spec"]["nodeSelector"] = dict(template["nodeSelector"])
    admitted_pinned(api, manifest, allowed)  # the webhook's watch of placeholder pods
    first = run.submit("build", manifest)
    assert not gated(first), dump(first)
    assert pinned_to(first) == [allowed], dump(first)
    assert first["metadata"]["annotations"][ANNOTATION_PINNED_NODE] == allowed
    now = wait_bound(api, ns, run.pod_name("build"), node=allowed)
    assert now["metadata"]["uid"] == first["metadata"]["uid"], dump(now)

    # A later pod meets into the same placeholder; the StatefulSet is the same one.
    later = run.create_pod("test", fixture=NO_WORKSPACE)
    assert pinned_to(later) == [allowed], dump(later)
    assert api.must_get("StatefulSet", placeholder, ns)["metadata"]["uid"] == sts["metadata"]["uid"]

    # Done: torn down as any run's placeholder.
    run.finish()
    wait_statefulset_gone(api, ns, placeholder, "the run is done")


def test_a_held_run_gets_no_placeholder_until_it_is_started(
    e2e: E2E, namespace: Callable[..., str]
) -> None:
    e2e.require("scheduler", "controller-manager", "reconciler")
    api = e2e.api
    ns = namespace(mode="pipelineruns")
    held = TektonRun(api, ns, unique("pr")).create()  # stored PipelineRunPending
    started = TektonRun(api, ns, unique("pr"), started=True).create()
    # The started run's placeholder is made: by then the held one's would have been too.
    wait_placeholder_bound(api, ns, run_placeholder(ns, started.name))
    time.sleep(2)
    assert api.get("StatefulSet", run_placeholder(ns, held.name), ns) is None
    # Started (its pending mark removed, as concurrency control does): made now.
    api.patch("PipelineRun", held.name, {"spec": {"status": None}}, ns)
    wait_placeholder_bound(api, ns, run_placeholder(ns, held.name))


def test_a_run_deleted_at_once_leaves_no_placeholder(
    e2e: E2E, namespace: Callable[..., str]
) -> None:
    e2e.require("scheduler", "controller-manager", "reconciler")
    api = e2e.api
    ns = namespace(mode="pipelineruns")
    runs = [TektonRun(api, ns, unique("pr"), started=True).create() for _ in range(3)]
    for run in runs:
        api.delete("PipelineRun", run.name, ns)
    # Made or not before the delete was seen, none stays (owned by the run; asked again).
    for run in runs:
        wait_statefulset_gone(api, ns, run_placeholder(ns, run.name), "its run was deleted")
    time.sleep(2)
    for run in runs:
        assert api.get("StatefulSet", run_placeholder(ns, run.name), ns) is None
