"""Placement by node name through the whole ``coschedule serve`` process: its placeholder
cache, fed by the emulator's watch, decides between pin and gate for a Tekton pod posted to
``/mutate`` (the wiring from the cluster link to the decision)."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import orjson
import pytest

from coschedule.marks import ANNOTATION_PINNED_NODE, GATE_PLACEHOLDER, run_placeholder
from tests.concurrency.test_runs_https import (
    ENABLED,
    Obj,
    https,
    is_ready,
    namespace,
    patched,
    readyz,
    until,
)
from tests.conftest import RunningServer, launch_server, write_kubeconfig
from tests.fixtures import admission_review, load_pod
from tests.kube.test_placeholder_cache import placeholder_pod
from tests.reconcile.apiserver import MiniApi

CONFIG = {"coschedule": "pipelineruns", "placement": "auto"}


@pytest.fixture
async def server(api: MiniApi, tmp_path: Path) -> AsyncIterator[RunningServer]:
    api.put("namespaces", namespace("ci", ENABLED))
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
    running = launch_server(tmp_path, kubeconfig=kubeconfig, config=CONFIG)
    try:
        await until(running, lambda: is_ready(running))
        yield running
    finally:
        running.process.terminate()
        try:
            await asyncio.to_thread(running.process.wait, 10)
        except subprocess.TimeoutExpired:
            running.process.kill()
            await asyncio.to_thread(running.process.wait)


async def admit_pod(http: httpx.AsyncClient, review: Obj) -> Obj:
    answer = await http.post(
        "/mutate", content=orjson.dumps(review), headers={"Content-Type": "application/json"}
    )
    assert answer.status_code == 200, answer.text
    response: Obj = answer.json()["response"]
    assert response["allowed"] is True, response
    return response


def node_pin(pod: Obj) -> list[str] | None:
    affinity = pod["spec"].get("affinity") or {}
    required = (affinity.get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if not required:
        return None
    [term] = required["nodeSelectorTerms"]
    [pin] = term["matchFields"]
    assert (pin["key"], pin["operator"]) == ("metadata.name", "In")
    values: list[str] = pin["values"]
    return values


async def test_a_taskrun_pod_is_gated_until_the_webhook_sees_its_placeholder_bound(
    api: MiniApi, server: RunningServer
) -> None:
    status, body = await readyz(server)
    assert status == 200
    assert body["checks"]["placeholder-cache"] == {"ok": True}
    pod = load_pod("tekton-taskrun")  # PipelineRun pr-7f3k2 in ci
    placeholder = run_placeholder("ci", "pr-7f3k2")
    async with https(server) as http:
        before = patched(review := admission_review(pod), await admit_pod(http, review))
        assert before["spec"]["schedulingGates"] == [{"name": GATE_PLACEHOLDER}]
        assert "affinity" not in before["spec"]

        api.put("pods", placeholder_pod("ci", placeholder, node="node-a"))

        async def pinned() -> bool:
            review = admission_review(pod)
            after = patched(review, await admit_pod(http, review))
            return node_pin(after) == ["node-a"] and not after["spec"].get("schedulingGates")

        await until(server, pinned)
        review = admission_review(pod)
        after = patched(review, await admit_pod(http, review))
        assert after["metadata"]["annotations"][ANNOTATION_PINNED_NODE] == "node-a"
        assert "podAffinity" not in after["spec"]["affinity"]
        # Argo's pods keep the pod-affinity term whatever the placeholder's node.
        argo = load_pod("argo-workflow-pod")
        review = admission_review(argo, namespace="ci")
        kept = patched(review, await admit_pod(http, review))
        assert kept["spec"]["affinity"]["podAffinity"]
        assert "schedulingGates" not in kept["spec"]
