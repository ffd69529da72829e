"""Reconciler restarts and leader handover mid-run lose nothing: no placeholder deleted,
none duplicated, and what changed while nobody led is converged after."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from coschedule.marks import run_placeholder
from tests.e2e.conftest import E2E, RECONCILER_REPLICAS
from tests.e2e.kube import dump, wait_for
from tests.e2e.runs import (
    wait_bound,
    wait_placeholder_bound,
    wait_statefulset,
    wait_statefulset_gone,
)
from tests.e2e.world import TektonRun, describe_namespace, unique

pytestmark = pytest.mark.e2e

LEASE_DURATION = 15.0  # the design's lease; the follower must take over within about that


@pytest.fixture
def replicas(e2e: E2E) -> Iterator[None]:
    """Whatever a scenario stops, every replica runs again afterwards."""
    e2e.require("scheduler", "controller-manager", "reconciler")
    yield
    for name in RECONCILER_REPLICAS:
        proc = e2e.product.reconcilers.get(name)
        if proc is None or not proc.alive():
            e2e.product.reconcilers.pop(name, None)
            e2e.product.start_reconciler(name)


def statefulsets(e2e: E2E, ns: str) -> dict[str, str]:
    return {s["metadata"]["name"]: s["metadata"]["uid"] for s in e2e.api.list("StatefulSet", ns)}


def start_run(e2e: E2E, ns: str) -> TektonRun:
    run = TektonRun(e2e.api, ns, unique("pr")).create()
    run.create_pod("report", fixture="tekton-taskrun-no-workspace")
    wait_placeholder_bound(e2e.api, ns, run_placeholder(ns, run.name))
    return run


@pytest.mark.usefixtures("replicas")
def test_leader_handover_mid_run(e2e: E2E, namespace: Callable[..., str]) -> None:
    if len(e2e.product.reconcilers) < 2:
        pytest.skip("e2e: needs two reconciler replicas")
    api = e2e.api
    ns = namespace(mode="pipelineruns")
    running = start_run(e2e, ns)
    before = statefulsets(e2e, ns)

    leader = wait_for(
        "a reconciler to hold the Lease",
        e2e.product.leader,
        describe=lambda: str(e2e.product.leases()),
    )
    follower = next(name for name in e2e.product.reconcilers if name != leader)
    e2e.product.reconcilers[leader].kill()  # SIGKILL: no chance to release the Lease
    killed_at = time.monotonic()

    # Work that arrives while nobody leads.
    late = TektonRun(api, ns, unique("pr")).create()
    late.create_pod("report", fixture="tekton-taskrun-no-workspace")

    wait_for(
        f"{follower} to take the Lease over from the killed {leader}",
        lambda: e2e.product.leader() == follower,
        timeout=LEASE_DURATION + 15,
        interval=0.5,
        describe=lambda: (
            f"leases: {e2e.product.leases()}\n{e2e.product.reconcilers[follower].tail(20)}"
        ),
    )
    took = time.monotonic() - killed_at
    assert took <= LEASE_DURATION + 5, f"takeover took {took:.1f}s"

    late_placeholder = run_placeholder(ns, late.name)
    wait_statefulset(api, ns, late_placeholder)
    wait_bound(api, ns, late.pod_name("report"))
    after = statefulsets(e2e, ns)
    assert {k: v for k, v in after.items() if k in before} == before, (
        "a placeholder was deleted or replaced during the handover\n" + describe_namespace(api, ns)
    )
    assert set(after) == set(before) | {late_placeholder}, describe_namespace(api, ns)
    wait_bound(api, ns, running.pod_name("report"))


@pytest.mark.usefixtures("replicas")
def test_restart_mid_run(e2e: E2E, namespace: Callable[..., str]) -> None:
    api = e2e.api
    ns = namespace(mode="pipelineruns")
    ongoing = start_run(e2e, ns)
    finishing = start_run(e2e, ns)
    before = statefulsets(e2e, ns)

    for name in list(e2e.product.reconcilers):
        e2e.product.reconcilers.pop(name).stop()
    # While no reconciler runs: one run ends, one begins.
    finishing.finish("True")
    fresh = TektonRun(api, ns, unique("pr")).create()
    fresh.create_pod("report", fixture="tekton-taskrun-no-workspace")
    time.sleep(2)
    assert statefulsets(e2e, ns) == before, describe_namespace(api, ns)
    # Without its placeholder the new run's pod cannot be scheduled: the required term
    # the webhook added has nothing to match.
    waiting = api.must_get("Pod", fresh.pod_name("report"), ns)
    assert not waiting["spec"].get("nodeName"), describe_namespace(api, ns)
    scheduled = [
        c
        for c in (waiting.get("status") or {}).get("conditions") or []
        if c["type"] == "PodScheduled"
    ]
    assert scheduled, f"the scheduler has not looked at the pod yet:\n{dump(waiting)}"
    assert scheduled[0]["status"] == "False", dump(waiting)

    for name in RECONCILER_REPLICAS:
        e2e.product.start_reconciler(name)
    wait_statefulset(api, ns, run_placeholder(ns, fresh.name))
    wait_bound(api, ns, fresh.pod_name("report"))
    wait_statefulset_gone(
        api, ns, run_placeholder(ns, finishing.name), "its run ended while the reconciler was down"
    )
    kept = run_placeholder(ns, ongoing.name)
    time.sleep(2)  # give a wrong teardown the time to happen
    after = statefulsets(e2e, ns)
    assert after.get(kept) == before[kept], (
        "the ongoing run's placeholder was deleted or replaced across the restart\n"
        + describe_namespace(api, ns)
    )
    assert set(after) == {kept, run_placeholder(ns, fresh.name)}, describe_namespace(api, ns)
