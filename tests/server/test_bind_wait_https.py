"""A run's first pod, arriving while its placeholder is on its way, waits for the binding.

Through the whole ``coschedule serve`` process (real HTTPS, its caches fed by the kmock
emulator's watches): a Tekton pod posted while its placeholder's pod was made a moment ago
and is not bound yet waits, and the binding delivered by the watch within the bound
(``placeholder-bind-wait-seconds``) gets it pinned at admission, with the same JSONPatch as a
pod admitted once the placeholder was bound; not bound within the bound, it is gated as
without the wait, and the run's next pod is gated at once. A placeholder the scheduler
cannot place, or none at all, is no reason to wait. Counted in the webhook's metrics and
logged with the decision.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from coschedule.k8s.timefmt import rfc3339
from coschedule.marks import ANNOTATION_PINNED_NODE, GATE_PLACEHOLDER, placeholder_labels
from tests.concurrency.test_runs_https import (
    ENABLED,
    Obj,
    https,
    is_ready,
    namespace,
    patched,
    until,
)
from tests.conftest import RunningServer, launch_server, stop_server, write_kubeconfig
from tests.fixtures import admission_review, load_pod
from tests.kube.test_placeholder_cache import placeholder_pod
from tests.mutate.test_placement import placeholder_of
from tests.reconcile.apiserver import MiniApi
from tests.server.test_placement_https import admit_pod, node_pin

BOUND = 1.5  # placeholder-bind-wait-seconds in this suite: short, for the tests' sake
CONFIG = {
    "coschedule": "pipelineruns",
    "placement": "auto",
    "placeholder-bind-wait-seconds": str(BOUND),
}
POD = "tekton-taskrun-no-workspace"  # PipelineRun pr-7f3k2 in ci, no claim


@pytest.fixture
async def start(
    api: MiniApi, tmp_path: Path
) -> AsyncIterator[Callable[[], Awaitable[RunningServer]]]:
    """Starts ``serve`` against the emulator (what the test put there is in its first
    lists) and returns it once ready: its caches read."""
    api.put("namespaces", namespace("ci", ENABLED))
    started: list[RunningServer] = []

    async def launch() -> RunningServer:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
        running = launch_server(
            tmp_path, kubeconfig=kubeconfig, config=CONFIG, extra_args=["--log-level", "debug"]
        )
        started.append(running)
        await until(running, lambda: is_ready(running))
        return running

    yield launch
    for running in started:
        await asyncio.to_thread(stop_server, running)


def now() -> str:
    return rfc3339(datetime.now(UTC))


def statefulset(placeholder: str) -> Obj:
    """The placeholder StatefulSet as the reconciler makes it (its labels), made just now."""
    return {
        "metadata": {
            "name": placeholder,
            "namespace": "ci",
            "labels": placeholder_labels(placeholder),
            "creationTimestamp": now(),
        },
        "spec": {"replicas": 1, "template": {"spec": {"containers": []}}},
    }


def young_pod(placeholder: str, **status: Any) -> Obj:
    """The StatefulSet's pod, made just now by kube-controller-manager, not bound yet."""
    obj = placeholder_pod("ci", placeholder)
    obj["metadata"]["creationTimestamp"] = now()
    obj["status"].update(status)
    return obj


async def metrics(server: RunningServer) -> str:
    async with httpx.AsyncClient() as plain:
        return (await plain.get(server.health_url + "/metrics")).text


def ops(response: Obj) -> list[Any]:
    found: list[Any] = orjson.loads(base64.b64decode(response["patch"]))
    return found


async def watched(api: MiniApi, server: RunningServer, http: httpx.AsyncClient) -> None:
    """Until the webhook's pod watch has delivered everything put before: a placeholder pod
    put after them, bound, pins its run's pod (one watch delivers its events in order)."""
    sentinel = load_pod(POD)
    sentinel["metadata"]["labels"]["tekton.dev/pipelineRun"] = "sentinel"
    api.put("pods", placeholder_pod("ci", placeholder_of(sentinel), node="node-z"))

    async def pinned() -> bool:
        return node_pin(patched(r := admission_review(sentinel), await admit_pod(http, r))) == [
            "node-z"
        ]

    await until(server, pinned)


async def unbound(
    api: MiniApi, start: Callable[[], Awaitable[RunningServer]]
) -> tuple[RunningServer, Obj, str]:
    """The webhook ready, then the run's placeholder made just now (its StatefulSet, and its
    pod by kube-controller-manager), not bound yet (kube-scheduler's turn): worth a wait.
    Returns the server, the run's first pod and its placeholder."""
    server = await start()
    pod = load_pod(POD)
    placeholder = placeholder_of(pod)
    api.put("statefulsets", statefulset(placeholder))
    api.put("pods", young_pod(placeholder))
    return server, pod, placeholder


async def timed_admit(http: httpx.AsyncClient, review: Obj) -> tuple[Obj, float]:
    began = time.monotonic()
    response = await admit_pod(http, review)
    return response, time.monotonic() - began


async def test_a_pod_before_its_placeholder_is_bound_waits_and_is_pinned_at_admission(
    api: MiniApi, start: Callable[[], Awaitable[RunningServer]]
) -> None:
    server, pod, placeholder = await unbound(api, start)
    async with https(server) as http:
        await watched(api, server, http)
        review = admission_review(pod)
        posted = asyncio.create_task(timed_admit(http, review))
        await asyncio.sleep(0.4)
        assert not posted.done()  # held for the binding, not gated at once
        api.edit("pods", "ci", f"{placeholder}-0", {"spec": {"nodeName": "node-b"}})
        response, waited = await posted
        assert 0.35 <= waited < BOUND  # answered on the watch's event, not at the bound
        first = patched(review, response)
        assert node_pin(first) == ["node-b"]
        assert not first["spec"].get("schedulingGates")
        assert first["metadata"]["annotations"][ANNOTATION_PINNED_NODE] == "node-b"

        # The same JSONPatch as a pin at admission of a pod that found it already bound.
        review = admission_review(pod)
        again, quick = await timed_admit(http, review)
        assert quick < 0.35
        assert ops(again) == ops(response)
        # Admitted once more on its own output (reinvocation): nothing to add, no wait.
        review = admission_review(first)
        same, quick = await timed_admit(http, review)
        assert quick < 0.35
        assert "patch" not in same or ops(same) == []

    text = await metrics(server)
    assert 'coschedule_placeholder_bind_waits_total{outcome="pinned"} 1.0' in text
    assert 'coschedule_placeholder_bind_waits_total{outcome="gated"}' not in text
    assert "coschedule_placeholder_bind_wait_seconds_count 1.0" in text
    assert 'coschedule_placeholder_bind_wait_seconds_bucket{le="0.25"} 0.0' in text
    assert 'coschedule_placeholder_bind_wait_seconds_bucket{le="1.5"} 1.0' in text
    [line] = [line for line in server.log().splitlines() if "bind_wait_ms" in line]
    assert "pinned=true" in line, line


async def test_not_bound_within_the_bound_the_pod_is_gated_and_the_runs_next_pod_waits_not(
    api: MiniApi, start: Callable[[], Awaitable[RunningServer]]
) -> None:
    server, pod, _ = await unbound(api, start)  # and nobody binds it
    async with https(server) as http:
        await watched(api, server, http)
        review = admission_review(pod)
        response, waited = await timed_admit(http, review)
        assert BOUND * 0.9 <= waited < BOUND + 1.0
        gated = patched(review, response)
        assert gated["spec"]["schedulingGates"] == [{"name": GATE_PLACEHOLDER}]
        assert node_pin(gated) is None

        # The run's next pod: its placeholder made one pod wait in vain, so no wait now.
        later = load_pod(POD)
        later["metadata"]["name"] = "pr-7f3k2-test-pod"
        review = admission_review(later)
        response, quick = await timed_admit(http, review)
        assert quick < 0.5
        assert patched(review, response)["spec"]["schedulingGates"] == [{"name": GATE_PLACEHOLDER}]

    text = await metrics(server)
    assert 'coschedule_placeholder_bind_waits_total{outcome="gated"} 1.0' in text
    assert 'coschedule_placeholder_bind_waits_total{outcome="pinned"}' not in text


@pytest.mark.parametrize(
    "what",
    ["no placeholder", "unschedulable", "unbound for long", "statefulset old, no pod"],
)
async def test_a_placeholder_not_on_its_way_is_no_reason_to_wait(
    api: MiniApi, start: Callable[[], Awaitable[RunningServer]], what: str
) -> None:
    pod = load_pod(POD)
    placeholder = placeholder_of(pod)
    if what == "unschedulable":
        api.put("statefulsets", statefulset(placeholder))
        condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
        api.put("pods", young_pod(placeholder, conditions=[condition]))
    elif what == "unbound for long":
        api.put("statefulsets", statefulset(placeholder))
        api.put("pods", placeholder_pod("ci", placeholder))  # made days ago (the emulator's)
    elif what == "statefulset old, no pod":
        old = statefulset(placeholder)
        del old["metadata"]["creationTimestamp"]  # the emulator's: days ago
        api.put("statefulsets", old)
    server = await start()  # ready: its first lists hold what was put above
    async with https(server) as http:
        review = admission_review(pod)
        response, quick = await timed_admit(http, review)
        assert quick < 0.5, what
        assert patched(review, response)["spec"]["schedulingGates"] == [{"name": GATE_PLACEHOLDER}]
    assert "coschedule_placeholder_bind_waits_total{" not in await metrics(server)
