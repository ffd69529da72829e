"""The first pod sooner: a PipelineRun's placeholder is made when the run is created, so it
is bound before Tekton creates the first TaskRun's pod, and the webhook pins that pod at
admission (no scheduling gate, no release patch). A held run gets no placeholder until it is
started; a run deleted at once leaves none behind. A first pod that beats the placeholder's
binding (the scheduler paused) waits for it at admission and is pinned, or, past the wait's
bound, is gated as before. A first pod that beats the reconciler (no placeholder made yet)
waits too, its run admitted by the webhook a moment ago. Real kube-apiserver, scheduler and
controller-manager; the test plays Tekton (the run, then its first TaskRun's pod)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator

import pytest

from coschedule.config.settings import DEFAULT_PLACEHOLDER_BIND_WAIT_SECONDS
from coschedule.marks import ANNOTATION_PINNED_NODE, run_placeholder
from tests.e2e.conftest import E2E
from tests.e2e.kube import Api, Obj, dump, wait_for
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


@contextlib.contextmanager
def paused(e2e: E2E, *names: str) -> Iterator[Callable[[], None]]:
    """The named processes stopped (SIGSTOP) until the yielded ``resume`` is called or the
    block ends."""
    procs = [e2e.plane.procs[name] for name in names]
    for proc in procs:
        os.kill(proc.pid, signal.SIGSTOP)
    resumed = False

    def resume() -> None:
        nonlocal resumed
        if not resumed:
            resumed = True
            for proc in procs:
                os.kill(proc.pid, signal.SIGCONT)

    try:
        yield resume
    finally:
        resume()


def scheduler_paused(e2e: E2E) -> contextlib.AbstractContextManager[Callable[[], None]]:
    """kube-scheduler stopped (it binds nothing, nor says a pod is Unschedulable): the
    placeholder's pod is made and stays unbound, as when Tekton's first pod beats the
    scheduler."""
    return paused(e2e, "kube-scheduler")


def reconcilers_paused(e2e: E2E) -> contextlib.AbstractContextManager[Callable[[], None]]:
    """Every reconciler replica stopped (it makes no placeholder): the run's first pod comes
    before its placeholder's StatefulSet, as when Tekton is quicker than the reconciler."""
    return paused(e2e, *e2e.product.reconcilers)


def placeholder_pod_made(api: Api, ns: str, placeholder: str) -> Obj:
    """The placeholder's pod as kube-controller-manager made it (not bound: paused)."""
    return wait_for(
        f"kube-controller-manager to make {placeholder}'s pod",
        lambda: api.get("Pod", f"{placeholder}-0", ns),
        timeout=30,
    )


def test_a_first_pod_that_beats_its_placeholders_binding_waits_and_is_pinned_at_admission(
    e2e: E2E, namespace: Callable[..., str]
) -> None:
    """The race the seed loses at times: Tekton's first pod comes while the placeholder's
    pod is made but not bound yet. The webhook holds the admission, and the binding (the
    scheduler resumed 0.6 s later) arrives through its watch: pinned at admission."""
    e2e.require("scheduler", "controller-manager", "reconciler")
    api = e2e.api
    ns = namespace(mode="pipelineruns")
    with scheduler_paused(e2e) as resume:
        run = TektonRun(api, ns, unique("pr"), started=True).create()
        placeholder = run_placeholder(ns, run.name)
        made = placeholder_pod_made(api, ns, placeholder)
        assert not made["spec"].get("nodeName"), dump(made)
        time.sleep(0.3)  # the webhook's watch has the pod by then
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            began = time.monotonic()
            creating = pool.submit(run.create_pod, "build", fixture=NO_WORKSPACE)
            time.sleep(0.6)
            assert not creating.done(), "admitted before the placeholder was bound"
            resume()
            first = creating.result(timeout=30)
            took = time.monotonic() - began
    assert 0.6 <= took < 5, took  # held for the binding, inside the webhook's timeout
    pinned_at_admission(api, run, placeholder, first)


def pinned_at_admission(api: Api, run: TektonRun, placeholder: str, first: Obj) -> None:
    """The run's first pod pinned at admission to its placeholder's node, and bound there."""
    ns = run.namespace
    there = node(wait_placeholder_bound(api, ns, placeholder))
    assert not gated(first), dump(first)
    assert pinned_to(first) == [there], dump(first)
    assert first["metadata"]["annotations"][ANNOTATION_PINNED_NODE] == there
    now = wait_bound(api, ns, run.pod_name("build"), node=there)
    assert now["metadata"]["uid"] == first["metadata"]["uid"], dump(now)


def test_a_placeholder_not_bound_within_the_wait_leaves_the_first_pod_gated(
    e2e: E2E, namespace: Callable[..., str]
) -> None:
    """The same, the scheduler paused past the bound: the pod is gated after the wait, as
    without it, and the run's next pod is gated at once; resumed, the reconciler releases
    the first onto the placeholder's node."""
    e2e.require("scheduler", "controller-manager", "reconciler")
    api = e2e.api
    ns = namespace(mode="pipelineruns")
    with scheduler_paused(e2e):
        run = TektonRun(api, ns, unique("pr"), started=True).create()
        placeholder = run_placeholder(ns, run.name)
        placeholder_pod_made(api, ns, placeholder)
        time.sleep(0.3)
        began = time.monotonic()
        first = run.create_pod("build", fixture=NO_WORKSPACE)
        took = time.monotonic() - began
        assert gated(first), dump(first)
        assert pinned_to(first) == [], dump(first)
        assert DEFAULT_PLACEHOLDER_BIND_WAIT_SECONDS * 0.9 <= took < 5, took
        began = time.monotonic()
        later = run.create_pod("test", fixture=NO_WORKSPACE)
        assert gated(later), dump(later)
        assert time.monotonic() - began < DEFAULT_PLACEHOLDER_BIND_WAIT_SECONDS * 0.5
    there = node(wait_placeholder_bound(api, ns, placeholder))
    released = wait_bound(api, ns, run.pod_name("build"), node=there)
    assert released["metadata"]["uid"] == first["metadata"]["uid"], dump(released)


def test_a_first_pod_before_its_placeholder_is_made_waits_and_is_pinned_at_admission(
    e2e: E2E, namespace: Callable[..., str]
) -> None:
    """The other race: Tekton's first pod comes before the reconciler made the placeholder
    at all. The webhook admitted the run a moment ago (its run webhook), so the pod is held;
    the reconciler resumed, the StatefulSet, its pod and the binding arrive through the
    webhook's watches: pinned at admission."""
    e2e.require("scheduler", "controller-manager", "reconciler")
    api = e2e.api
    ns = namespace(mode="pipelineruns")
    with reconcilers_paused(e2e) as resume:
        run = TektonRun(api, ns, unique("pr"), started=True).create()
        placeholder = run_placeholder(ns, run.name)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            began = time.monotonic()
            creating = pool.submit(run.create_pod, "build", fixture=NO_WORKSPACE)
            time.sleep(0.2)
            assert not creating.done(), "admitted before the placeholder was made"
            assert api.get("StatefulSet", placeholder, ns) is None
            resume()
            first = creating.result(timeout=30)
            took = time.monotonic() - began
    assert 0.2 <= took < 5, took
    pinned_at_admission(api, run, placeholder, first)
