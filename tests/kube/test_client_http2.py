"""The API client sends its requests over HTTP/2 to a TLS server that offers it
(kube-apiserver does): all of them on one connection. Its watches keep HTTP/1.1 connections
of their own (an idle watch on the HTTP/2 connection held answered requests back). A server
that offers only HTTP/1.1 gets HTTP/1.1 (plain http://, the kmock-based tests, does too)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, cast

import httpx
import pytest

from coschedule.kube.client import Credentials, KubeClient
from tests.kube.h2server import H2Server

PATIENCE = 30.0


@pytest.fixture
async def server() -> AsyncIterator[H2Server]:
    found = H2Server()
    await found.start()
    yield found
    await found.stop()


def client_of(server: H2Server) -> KubeClient:
    return KubeClient(Credentials(server=f"https://127.0.0.1:{server.port}", ca_data=server.ca_pem))


def watch(client: KubeClient, path: str) -> AsyncGenerator[dict[str, Any], None]:
    return cast(AsyncGenerator[dict[str, Any], None], client.watch(path, {}))


async def next_event(events: AsyncIterator[dict[str, Any]]) -> dict[str, Any]:
    return await asyncio.wait_for(anext(events), PATIENCE)


def name_of(event: dict[str, Any]) -> str:
    return str(event["object"]["metadata"]["name"])


async def test_a_tls_server_that_offers_h2_gets_h2() -> None:
    server = H2Server()
    await server.start()
    client = client_of(server)
    try:
        assert await client.get("/api/v1/namespaces/ci/pods/p1") == {}
    finally:
        await client.aclose()
        await server.stop()
    assert server.protocols == ["h2"]


async def test_a_server_that_offers_only_http1_gets_http1() -> None:
    server = H2Server(offer_h2=False)
    await server.start()
    client = client_of(server)
    try:
        for _ in range(3):
            assert await client.get("/api/v1/namespaces/ci/pods/p1") == {}
    finally:
        await client.aclose()
        await server.stop()
    assert server.protocols == ["http/1.1"]  # and kept alive


async def test_requests_share_one_h2_connection_and_watches_have_their_own(
    server: H2Server,
) -> None:
    client = client_of(server)
    pods = watch(client, "/watch/pods")
    nodes = watch(client, "/watch/nodes")
    try:
        server.push("/watch/pods", "p1")
        server.push("/watch/nodes", "n1")
        assert name_of(await next_event(pods)) == "p1"
        assert name_of(await next_event(nodes)) == "n1"
        answers = await asyncio.gather(*(client.get(f"/api/v1/pods/p{i}") for i in range(40)))
        assert answers == [{}] * 40
        server.push("/watch/pods", "p2")
        assert name_of(await next_event(pods)) == "p2"
    finally:
        await pods.aclose()
        await nodes.aclose()
        await client.aclose()
    # 40 requests at once on one HTTP/2 connection; a watch on each HTTP/1.1 connection.
    assert sorted(server.protocols) == ["h2", "http/1.1", "http/1.1"]


async def test_a_watch_read_slowly_holds_back_no_other_stream(server: H2Server) -> None:
    client = client_of(server)
    slow = watch(client, "/watch/slow")
    fast = watch(client, "/watch/fast")
    try:
        server.push("/watch/slow", "s0")
        server.push("/watch/fast", "f0")
        assert name_of(await next_event(slow)) == "s0"
        assert name_of(await next_event(fast)) == "f0"
        # 2 MB for the slow watch that nobody reads: far more than a stream's window.
        for i in range(1, 65):
            server.push("/watch/slow", f"s{i}", pad=32_000)
        for i in range(1, 201):
            server.push("/watch/fast", f"f{i}", pad=4_000)
            assert name_of(await next_event(fast)) == f"f{i}"
        assert await client.get("/api/v1/pods/p1") == {}
        # The slow watch's connection is its own: what it has not read holds back no other.
        assert server.watches["/watch/fast"].sent > 800_000
        # Read at last, the slow watch gets all of it, in order.
        for i in range(1, 65):
            assert name_of(await next_event(slow)) == f"s{i}"
    finally:
        await slow.aclose()
        await fast.aclose()
        await client.aclose()


async def test_a_dropped_connection_fails_every_stream_and_the_next_ones_reconnect(
    server: H2Server,
) -> None:
    client = client_of(server)
    pods = watch(client, "/watch/pods")
    nodes = watch(client, "/watch/nodes")
    try:
        server.push("/watch/pods", "p1")
        server.push("/watch/nodes", "n1")
        assert name_of(await next_event(pods)) == "p1"
        assert name_of(await next_event(nodes)) == "n1"
        # Two requests in flight on the HTTP/2 connection, never answered.
        hanging = [asyncio.create_task(client.get(f"/hang/{i}")) for i in range(2)]
        await asyncio.sleep(0.2)
        assert server.protocols.count("h2") == 1
        server.drop_connections()
        for events in (pods, nodes):
            with pytest.raises(httpx.TransportError):
                await next_event(events)
        for task in hanging:
            with pytest.raises(httpx.TransportError):
                await asyncio.wait_for(task, PATIENCE)
        # As an informer does: watch again; and requests go on, on a new connection.
        again = watch(client, "/watch/pods")
        server.push("/watch/pods", "p2")
        assert name_of(await next_event(again)) == "p2"
        assert await client.get("/api/v1/pods/p2") == {}
        await again.aclose()
    finally:
        await client.aclose()
    assert sorted(server.protocols) == ["h2", "h2", "http/1.1", "http/1.1", "http/1.1"]


async def test_an_answered_request_is_not_held_behind_idle_watches(server: H2Server) -> None:
    """httpcore's HTTP/2 reads a connection under one lock, held over the socket read by
    whichever stream waits first: on one connection with watches, a request whose answer had
    come waited behind an idle watch's read until the next byte came (forever in an idle
    cluster: the webhook never synced). Watches therefore have HTTP/1.1 connections."""
    client = client_of(server)
    pods = watch(client, "/watch/pods")
    nodes = watch(client, "/watch/nodes")
    waiting: list[asyncio.Task[dict[str, Any]]] = []
    try:
        server.push("/watch/pods", "p1")
        server.push("/watch/nodes", "n1")
        assert name_of(await next_event(pods)) == "p1"
        assert name_of(await next_event(nodes)) == "n1"
        # Both watches wait for events that do not come (an idle cluster).
        waiting = [asyncio.create_task(anext(pods)), asyncio.create_task(anext(nodes))]
        await asyncio.sleep(0.2)
        for i in range(5):  # one at a time: nothing else arrives to wake a reader
            assert await asyncio.wait_for(client.get(f"/api/v1/pods/p{i}"), 10) == {}
    finally:
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        await pods.aclose()
        await nodes.aclose()
        await client.aclose()
