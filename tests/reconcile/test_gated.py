"""``coschedule_gated_pods`` and ``coschedule_gated_pod_oldest_seconds``: the pods waiting
behind the placeholder's scheduling gate, counted from the reconciler's pod cache."""

from __future__ import annotations

from typing import Any

from prometheus_client import generate_latest

from coschedule.k8s.timefmt import parse_time
from coschedule.kube.client import KubeClient
from coschedule.reconcile.gated import gated_pods
from tests.reconcile.apiserver import MiniApi
from tests.reconcile.conftest import eventually, placeholder_controller, start
from tests.reconcile.pods import by_node_name, marked_pod
from tests.reconcile.test_controller import SETTINGS, seed_cluster

CREATED = "2026-11-21T06:00:00Z"
T0 = parse_time(CREATED) or 0.0


def gated(name: str, created: str = CREATED, **changes: Any) -> dict[str, Any]:
    pod = by_node_name(marked_pod("tekton-taskrun", name=name, phase="Pending", created=created))
    pod["metadata"].update(changes)
    return pod


def test_counts_gated_pods_and_the_oldest_wait() -> None:
    pods = [
        gated("a", "2026-11-21T06:00:00Z"),
        gated("b", "2026-11-21T06:05:00Z"),
        by_node_name(marked_pod("tekton-taskrun", name="pinned", phase="Pending"), "node-1"),
        marked_pod("tekton-taskrun", name="running"),
    ]
    assert gated_pods(pods, T0 + 900) == (2, 900.0)


def test_pods_that_wait_no_more_are_not_counted() -> None:
    leaving = gated("c", deletionTimestamp="2026-11-21T06:01:00Z")
    failed = gated("d")
    failed["status"]["phase"] = "Failed"
    other_gate = gated("e")
    other_gate["spec"]["schedulingGates"] = [{"name": "example.com/quota"}]
    assert gated_pods([leaving, failed, other_gate], T0 + 60) == (0, 0.0)


async def test_the_gauges_read_the_cache_at_scrape_time(api: MiniApi, client: KubeClient) -> None:
    seed_cluster(api)
    api.put("pods", gated("waiting"))
    now = [T0 + 30]
    manager, _ = placeholder_controller(client, SETTINGS, clock=lambda: now[0])
    try:
        await start(manager, lead=False)  # every replica reports, leader or not

        def text() -> str:
            return generate_latest(manager.metrics.registry).decode()

        await eventually(lambda: "coschedule_gated_pods 1.0" in text())
        assert "coschedule_gated_pod_oldest_seconds 30.0" in text()
        now[0] = T0 + 630  # the wait grows without an event
        assert "coschedule_gated_pod_oldest_seconds 630.0" in text()
    finally:
        await manager.stop()
