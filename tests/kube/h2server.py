"""A small TLS API server for the client's HTTP/2 tests: it offers h2 by ALPN (or only
http/1.1), answers GETs with ``{}`` (never, under ``/hang/``) and streams the watch events
that the test pushes (``/watch/``), over HTTP/2 honouring its flow control or over HTTP/1.1
chunked. ``protocols`` records what each accepted connection speaks.

Only the ``h2`` library's state machine is used (the client's own dependency); the sockets
are asyncio's.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import ssl
import tempfile
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import orjson

from coschedule import certs


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _tls(protocols: list[str]) -> tuple[ssl.SSLContext, str]:
    """A serving context for 127.0.0.1 offering ``protocols`` by ALPN, and its CA's PEM."""
    ca = certs.generate_ca(dt.timedelta(days=1))
    serving = certs.issue_serving(ca, ["127.0.0.1"], dt.timedelta(days=1))
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    with tempfile.TemporaryDirectory() as folder:
        cert, key = Path(folder, "tls.crt"), Path(folder, "tls.key")
        cert.write_bytes(serving.cert_pem)
        key.write_bytes(serving.key_pem)
        ctx.load_cert_chain(str(cert), str(key))
    ctx.set_alpn_protocols(protocols)
    return ctx, ca.cert_pem.decode()


@dataclass
class Watch:
    """One watch stream: events the test pushes, and the bytes the server got out."""

    queue: asyncio.Queue[bytes] = field(default_factory=asyncio.Queue)
    sent: int = 0


@dataclass
class H2Server:
    offer_h2: bool = True
    ca_pem: str = ""
    port: int = 0
    protocols: list[str] = field(default_factory=list)  # one per accepted connection
    watches: dict[str, Watch] = field(default_factory=dict)  # by the watch's path
    _writers: list[asyncio.StreamWriter] = field(default_factory=list)
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def start(self) -> None:
        ctx, self.ca_pem = _tls(["h2", "http/1.1"] if self.offer_h2 else ["http/1.1"])
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0, ssl=ctx)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        self.drop_connections()
        if self._server is not None:
            self._server.close()

    def drop_connections(self) -> None:
        """Cut every connection at the TCP level, as a restarted API server would."""
        for writer in self._writers:
            writer.transport.abort()
        self._writers.clear()
        for task in list(self._tasks):
            task.cancel()  # their streams are gone: a new watch gets a new queue
        self.watches.clear()

    def watch(self, path: str) -> Watch:
        return self.watches.setdefault(path, Watch())

    def push(self, path: str, name: str, pad: int = 0) -> None:
        """Queue one ADDED event (with ``pad`` bytes of annotation) on the watch at ``path``."""
        obj = {"metadata": {"name": name, "annotations": {"pad": "x" * pad}}}
        line = orjson.dumps({"type": "ADDED", "object": obj}) + b"\n"
        self.watch(path).queue.put_nowait(line)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        tls = writer.get_extra_info("ssl_object")
        protocol = (tls.selected_alpn_protocol() if tls else None) or "http/1.1"
        self.protocols.append(protocol)
        self._writers.append(writer)
        task = asyncio.current_task()
        if task is not None:  # cancelled with its connection (drop_connections, stop)
            self._tasks.add(task)
        try:
            if protocol == "h2":
                await self._serve_h2(reader, writer)
            else:
                await self._serve_http1(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            pass

    async def _serve_http1(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            method, target = head.split(b" ", 2)[:2]
            if method != b"GET":
                raise ConnectionError("only GET")
            path = target.decode().split("?", 1)[0]
            if not path.startswith("/watch/"):
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 2\r\n\r\n{}"
                )
                await writer.drain()
                continue
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
            )
            watch = self.watch(path)
            while True:  # until the connection goes: one watch per connection
                data = await watch.queue.get()
                writer.write(b"%x\r\n%s\r\n" % (len(data), data))
                watch.sent += len(data)
                await writer.drain()

    async def _serve_h2(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=False, header_encoding="utf-8")
        )
        conn.initiate_connection()
        writer.write(conn.data_to_send())
        while data := await reader.read(65536):
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.RequestReceived):
                    headers = {_text(k): _text(v) for k, v in event.headers}
                    path = headers[":path"].split("?", 1)[0]
                    self._spawn(self._answer(conn, writer, event.stream_id, path))
            writer.write(conn.data_to_send())
            await writer.drain()

    async def _answer(
        self, conn: h2.connection.H2Connection, writer: asyncio.StreamWriter, sid: int, path: str
    ) -> None:
        with contextlib.suppress(h2.exceptions.StreamClosedError):  # the client closed it
            await self._respond(conn, writer, sid, path)

    async def _respond(
        self, conn: h2.connection.H2Connection, writer: asyncio.StreamWriter, sid: int, path: str
    ) -> None:
        if path.startswith("/hang/"):  # a request the server never answers
            await asyncio.Event().wait()
        conn.send_headers(sid, [(":status", "200"), ("content-type", "application/json")])
        if not path.startswith("/watch/"):
            conn.send_data(sid, b"{}", end_stream=True)
            writer.write(conn.data_to_send())
            return
        writer.write(conn.data_to_send())
        watch = self.watch(path)
        while True:
            data = await watch.queue.get()
            while data:
                size = min(
                    conn.local_flow_control_window(sid), conn.max_outbound_frame_size, len(data)
                )
                if size <= 0:  # the client has not read what it got: wait for its window
                    await asyncio.sleep(0.01)
                    continue
                conn.send_data(sid, data[:size])
                writer.write(conn.data_to_send())
                watch.sent += size
                data = data[size:]
