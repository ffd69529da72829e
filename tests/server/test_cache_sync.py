"""The webhook never decides from a cache it has not read yet.

Through the whole ``coschedule serve`` process (real HTTPS, its caches fed by the kmock
emulator): a pod posted before the namespace cache's first list waits for it, bounded, and is
decided with the namespace's mode; a pod whose caches are still not read after the bound
fails the call (HTTP 503, JSON body) so that the API server applies the failurePolicy. And
through the endpoint itself: once the caches are read the gate is never asked again.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, MutableMapping
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from coschedule.config.store import SettingsStore
from coschedule.marks import LABEL_PLACEHOLDER, run_placeholder
from coschedule.server.cache_gate import RULE, SYNC_WAIT_SECONDS, Cache, CacheGate
from coschedule.server.pod_endpoint import PodEndpoint
from coschedule.server.webhook_metrics import WebhookMetrics
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
from tests.conftest import RunningServer, launch_server, stop_server, write_kubeconfig
from tests.fixtures import admission_review, load_pod
from tests.reconcile.apiserver import MiniApi

# The cluster's mode leaves a run's pod without claims alone; the namespace's mode
# (pipelineruns) ties it to its run's placeholder: the answer tells which one decided.
CLUSTER = {"coschedule": "workspaces"}
PIPELINERUNS_NS = {**ENABLED, "coschedule.dev/mode": "pipelineruns"}
POD = "tekton-taskrun-no-workspace"  # run pr-7f3k2 in namespace ci, no claim
RUN_PLACEHOLDER = run_placeholder("ci", "pr-7f3k2")


@pytest.fixture
async def cold(api: MiniApi, tmp_path: Path) -> AsyncIterator[Callable[[], RunningServer]]:
    """Starts ``serve`` against the emulator with its namespace list held (the test opens
    ``api.holds``); answers once its HTTPS listener does, caches not read."""
    api.put("namespaces", namespace("ci", PIPELINERUNS_NS))
    api.holds[("GET", "namespaces")] = asyncio.Event()
    started: list[RunningServer] = []

    def start() -> RunningServer:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
        started.append(launch_server(tmp_path, kubeconfig=kubeconfig, config=CLUSTER))
        return started[-1]

    yield start
    api.holds[("GET", "namespaces")].set()
    for running in started:
        await asyncio.to_thread(stop_server, running)


async def listening(server: RunningServer) -> bool:
    """Its HTTPS listener answers (``/readyz`` may still say 503)."""
    with contextlib.suppress(httpx.TransportError):
        async with https(server) as http:
            return (await http.get("/livez")).status_code == 200
    return False


async def post_pod(http: httpx.AsyncClient, review: Obj) -> httpx.Response:
    return await http.post(
        "/mutate", content=orjson.dumps(review), headers={"Content-Type": "application/json"}
    )


async def metrics(server: RunningServer) -> str:
    async with httpx.AsyncClient() as plain:
        return (await plain.get(server.health_url + "/metrics")).text


async def test_a_pod_before_the_namespace_cache_synced_gets_the_namespaces_mode(
    api: MiniApi, cold: Callable[[], RunningServer]
) -> None:
    server = cold()
    await until(server, lambda: listening(server))
    status, body = await readyz(server)
    assert status == 503
    assert body["checks"]["namespace-cache"]["ok"] is False
    review = admission_review(load_pod(POD))
    async with https(server) as http:
        posted = asyncio.create_task(post_pod(http, review))
        await asyncio.sleep(0.5)
        assert not posted.done()  # waiting for the namespaces, not deciding without them
        api.holds[("GET", "namespaces")].set()
        answer = await posted
    assert answer.status_code == 200, answer.text
    response: Obj = answer.json()["response"]
    assert response["allowed"] is True
    assert response["uid"] == review["request"]["uid"]
    pod = patched(review, response)
    assert pod["metadata"]["labels"][LABEL_PLACEHOLDER] == RUN_PLACEHOLDER
    assert 'code="503"' not in await metrics(server)
    assert "caches-not-synced" not in server.log()


async def test_a_pod_whose_caches_are_not_read_in_time_fails_the_call_with_503(
    api: MiniApi, cold: Callable[[], RunningServer]
) -> None:
    server = cold()
    await until(server, lambda: listening(server))
    review = admission_review(load_pod(POD))
    async with https(server) as http:
        began = time.monotonic()
        answer = await post_pod(http, review)
        waited = time.monotonic() - began
        # An HTTP error, not a review: the API server applies the webhook's failurePolicy.
        assert answer.status_code == 503, answer.text
        assert answer.headers["content-type"] == "application/json"
        body = answer.json()
        error: str = body["error"]
        assert f"rule {RULE}" in error
        # A Status as well: the API server puts its message in its own error (Fail).
        assert (body["kind"], body["status"], body["code"]) == ("Status", "Failure", 503)
        assert body["message"] == error
        assert "namespaces" in error
        assert "failurePolicy" in error
        assert waited >= SYNC_WAIT_SECONDS * 0.9  # it waited its bound first
        count = 'coschedule_admission_requests_total{allowed="false",code="503",mode="none"} 1.0'
        assert count in await metrics(server)
        assert f"admission refused: {RULE}" in server.log()

        # Once read, the same pod is decided with its namespace's mode.
        api.holds[("GET", "namespaces")].set()
        await until(server, lambda: is_ready(server))
        review = admission_review(load_pod(POD))
        answer = await post_pod(http, review)
        assert answer.status_code == 200, answer.text
        pod = patched(review, answer.json()["response"])
        assert pod["metadata"]["labels"][LABEL_PLACEHOLDER] == RUN_PLACEHOLDER


# The endpoint alone: what it asks the gate, and when.


class LateCache:
    """A cache read when the test says so; counts how often the gate asked."""

    def __init__(self) -> None:
        self.read = asyncio.Event()
        self.asked = 0

    def ready(self) -> bool:
        self.asked += 1
        return self.read.is_set()

    def cache(self) -> Cache:
        return Cache("namespaces", self.ready, self.read.wait)


def endpoint(late: LateCache) -> PodEndpoint:
    store = SettingsStore(None, {"COSCHEDULE_COSCHEDULE": "pipelineruns"})
    return PodEndpoint(store, WebhookMetrics(), caches=CacheGate([late.cache()]))


async def call(handler: PodEndpoint, review: Obj) -> tuple[int, Any]:
    sent: list[MutableMapping[str, Any]] = []
    messages = [{"type": "http.request", "body": orjson.dumps(review), "more_body": False}]

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/mutate",
        "headers": [(b"content-type", b"application/json")],
    }
    await handler(scope, receive, send)
    return sent[0]["status"], orjson.loads(sent[1]["body"])


async def test_once_read_the_gate_is_never_asked_again() -> None:
    late = LateCache()
    handler = endpoint(late)
    review = admission_review(load_pod(POD))
    posted = asyncio.create_task(call(handler, review))
    await asyncio.sleep(0.05)
    assert not posted.done()
    late.read.set()
    status, body = await posted
    assert status == 200
    assert patched(review, body["response"])["metadata"]["labels"][LABEL_PLACEHOLDER]
    asked = late.asked
    for _ in range(3):
        status, _ = await call(handler, admission_review(load_pod(POD)))
        assert status == 200
    assert late.asked == asked  # the hot path reads the endpoint's bool, nothing more


async def test_what_is_not_a_pod_create_is_answered_without_waiting() -> None:
    late = LateCache()  # never read
    handler = endpoint(late)
    asked = late.asked
    status, body = await asyncio.wait_for(
        call(handler, admission_review(load_pod(POD), operation="UPDATE")), 1
    )
    assert (status, body["response"]["allowed"]) == (200, True)
    assert late.asked == asked


def test_without_a_wait_an_unread_cache_is_a_503_at_once() -> None:
    late = LateCache()
    status, body = endpoint(late).handle(orjson.dumps(admission_review(load_pod(POD))))
    assert status == 503
    assert f"rule {RULE}" in orjson.loads(body)["error"]
