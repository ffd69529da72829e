"""What stuck-run planning reads (only what it asks for) and the one memory of deletions
the executor keeps for every action that deletes a placeholder pod."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, cast

from prometheus_client import CollectorRegistry

from coschedule.k8s.quantity import resources
from coschedule.kube.client import KubeClient
from coschedule.reconcile.executor import Executor
from coschedule.reconcile.model import (
    DeletePlaceholderPod,
    DeleteStrayPod,
    RecordEvent,
    RelocatePlaceholder,
)
from coschedule.reconcile.reconciler_metrics import ReconcileMetrics
from coschedule.reconcile.stuck_facts import StuckMemory, read_and_plan
from coschedule.reconcile.stuck_runs import plan_stuck
from tests.reconcile.pods import marked_pod
from tests.reconcile.test_stuck_plan import (
    CLAIMS,
    NOW,
    SETTINGS,
    facts,
    group,
    stuck_pod,
)


class Recorder:
    """The client calls made, answered from ``objects`` (path -> object) and ``bound``
    (node -> pods bound there)."""

    def __init__(
        self,
        objects: dict[str, Any] | None = None,
        bound: dict[str, list[dict[str, Any]]] | None = None,
    ) -> None:
        self.objects = objects or {}
        self.bound = bound or {}
        self.calls: list[tuple[str, str]] = []

    async def get(self, path: str) -> Any:
        self.calls.append(("GET", path))
        return self.objects.get(path)

    async def list(self, path: str, params: dict[str, str]) -> dict[str, Any]:
        node = params["fieldSelector"].removeprefix("spec.nodeName=")
        self.calls.append(("LIST", node))
        return {"items": self.bound.get(node, [])}

    async def delete(self, path: str, body: Any = None) -> None:
        self.calls.append(("DELETE", path))

    async def patch(self, path: str, body: Any, **_: Any) -> dict[str, Any]:
        self.calls.append(("PATCH", path))
        return {}

    async def create(self, path: str, body: Any) -> dict[str, Any]:
        self.calls.append(("POST", path))
        return {}


def busy(node: str, cpu: str) -> dict[str, Any]:
    return {
        "spec": {"nodeName": node, "containers": [{"resources": {"requests": {"cpu": cpu}}}]},
        "status": {"phase": "Running"},
    }


async def test_a_stuck_pod_reads_claims_volumes_and_the_nodes_it_may_go_to() -> None:
    pod = stuck_pod()
    observed = group(pod)
    client = Recorder(
        objects={
            "/api/v1/namespaces/ci/persistentvolumeclaims/pvc-1f1344866c": {
                "spec": {"volumeName": "pv-1"}
            },
            "/api/v1/persistentvolumes/pv-1": {"metadata": {"name": "pv-1"}, "spec": {}},
        },
        bound={
            "worker-1": [
                busy("worker-1", "1500m"),
                {**busy("worker-1", "4"), "status": {"phase": "Succeeded"}},
            ]
        },
    )
    read, planned = await read_and_plan(
        cast(KubeClient, client), observed, facts(observed, pod, read=False), SETTINGS, NOW
    )
    assert client.calls == [
        ("GET", f"/api/v1/namespaces/ci/persistentvolumeclaims/{CLAIMS[0]}"),
        ("GET", "/api/v1/persistentvolumes/pv-1"),
        ("GET", f"/api/v1/namespaces/ci/persistentvolumeclaims/{CLAIMS[1]}"),
        ("LIST", "worker-1"),
        ("LIST", "worker-2"),
    ]
    assert read.claims is not None
    assert [(c.claim, c.bound) for c in read.claims] == [(CLAIMS[0], True), (CLAIMS[1], False)]
    # The finished pod is not counted.
    assert read.usage["worker-1"] == resources({"cpu": "1500m", "pods": "1"})
    assert read.usage["worker-2"] == {}
    # The plan returned is the one decided with what was read, a move or an explanation.
    assert planned == plan_stuck(observed, read, SETTINGS, NOW)
    assert planned.actions


async def test_a_run_with_a_running_task_lists_only_its_own_node() -> None:
    running = marked_pod("tekton-taskrun", node="worker-1")
    pod = stuck_pod()
    observed = group(running, pod)
    client = Recorder()
    await read_and_plan(
        cast(KubeClient, client),
        observed,
        facts(observed, running, pod, read=False),
        SETTINGS,
        NOW,
    )
    assert [c for c in client.calls if c[0] == "LIST"] == [("LIST", "worker-1")]


async def test_a_quiet_group_reads_nothing() -> None:
    pod = marked_pod("tekton-taskrun", node="worker-1")
    observed = group(pod)
    client = Recorder()
    unread = facts(observed, pod, read=False)
    read, planned = await read_and_plan(cast(KubeClient, client), observed, unread, SETTINGS, NOW)
    assert read == unread
    assert planned == plan_stuck(observed, unread, SETTINGS, NOW)
    assert client.calls == []


def test_memory_counts_stuck_groups_and_forgets_on_request() -> None:
    metrics = ReconcileMetrics(CollectorRegistry())
    memory = StuckMemory(metrics.stuck_groups)
    memory.mark("ci/a", ("why",))
    memory.mark("ci/b", None)
    assert metrics.registry.get_sample_value("coschedule_stuck_groups") == 2
    assert memory.explained("ci/a") == ("why",)
    assert memory.clear("ci/a", forget=False) is True
    assert memory.explained("ci/a") == ("why",)  # not stuck now; said before all the same
    assert memory.clear("ci/a") is False
    assert memory.explained("ci/a") is None
    assert metrics.registry.get_sample_value("coschedule_stuck_groups") == 1


async def test_every_action_deleting_a_placeholder_pod_deletes_each_version_once() -> None:
    client = Recorder()
    metrics = ReconcileMetrics(CollectorRegistry())
    versions = {"ci/aa-0": "7"}
    executor = Executor(
        cast(KubeClient, client),
        metrics,
        leading=lambda: True,
        run_of=lambda key: "run",
        pod_version=lambda key: versions.get(key, ""),
        torn_down=lambda key: None,
        stuck=StuckMemory(metrics.stuck_groups),
    )
    event = RecordEvent("ci", "aa", "PlaceholderMoved", "cordoned")
    evict = DeletePlaceholderPod("ci", "aa-0", "aa", "worker-1", "cordoned", "cordoned", event)
    stray = DeleteStrayPod("ci", "aa-0", "aa", "worker-1")
    move = RelocatePlaceholder(
        "ci", "aa", {}, ("aa-0",), "insufficient-resources", "worker-1", "worker-2", "ci/p", "x"
    )
    await executor.execute("ci/aa", [evict, stray, move], None)
    deletes = [c for c in client.calls if c[0] == "DELETE"]
    assert deletes == [("DELETE", "/api/v1/namespaces/ci/pods/aa-0")]
    assert ("PATCH", "/apis/apps/v1/namespaces/ci/statefulsets/aa") in client.calls
    evictions = "coschedule_placeholder_evictions_total"
    assert metrics.registry.get_sample_value(evictions, {"reason": "cordoned"}) == 1
    relocations = "coschedule_relocations_total"
    assert metrics.registry.get_sample_value(relocations, {"reason": "insufficient-resources"}) == 1
    # A new version of the pod (recreated) is deleted again; so is one the watch saw go.
    versions["ci/aa-0"] = "8"
    await executor.execute("ci/aa", [stray], None)
    executor.forget_pod("ci/aa-0")
    await executor.execute("ci/aa", [replace(stray)], None)
    assert len([c for c in client.calls if c[0] == "DELETE"]) == 3
