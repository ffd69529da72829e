"""The client's own HTTP/1.1 transport (``coschedule.kube.http1``) against a real TLS server
made here: what it answers is scripted per request, and the server counts connections."""

from __future__ import annotations

import asyncio
import gzip
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httptools
import httpx
import pytest
import uvloop

from coschedule import certs
from coschedule.kube import client as client_module
from coschedule.kube.client import ApiError, Credentials, KubeClient
from coschedule.kube.http1 import IDLE_SECONDS, STREAM, LeanTransport
from coschedule.kube.reachability import is_unreachable
from tests.conftest import free_port

# What the server does with one request: bytes to write (b"": nothing), and whether to
# close the connection after (or instead).
Answer = Callable[[str, str, int], tuple[bytes, bool]]


def ok(body: bytes = b'{"kind":"Status"}', *, extra: bytes = b"") -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        + extra
        + b"Content-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )


@dataclass
class Server:
    answer: Answer
    port: int = 0
    connections: int = 0
    requests: list[tuple[str, str, bytes]] = field(default_factory=list)
    # Each answer waits until this many requests are in (a burst truly at once), if set.
    together: asyncio.Barrier | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        try:
            while True:
                request = await _read_request(reader)
                if request is None:
                    return
                self.requests.append(request)
                if self.together is not None:
                    await self.together.wait()
                data, close = self.answer(request[0], request[1], number)
                if data:
                    writer.write(data)
                    await writer.drain()
                if close:
                    return
        except (ConnectionError, ssl.SSLError):
            return
        finally:
            writer.close()


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str, bytes] | None:
    done: dict[str, object] = {}

    class Sink:
        def __init__(self) -> None:
            self.body = b""

        def on_url(self, url: bytes) -> None:
            done["url"] = url.decode()

        def on_body(self, body: bytes) -> None:
            self.body += body

        def on_message_complete(self) -> None:
            done["complete"] = True

    sink = Sink()
    parser = httptools.HttpRequestParser(sink)
    while "complete" not in done:
        chunk = await reader.read(65536)
        if not chunk:
            return None
        parser.feed_data(chunk)
    return parser.get_method().decode(), str(done["url"]), sink.body


@pytest.fixture
def bundle() -> certs.CertBundle:
    return certs.generate(["localhost", "127.0.0.1"], days=1)


def _client_context(bundle: certs.CertBundle) -> ssl.SSLContext:
    return ssl.create_default_context(cadata=bundle.ca_pem.decode())


Serve = Callable[[Answer], Awaitable[Server]]


@pytest.fixture
def server_context(bundle: certs.CertBundle, tmp_path: Path) -> ssl.SSLContext:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes(bundle.cert_pem)
    key.write_bytes(bundle.key_pem)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context


@pytest.fixture
async def serve(server_context: ssl.SSLContext) -> AsyncIterator[Serve]:
    """Start TLS servers (the bundle's certificate) that answer as told."""
    servers: list[asyncio.Server] = []

    async def start(answer: Answer) -> Server:
        made = Server(answer)
        server = await asyncio.start_server(made.handle, "127.0.0.1", 0, ssl=server_context)
        servers.append(server)
        made.port = server.sockets[0].getsockname()[1]
        return made

    yield start
    for server in servers:
        server.close()


def transport(
    server: Server, bundle: certs.CertBundle, *, idle_seconds: float = IDLE_SECONDS
) -> httpx.AsyncClient:
    url = f"https://127.0.0.1:{server.port}"
    lean = LeanTransport(url, _client_context(bundle), idle_seconds=idle_seconds)
    return httpx.AsyncClient(base_url=url, transport=lean, timeout=httpx.Timeout(2.0))


def answer_all(method: str, url: str, conn: int) -> tuple[bytes, bool]:
    return ok(), False


def silent_on_slow(method: str, url: str, conn: int) -> tuple[bytes, bool]:
    """Never answers ``/slow``; answers the rest."""
    return (b"" if url == "/slow" else ok()), False


async def test_a_burst_of_requests_keeps_its_connections_for_the_next_burst(
    serve: Serve, bundle: certs.CertBundle
) -> None:
    """40 at once (the server answers none before all 40 are in) open 40 connections, and 40
    more reuse every one: httpx's own transport kept 20 alive, so each burst of the
    reconciler's 32 releases connected again (this fails on it: 60 connections)."""
    server = await serve(answer_all)
    server.together = asyncio.Barrier(40)
    async with transport(server, bundle) as http:
        first = await asyncio.gather(*(http.patch(f"/p/{i}", content=b"{}") for i in range(40)))
        assert server.connections == 40
        second = await asyncio.gather(*(http.patch(f"/p/{i}", content=b"{}") for i in range(40)))
    assert [r.status_code for r in first + second] == [200] * 80
    assert server.connections == 40
    assert len(server.requests) == 80
    assert all(body == b"{}" for _, _, body in server.requests)


async def test_bodies_by_length_chunked_and_gzip_are_read_whole(
    serve: Serve, bundle: certs.CertBundle
) -> None:
    big = b'{"items":[' + b",".join(b'{"n":%d}' % i for i in range(20000)) + b"]}"
    packed = gzip.compress(big)

    def answer(method: str, url: str, conn: int) -> tuple[bytes, bool]:
        if url == "/chunked":
            chunks = [big[i : i + 7000] for i in range(0, len(big), 7000)]
            body = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"
            head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            return head + body, False
        if url == "/gzip":
            return ok(packed, extra=b"Content-Encoding: gzip\r\n"), False
        return ok(big), False

    server = await serve(answer)
    async with transport(server, bundle) as http:
        for path in ("/length", "/chunked", "/gzip"):
            response = await http.get(path)
            assert response.status_code == 200
            assert response.content == big, path
    assert server.connections == 1


async def test_a_connection_the_server_closed_while_idle_is_not_reused(
    serve: Serve, bundle: certs.CertBundle
) -> None:
    # The server closes each connection after its answer, without saying so in a header.
    server = await serve(lambda method, url, conn: (ok(), True))
    async with transport(server, bundle) as http:
        for _ in range(3):
            assert (await http.patch("/p", content=b"{}")).status_code == 200
            await asyncio.sleep(0.05)  # the close reaches the client
    assert server.connections == 3
    assert len(server.requests) == 3


def closed_unanswered_on_first(path: str, answer: bytes) -> Answer:
    """A server that closes the first connection unanswered when ``path`` comes on it, and
    answers everything else (``answer``) keeping the connection."""

    def respond(method: str, url: str, conn: int) -> tuple[bytes, bool]:
        if conn == 1 and url == path:
            return b"", True
        return answer, False

    return respond


@pytest.mark.parametrize(
    ("method", "sent_again"),
    [
        pytest.param("GET", True, id="a GET is sent again"),
        pytest.param("PATCH", False, id="a PATCH is not"),
    ],
)
async def test_a_kept_connection_closed_as_a_request_goes_out(
    serve: Serve, bundle: certs.CertBundle, method: str, sent_again: bool
) -> None:
    """The server reads the second request on the first connection and closes it unanswered
    (as when its idle timeout fires as the request arrives)."""
    server = await serve(closed_unanswered_on_first("/second", ok()))
    async with transport(server, bundle) as http:
        assert (await http.request(method, "/first", content=b"{}")).status_code == 200
        if sent_again:
            assert (await http.request(method, "/second")).status_code == 200
            assert [url for _, url, _ in server.requests] == ["/first", "/second", "/second"]
        else:
            with pytest.raises(httpx.RemoteProtocolError):
                await http.request(method, "/second", content=b"{}")
            assert [url for _, url, _ in server.requests] == ["/first", "/second"]
            # The next request gets a new connection.
            assert (await http.request(method, "/third", content=b"{}")).status_code == 200
            assert server.connections == 2


@pytest.mark.parametrize(
    ("method", "sent_again"),
    [
        pytest.param("GET", True, id="a watch (GET) is sent again"),
        pytest.param("POST", False, id="a POST is not"),
    ],
)
async def test_a_stream_on_a_kept_connection_closed_unanswered(
    serve: Serve, bundle: certs.CertBundle, method: str, sent_again: bool
) -> None:
    """A stream goes through the same attempts as a request: on a kept connection the server
    closes unanswered, a GET is sent once more on a new connection, and comes as a stream."""
    server = await serve(closed_unanswered_on_first("/watch", ok(b'{"type":"ADDED"}\n')))
    async with transport(server, bundle) as http:
        assert (await http.get("/first")).status_code == 200
        request = http.build_request(method, "/watch", extensions={STREAM: True})
        if sent_again:
            response = await http.send(request, stream=True)
            assert response.status_code == 200
            assert b"".join([part async for part in response.aiter_bytes()]) == (
                b'{"type":"ADDED"}\n'
            )
            await response.aclose()
            assert [url for _, url, _ in server.requests] == ["/first", "/watch", "/watch"]
        else:
            with pytest.raises(httpx.RemoteProtocolError):
                await http.send(request, stream=True)
            assert [url for _, url, _ in server.requests] == ["/first", "/watch"]
        assert server.connections == 1 + sent_again


async def test_a_kept_connection_whose_close_has_begun_is_not_picked(
    serve: Serve, bundle: certs.CertBundle
) -> None:
    """A close begun (the server's TLS close_notify read: the transport is closing) is
    reported to the protocol only on a later pass of the loop; a PATCH picked in between
    went out on it and failed. Here the close begins and the PATCH is sent with no pass of
    the loop between."""
    server = await serve(answer_all)
    url = f"https://127.0.0.1:{server.port}"
    lean = LeanTransport(url, _client_context(bundle))
    try:
        first = httpx.Request("PATCH", f"{url}/first", content=b"{}")
        assert (await lean.handle_async_request(first)).status_code == 200
        [kept] = lean._idle
        assert kept.transport is not None
        kept.transport.close()
        assert not kept.closed  # not reported yet
        second = httpx.Request("PATCH", f"{url}/second", content=b"{}")
        assert (await lean.handle_async_request(second)).status_code == 200
    finally:
        await lean.aclose()
    assert server.connections == 2
    assert [u for _, u, _ in server.requests] == ["/first", "/second"]


async def test_no_answer_in_time_is_a_read_timeout_and_the_connection_is_dropped(
    serve: Serve, bundle: certs.CertBundle
) -> None:
    server = await serve(silent_on_slow)
    async with transport(server, bundle) as http:
        with pytest.raises(httpx.ReadTimeout):
            await http.get("/slow", timeout=0.3)
        assert (await http.get("/fast")).status_code == 200
    assert server.connections == 2  # the one left mid-request is not reused


async def test_a_malformed_answer_is_a_protocol_error(
    serve: Serve, bundle: certs.CertBundle
) -> None:
    server = await serve(lambda method, url, conn: (b"NOT HTTP AT ALL\r\n\r\n", False))
    async with transport(server, bundle) as http:
        with pytest.raises(httpx.RemoteProtocolError):
            await http.get("/")


async def test_a_cancelled_request_leaves_no_connection_to_reuse(
    serve: Serve, bundle: certs.CertBundle
) -> None:
    server = await serve(silent_on_slow)
    async with transport(server, bundle) as http:
        task = asyncio.create_task(http.get("/slow"))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert (await http.get("/fast")).status_code == 200
    assert server.connections == 2


async def test_connections_idle_past_their_time_are_not_reused(
    serve: Serve, bundle: certs.CertBundle
) -> None:
    server = await serve(answer_all)
    async with transport(server, bundle, idle_seconds=0.0) as http:
        for _ in range(3):
            assert (await http.get("/")).status_code == 200
    assert server.connections == 3


async def test_the_servers_certificate_is_verified_and_a_refusal_is_unreachable(
    serve: Serve, bundle: certs.CertBundle
) -> None:
    server = await serve(answer_all)
    other = certs.generate(["localhost"], days=1)  # another CA: the server is not trusted
    url = f"https://127.0.0.1:{server.port}"
    async with httpx.AsyncClient(
        base_url=url, transport=LeanTransport(url, _client_context(other))
    ) as http:
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            await http.get("/")
    assert server.requests == []
    closed = f"https://127.0.0.1:{free_port()}"
    async with httpx.AsyncClient(
        base_url=closed, transport=LeanTransport(closed, _client_context(bundle))
    ) as http:
        with pytest.raises(httpx.ConnectError) as refused:
            await http.get("/")
    assert is_unreachable(refused.value)


async def test_the_client_sends_requests_and_watches_through_ours_and_a_proxy_keeps_httpx(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    creds = Credentials(server="https://10.0.0.1:6443", token="t", insecure=True)
    client = KubeClient(creds)
    try:
        assert isinstance(client._http._transport, LeanTransport)
    finally:
        await client.aclose()
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    assert client_module._proxied(creds.server)
    proxied = KubeClient(creds)
    try:
        assert not isinstance(proxied._http._transport, LeanTransport)
    finally:
        await proxied.aclose()
    monkeypatch.setenv("NO_PROXY", "10.0.0.1")
    assert not client_module._proxied(creds.server)


# ---- streams (watches)

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
CHUNKED_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
)


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def event(n: int, pad: int = 0) -> bytes:
    obj = b'{"metadata":{"name":"p%d","resourceVersion":"%d"},"pad":"%s"}' % (n, n, b"x" * pad)
    return b'{"type":"ADDED","object":' + obj + b"}\n"


@pytest.fixture
async def raw_server(
    server_context: ssl.SSLContext,
) -> AsyncIterator[Callable[..., Awaitable[str]]]:
    """A TLS server that runs ``handler`` on each connection; returns its URL."""
    servers: list[asyncio.Server] = []
    counts: list[int] = []

    async def start(handler: Handler) -> str:
        async def counted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            counts.append(1)
            try:
                await handler(reader, writer)
            except (ConnectionError, ssl.SSLError):
                pass
            finally:
                writer.close()

        server = await asyncio.start_server(counted, "127.0.0.1", 0, ssl=server_context)
        servers.append(server)
        return f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}"

    start.connections = counts  # type: ignore[attr-defined]
    yield start
    for server in servers:
        server.close()


def kube(url: str, bundle: certs.CertBundle, tmp_path: Path) -> KubeClient:
    ca = tmp_path / "ca.crt"
    ca.write_bytes(bundle.ca_pem)
    return KubeClient(Credentials(server=url, token="t", ca_file=str(ca)))


async def watch_names(
    client: KubeClient, names: list[str], opened: Callable[[], None] | None = None
) -> None:
    async for got in client.watch("/api/v1/pods", {}, opened=opened):
        names.append(got["object"]["metadata"]["name"])


async def test_a_watch_yields_each_event_as_it_comes_with_lines_split_across_reads(
    raw_server: Callable[..., Awaitable[str]], bundle: certs.CertBundle, tmp_path: Path
) -> None:
    """The server holds the rest of the body until the client has the first event: a
    transport that read the body whole would wait forever. Event 2 is split across chunks
    and reads, event 3 comes with it."""
    first_seen = asyncio.Event()
    asked: list[str] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await _read_request(reader)
        assert request is not None
        asked.append(request[1])
        two = event(2)
        writer.write(CHUNKED_HEAD + chunk(event(1) + two[:10]))
        await writer.drain()
        await asyncio.wait_for(first_seen.wait(), 5)
        writer.write(chunk(two[10:25]))
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(chunk(two[25:] + event(3)) + b"0\r\n\r\n")
        await writer.drain()

    client = kube(await raw_server(handler), bundle, tmp_path)
    names: list[str] = []
    try:
        async for got in client.watch("/api/v1/pods", {"resourceVersion": "7"}):
            names.append(got["object"]["metadata"]["name"])
            first_seen.set()
    finally:
        await client.aclose()
    assert names == ["p1", "p2", "p3"]
    assert asked == ["/api/v1/pods?resourceVersion=7&watch=true"]


async def test_a_watch_cut_mid_body_is_a_transport_error_after_the_events_that_came(
    raw_server: Callable[..., Awaitable[str]], bundle: certs.CertBundle, tmp_path: Path
) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(CHUNKED_HEAD + chunk(event(1) + event(2)[:7]))
        await writer.drain()
        await asyncio.sleep(0.1)  # then closed, the body unfinished

    client = kube(await raw_server(handler), bundle, tmp_path)
    names: list[str] = []
    try:
        with pytest.raises(httpx.RemoteProtocolError):
            await watch_names(client, names)
    finally:
        await client.aclose()
    assert names == ["p1"]


async def test_a_watch_refused_is_an_api_error_with_the_servers_status(
    raw_server: Callable[..., Awaitable[str]], bundle: certs.CertBundle, tmp_path: Path
) -> None:
    gone = b'{"kind":"Status","status":"Failure","reason":"Expired","message":"too old","code":410}'

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(ok(gone).replace(b"200 OK", b"410 Gone"))
        await writer.drain()
        await asyncio.sleep(0.5)

    client = kube(await raw_server(handler), bundle, tmp_path)
    opened = []
    try:
        with pytest.raises(ApiError) as refused:
            await watch_names(client, [], opened=lambda: opened.append(1))
    finally:
        await client.aclose()
    assert refused.value.status == 410
    assert "too old" in refused.value.message
    assert opened == []


async def test_a_watch_left_early_closes_its_connection_and_requests_go_on(
    raw_server: Callable[..., Awaitable[str]], bundle: certs.CertBundle, tmp_path: Path
) -> None:
    """A watch whose reader stops (a cancelled watch task) closes its connection (the
    server sees the close) and is never reused; a later request gets one of its own."""
    closed_seen = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await _read_request(reader)
        assert request is not None
        if request[1].startswith("/api/v1/pods?"):
            writer.write(CHUNKED_HEAD + chunk(event(1)))
            await writer.drain()
            if not await reader.read(1):  # the client closed it
                closed_seen.set()
            return
        writer.write(ok())
        await writer.drain()

    url = await raw_server(handler)
    client = kube(url, bundle, tmp_path)
    try:
        async for _ in client.watch("/api/v1/pods", {}):
            break
        await asyncio.wait_for(closed_seen.wait(), 5)
        assert await client.get("/api/v1/namespaces/default") == {"kind": "Status"}
    finally:
        await client.aclose()
    assert len(raw_server.connections) == 2  # type: ignore[attr-defined]


async def test_a_long_body_read_slowly_comes_whole_and_in_order(
    raw_server: Callable[..., Awaitable[str]], bundle: certs.CertBundle, tmp_path: Path
) -> None:
    """Far more than the stream holds unread (the connection stops reading, then reads on)."""
    count = 600

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(CHUNKED_HEAD)
        for n in range(count):
            writer.write(chunk(event(n, pad=8000)))
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    client = kube(await raw_server(handler), bundle, tmp_path)
    names: list[str] = []
    try:
        async for got in client.watch("/api/v1/pods", {}):
            if not names:
                await asyncio.sleep(0.3)  # the server writes all the while
            names.append(got["object"]["metadata"]["name"])
    finally:
        await client.aclose()
    assert names == [f"p{n}" for n in range(count)]


def test_a_watch_on_uvloop_pauses_reads_on_and_comes_whole(
    server_context: ssl.SSLContext, bundle: certs.CertBundle, tmp_path: Path
) -> None:
    """The webhook's process runs on uvloop, whose transports are its own: the same long
    body read slowly (reading paused and resumed), then a request on the same client."""
    count = 400

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await _read_request(reader)
            assert request is not None
            if request[1].startswith("/api/v1/pods?"):
                writer.write(CHUNKED_HEAD)
                for n in range(count):
                    writer.write(chunk(event(n, pad=8000)))
                writer.write(b"0\r\n\r\n")
            else:
                writer.write(ok())
            await writer.drain()
            await reader.read(1)
        finally:
            writer.close()

    async def scenario() -> tuple[list[str], dict[str, Any] | None]:
        server = await asyncio.start_server(handler, "127.0.0.1", 0, ssl=server_context)
        url = f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        client = kube(url, bundle, tmp_path)
        names: list[str] = []
        try:
            async for got in client.watch("/api/v1/pods", {}):
                if not names:
                    await asyncio.sleep(0.3)
                names.append(got["object"]["metadata"]["name"])
            answer = await client.get("/api/v1/namespaces/default")
        finally:
            await client.aclose()
            server.close()
        return names, answer

    names, answer = uvloop.run(scenario())
    assert names == [f"p{n}" for n in range(count)]
    assert answer == {"kind": "Status"}
