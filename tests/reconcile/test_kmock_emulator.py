"""The controller against kmock's own stateful ``KubernetesEmulator``, unmodified.

It ignores label selectors (the caches see every pod: the handlers must filter by label)
and has no resourceVersions; creating, watching and deleting are real, over HTTP.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import kmock
import pytest

from coschedule.config.settings import Settings
from coschedule.kube.client import Credentials, KubeClient
from coschedule.marks import Mode
from tests.reconcile.conftest import eventually, placeholder_controller, start
from tests.reconcile.pods import marked_pod, placeholder_of

PODS = kmock.resource("", "v1", "pods")
NODES = kmock.resource("", "v1", "nodes")
STATEFULSETS = kmock.resource("apps", "v1", "statefulsets")


@pytest.fixture
async def emulator() -> AsyncIterator[tuple[Any, KubeClient]]:
    async with kmock.KubernetesEmulator() as emulator, kmock.Server(emulator) as server:
        handler: Any = emulator
        # Declared, so that listing them before any object exists is not a 404.
        for resource in ("v1/pods", "v1/nodes", "v1/events", "apps/v1/statefulsets"):
            handler.resources[resource] = {}
        client = KubeClient(Credentials(server=str(server.url).rstrip("/")), timeout=5.0)
        yield handler, client
        await client.aclose()


def exists(handler: Any, resource: Any, namespace: str | None, name: str) -> bool:
    key = (resource, namespace, name)
    return key in handler.objects and not handler.objects[key].deleted


async def test_statefulset_for_a_new_pod_and_pod_delete_on_cordon(
    emulator: tuple[Any, KubeClient],
) -> None:
    handler, client = emulator
    for node in ("worker-1", "worker-2"):
        await client.create("/api/v1/nodes", {"metadata": {"name": node}})
    settings = Settings(mode=Mode.WORKSPACES)
    manager, _ = placeholder_controller(client, settings, retry_base=0.02)
    try:
        await start(manager)

        pod = marked_pod("argo-workflow-pod", Mode.WORKSPACES, node="worker-1")
        name = placeholder_of(pod)
        await client.create("/api/v1/namespaces/ci/pods", pod)
        await eventually(lambda: exists(handler, STATEFULSETS, "ci", name))
        sts = handler.objects[STATEFULSETS, "ci", name].raw
        volumes = sts["spec"]["template"]["spec"]["volumes"]
        assert volumes[0]["persistentVolumeClaim"]["claimName"] == "wf-build-9xkq2-workdir"

        placeholder = {
            "metadata": {
                "name": f"{name}-0",
                "namespace": "ci",
                "labels": {
                    "app.kubernetes.io/component": "affinity-assistant",
                    "app.kubernetes.io/instance": name,
                    "app.kubernetes.io/managed-by": "coschedule",
                },
            },
            "spec": {"nodeName": "worker-1"},
        }
        await client.create("/api/v1/namespaces/ci/pods", placeholder)
        await asyncio.sleep(0.1)
        await client.patch("/api/v1/nodes/worker-1", {"spec": {"unschedulable": True}})
        await eventually(lambda: not exists(handler, PODS, "ci", f"{name}-0"))
        assert exists(handler, PODS, "ci", pod["metadata"]["name"])
        assert exists(handler, STATEFULSETS, "ci", name)
    finally:
        await manager.stop()
