"""HTTP/1.1 over kept-alive connections: httpx's transport for the client's every request,
its watches included.

httpx's own transport (httpcore) costs the reconciler more Python per request than the
request itself: it reads TLS through anyio's memory-BIO stream and h11, looks at every
pooled connection's socket for each request (so a larger pool costs more per request),
and keeps only 20 connections alive, so a burst of 32 release patches opened a new TLS
connection for nearly every one (docs/benchmarks.md). Here a connection is an asyncio
protocol reading with httptools (C), the pool is a stack of idle connections whose
closing the event loop reports, and as many are kept as are in use at once (bounded).
A request marked ``STREAM`` (a watch) is answered as soon as its head is in, its body
read as it comes, on a connection of its own that is closed when the body is.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar, cast

import httptools
import httpx

# A connection idle this long is closed, not reused: kube-apiserver closes an idle one at
# 90 s (Go's IdleTimeout), and one it closed just as a request was sent fails that request.
IDLE_SECONDS = 30.0
# Idle connections kept at most; more in use at once are closed when they are done.
MAX_IDLE = 64
# Requests on their way at once; more wait for one to end (httpx's own limit). Streams
# (watches) are not counted: they last minutes and a process holds a few.
MAX_CONNECTIONS = 100
# The request extension that asks for the body as it comes (``client.stream(...,
# extensions={STREAM: True})``); httpx's own transport ignores it.
STREAM = "coschedule.stream"
# Bytes a stream holds unread before the connection stops reading (TCP then slows the server).
STREAM_HIGH_WATER = 1 << 20


class _Closed(Exception):
    """The server closed the connection before the whole response came."""

    def __init__(self, answered: bool) -> None:
        super().__init__("the server closed the connection" + (" mid-response" * answered))
        self.answered = answered


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection; one exchange at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._waiter: asyncio.Future[None] | None = None
        self._parser: httptools.HttpResponseParser | None = None
        self._headers: list[tuple[bytes, bytes]] = []
        self._body: list[bytes] = []
        self._answered = False
        self._keep_alive = False
        # a stream's body: read as it comes (``read``), not joined at the end
        self._streaming = False
        self._unread: list[bytes] = []
        self._unread_bytes = 0
        self._ended = False
        self._failure: Exception | None = None
        self._reader: asyncio.Future[None] | None = None

    # ---- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses: a cast, not a check
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._answered = True
        if self._parser is None:  # nothing asked: a server speaking out of turn
            self.close()
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(httpx.RemoteProtocolError(f"malformed response: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(_Closed(self._answered))

    # ---- httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        if self._streaming and self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def on_body(self, body: bytes) -> None:
        if not self._streaming:
            self._body.append(body)
            return
        self._unread.append(body)
        self._unread_bytes += len(body)
        transport = self.transport
        if self._unread_bytes > STREAM_HIGH_WATER and transport and not transport.is_closing():
            transport.pause_reading()
        self._wake_reader()

    def on_message_complete(self) -> None:
        # asked here: once the message is done the parser is reset and says False
        assert self._parser is not None
        self._keep_alive = self._parser.should_keep_alive()
        if self._streaming:
            self._ended = True
            self._wake_reader()
        elif self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # ----
    def _fail(self, exc: Exception) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(exc)
        elif self._streaming and self._failure is None and not self._ended:
            self._failure = exc
            self._wake_reader()

    def _wake_reader(self) -> None:
        if self._reader is not None and not self._reader.done():
            self._reader.set_result(None)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    async def _ask(
        self, request: bytes, seconds: float | None, streaming: bool
    ) -> httptools.HttpResponseParser:
        """Send one request and wait for its whole answer, or for its head only if ``streaming``."""
        assert self.transport is not None
        parser = httptools.HttpResponseParser(self)
        self._parser, self._headers, self._body = parser, [], []
        self._answered = self._keep_alive = self._ended = False
        self._streaming = streaming
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            self.transport.write(request)
            async with asyncio.timeout(seconds):
                await self._waiter
        finally:
            self._waiter = None
            if not streaming:  # a stream's parser reads its body on
                self._parser = None
        return parser

    async def exchange(
        self, request: bytes, seconds: float | None
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes, bool]:
        """Send one request, read its whole response: (status, headers, body, keep alive)."""
        parser = await self._ask(request, seconds, streaming=False)
        return parser.get_status_code(), self._headers, b"".join(self._body), self._keep_alive

    async def open_stream(
        self, request: bytes, seconds: float | None
    ) -> tuple[int, list[tuple[bytes, bytes]]]:
        """Send one request, wait for its head only: (status, headers); the body is ``read``."""
        parser = await self._ask(request, seconds, streaming=True)
        return parser.get_status_code(), self._headers

    async def read(self, seconds: float | None) -> bytes:
        """What of a stream's body came since the last read; b"" once it is all read."""
        while not self._unread:
            if self._failure is not None:
                raise self._failure
            if self._ended:
                return b""
            self._reader = asyncio.get_running_loop().create_future()
            try:
                async with asyncio.timeout(seconds):
                    await self._reader
            finally:
                self._reader = None
        data = b"".join(self._unread) if len(self._unread) > 1 else self._unread[0]
        self._unread.clear()
        transport = self.transport
        if self._unread_bytes > STREAM_HIGH_WATER and transport and not transport.is_closing():
            transport.resume_reading()
        self._unread_bytes = 0
        return data


_Done = Callable[[_Connection], None]
_T = TypeVar("_T")


class _Body(httpx.AsyncByteStream):
    """A stream's body as it comes; closing it closes its connection."""

    def __init__(self, conn: _Connection, seconds: float | None, done: _Done) -> None:
        self._conn = conn
        self._seconds = seconds
        self._done = done

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            try:
                data = await self._conn.read(self._seconds)
            except _Closed as exc:
                raise httpx.RemoteProtocolError(str(exc)) from exc
            except TimeoutError as exc:
                raise httpx.ReadTimeout(f"nothing more of the body in {self._seconds:g} s") from exc
            if not data:
                return
            yield data

    async def aclose(self) -> None:
        self._done(self._conn)


def _timeouts(request: httpx.Request) -> tuple[float | None, float | None]:
    found = request.extensions.get("timeout") or {}
    return found.get("connect"), found.get("read")


def _head(request: httpx.Request) -> bytes:
    url = request.url
    lines = [request.method.encode("ascii"), b" ", url.raw_path, b" HTTP/1.1\r\n"]
    for name, value in request.headers.raw:
        lines += (name, b": ", value, b"\r\n")
    lines.append(b"\r\n")
    return b"".join(lines)


class LeanTransport(httpx.AsyncBaseTransport):
    """httpx's transport for one API server's requests (not streams): HTTP/1.1 over
    kept-alive connections. A connection the server closed while idle is never picked
    (the event loop reports the close); one it closes as a request goes out fails that
    request, which is sent again once on a new connection only when nothing was answered
    and the method is safe to repeat (GET), as Go's client does."""

    def __init__(
        self,
        server: str,
        verify: ssl.SSLContext | bool,
        *,
        max_idle: int = MAX_IDLE,
        idle_seconds: float = IDLE_SECONDS,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        url = httpx.URL(server)
        self._host = url.host
        self._tls = url.scheme == "https"
        self._port = url.port or (443 if self._tls else 80)
        self._ssl: ssl.SSLContext | None = None
        if self._tls:
            if isinstance(verify, ssl.SSLContext):
                self._ssl = verify
            else:
                self._ssl = ssl.create_default_context()
                if not verify:
                    self._ssl.check_hostname = False
                    self._ssl.verify_mode = ssl.CERT_NONE
        self._idle: list[_Connection] = []
        self._max_idle = max_idle
        self._idle_seconds = idle_seconds
        self._open: set[_Connection] = set()
        self._slots = asyncio.Semaphore(max_connections)

    def _pick(self) -> _Connection | None:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            # is_closing: the close has begun (the server's EOF or TLS close_notify read)
            # but the loop has not called connection_lost yet
            if (
                not conn.closed
                and conn.transport is not None
                and not conn.transport.is_closing()
                and now - conn.idle_since < self._idle_seconds
            ):
                return conn
            conn.close()
            self._open.discard(conn)
        return None

    async def _connect(self, seconds: float | None) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(seconds):
                _, conn = await loop.create_connection(
                    _Connection,
                    self._host,
                    self._port,
                    ssl=self._ssl,
                    server_hostname=self._host if self._ssl is not None else None,
                )
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(f"connecting to {self._host}:{self._port}") from exc
        except OSError as exc:  # ssl.SSLError included
            raise httpx.ConnectError(str(exc) or type(exc).__name__) from exc
        self._open.add(conn)
        return conn

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        data = _head(request) + await request.aread()
        if request.extensions.get(STREAM):
            return await self._start_stream(request, data)
        async with self._slots:
            return await self._send(request, data)

    async def _attempt(
        self, request: httpx.Request, ask: Callable[[_Connection], Awaitable[_T]]
    ) -> tuple[_Connection, _T]:
        """``ask`` on a kept connection or a new one; a GET sent on a kept connection that the
        server closed unanswered is sent once more, on a new one."""
        connect_timeout, _ = _timeouts(request)
        for attempt in range(2):
            conn = self._pick()
            reused = conn is not None
            if conn is None:
                conn = await self._connect(connect_timeout)
            try:
                return conn, await ask(conn)
            except _Closed as exc:
                self._drop(conn)
                if reused and not exc.answered and request.method == "GET" and attempt == 0:
                    continue
                raise httpx.RemoteProtocolError(str(exc)) from exc
            except TimeoutError as exc:
                self._drop(conn)
                raise httpx.ReadTimeout("no response in time") from exc
            except BaseException:  # a malformed answer, or cancelled mid-response
                self._drop(conn)
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def _start_stream(self, request: httpx.Request, data: bytes) -> httpx.Response:
        _, read_timeout = _timeouts(request)
        conn, (status, headers) = await self._attempt(
            request, lambda conn: conn.open_stream(data, read_timeout)
        )
        return httpx.Response(
            status,
            headers=headers,
            stream=_Body(conn, read_timeout, self._drop),
            extensions={"http_version": b"HTTP/1.1"},
        )

    async def _send(self, request: httpx.Request, data: bytes) -> httpx.Response:
        _, read_timeout = _timeouts(request)
        conn, (status, headers, body, keep) = await self._attempt(
            request, lambda conn: conn.exchange(data, read_timeout)
        )
        if keep and not conn.closed and len(self._idle) < self._max_idle:
            conn.idle_since = time.monotonic()
            self._idle.append(conn)
        else:
            self._drop(conn)
        return httpx.Response(
            status,
            headers=headers,
            content=body,
            extensions={"http_version": b"HTTP/1.1"},
        )

    def _drop(self, conn: _Connection) -> None:
        conn.close()
        self._open.discard(conn)

    async def aclose(self) -> None:
        for conn in self._open:
            conn.close()
        self._open.clear()
        self._idle.clear()
