"""The API client speaks HTTP/2 to a TLS server that offers it (kube-apiserver does): every
request and watch on one connection, a slowly read watch holding back only itself, and a
dropped connection failing every stream on it. A server that offers only HTTP/1.1 gets
HTTP/1.1 (plain http://, the kmock-based tests, does too)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

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


async def test_watches_and_a_burst_of_requests_share_one_connection(server: H2Server) -> None:
    client = client_of(server)
    pods = client.watch("/watch/pods", {})
    nodes = client.watch("/watch/nodes", {})
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
    assert server.protocols == ["h2"]  # 2 watches and 40 requests at once: one connection


async def test_a_watch_read_slowly_holds_back_no_other_stream(server: H2Server) -> None:
    client = client_of(server)
    slow = client.watch("/watch/slow", {})
    fast = client.watch("/watch/fast", {})
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
        # httpcore opens a 16 MiB window for each stream (and the connection): the client
        # took the slow watch's 2 MB and holds it unread, and the other streams went on. Its
        # connection window is shared: 16 MiB unread over all streams would hold back every
        # one (the informers' readers never wait on a request, so they always drain).
        assert server.watches["/watch/slow"].sent > 2_000_000
        assert server.watches["/watch/fast"].sent > 800_000
        # Read at last, the slow watch gets all of it, in order.
        for i in range(1, 65):
            assert name_of(await next_event(slow)) == f"s{i}"
    finally:
        await slow.aclose()
        await fast.aclose()
        await client.aclose()
    assert server.protocols == ["h2"]


async def test_a_dropped_connection_fails_every_stream_and_the_next_ones_reconnect(
    server: H2Server,
) -> None:
    client = client_of(server)
    pods = client.watch("/watch/pods", {})
    nodes = client.watch("/watch/nodes", {})
    try:
        server.push("/watch/pods", "p1")
        server.push("/watch/nodes", "n1")
        assert name_of(await next_event(pods)) == "p1"
        assert name_of(await next_event(nodes)) == "n1"
        server.drop_connections()
        for events in (pods, nodes):
            with pytest.raises(httpx.TransportError):
                await next_event(events)
        # As an informer does: watch again, and requests go on, on a new connection.
        again = client.watch("/watch/pods", {})
        server.push("/watch/pods", "p2")
        assert name_of(await next_event(again)) == "p2"
        assert await client.get("/api/v1/pods/p2") == {}
        await again.aclose()
    finally:
        await client.aclose()
    assert server.protocols == ["h2", "h2"]
