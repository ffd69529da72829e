"""A load generator for the webhook over HTTPS: open loop (constant rate) or closed loop.

Open loop: request ``i`` is due at ``start + i / rate`` whatever happened before it, and its
latency is measured from that *scheduled* time to the last byte of its answer. A request that
finds no free connection waits in a queue, and that wait counts, so a stalled server shows up
in the percentiles instead of slowing the generator down (no coordinated omission).

Each keep-alive connection carries one request at a time (no pipelining), as kube-apiserver
does; open enough connections that a free one is nearly always there (``queued`` says how
often one was not). uvloop timers have 1 ms resolution, so the last 1.5 ms before a send is
spent yielding to the loop in a tight cycle: sends start within a few µs of their schedule
(``send_lag_ms`` reports it) at the price of one busy core, the generator's own.

Run: ``python -m bench.openloop --port P --body FILE --rate 1000 --duration 10 [--cpu 1]``
prints one JSON object (``LoadResult``). ``--closed`` runs the closed loop instead.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import math
import os
import ssl
import sys
import time
from array import array
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import orjson

SPIN_WINDOW_S = 0.0015  # below this, sleeping would overshoot by up to 1 ms (uvloop timers)
MAX_FAILURES = 50  # connection failures in a row before the run gives up
GRACE_S = 20.0  # after the last send, how long answers may still take before they count lost


@dataclass(frozen=True, slots=True)
class LoadConfig:
    port: int
    body: bytes
    host: str = "127.0.0.1"
    path: str = "/mutate"
    rate: float = 1000.0  # open loop: requests per second
    duration: float = 10.0  # measured seconds (after warm-up)
    warmup: float = 1.0  # seconds of the same load whose samples are dropped
    connections: int = 64
    closed: bool = False  # closed loop: every connection sends again as soon as answered
    ca_file: str | None = None
    connection_close: bool = False  # closed loop only: a new TLS connection per request


@dataclass(slots=True)
class LoadResult:
    mode: str
    target_rate: float | None
    connections: int
    measured: int  # requests in the measured window, answered or not
    ok: int  # answered 200
    errors: int  # other statuses, lost connections, no answer within the grace time
    duration_s: float
    achieved_rps: float
    latency_ms: dict[str, float] = field(default_factory=dict)
    send_lag_ms: dict[str, float] = field(default_factory=dict)
    max_in_flight: int = 0
    queued: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    sample_body: str = ""  # the first answer, for correctness checks

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def percentiles(samples: array[float] | list[float], scale: float = 1e3) -> dict[str, float]:
    """Nearest-rank percentiles (and max, mean) of seconds, in ms by default."""
    if not samples:
        return {}
    ordered = sorted(samples)
    n = len(ordered)

    def rank(p: float) -> float:
        return ordered[max(0, math.ceil(p * n) - 1)] * scale

    return {
        "p50": rank(0.50),
        "p90": rank(0.90),
        "p99": rank(0.99),
        "p99.9": rank(0.999),
        "max": ordered[-1] * scale,
        "mean": sum(ordered) / n * scale,
    }


def build_request(config: LoadConfig) -> bytes:
    head = (
        f"POST {config.path} HTTP/1.1\r\n"
        f"Host: {config.host}:{config.port}\r\n"
        "User-Agent: coschedule-bench\r\n"
        "Accept: application/json\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(config.body)}\r\n"
        + ("Connection: close\r\n" if config.connection_close else "")
        + "\r\n"
    )
    return head.encode("ascii") + config.body


def client_context(ca_file: str | None) -> ssl.SSLContext:
    if ca_file:
        return ssl.create_default_context(cafile=ca_file)  # verify, as kube-apiserver does
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


class _Conn(asyncio.Protocol):
    """One HTTP/1.1 connection with at most one request outstanding."""

    def __init__(self, gen: _Generator) -> None:
        self.gen = gen
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.need = -1  # total bytes of the current answer, once its head is read
        self.body_at = 0
        self.status = 0
        self.index = -1  # request index outstanding on this connection, -1 when idle
        self.scheduled = 0.0
        self.closed = False
        self.used = False  # has carried a request

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's SSL transport implements asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)

    def send(self, index: int, scheduled: float) -> None:
        assert self.transport is not None
        self.index = index
        self.scheduled = scheduled
        self.used = True
        self.transport.write(self.gen.request)
        self.gen.sent(index, scheduled)

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        if self.need < 0:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(buf[:end]).lower()
            self.status = int(head[9:12])
            at = head.find(b"\r\ncontent-length:")
            if at < 0:  # our servers always send a length; anything else is a broken answer
                self.status = 599
                length = 0
            else:
                stop = head.find(b"\r\n", at + 2)
                length = int(head[at + 17 : stop if stop >= 0 else len(head)])
            self.body_at = end + 4
            self.need = self.body_at + length
        if len(buf) < self.need:
            return
        body = bytes(buf[self.body_at : self.need]) if self.gen.want_body else b""
        del buf[: self.need]
        self.need = -1
        index, scheduled = self.index, self.scheduled
        self.index = -1
        self.gen.answered(self, index, scheduled, self.status, body)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        index = self.index
        self.index = -1
        self.gen.lost(self, index)


class _Generator:
    def __init__(self, config: LoadConfig, loop: asyncio.AbstractEventLoop) -> None:
        self.config = config
        self.loop = loop
        self.request = build_request(config)
        self.context = client_context(config.ca_file)
        self.idle: list[_Conn] = []
        self.backlog: collections.deque[tuple[int, float]] = collections.deque()
        self.latencies: array[float] = array("d")
        self.lags: array[float] = array("d")
        self.statuses: collections.Counter[int] = collections.Counter()
        self.errors = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.queued = 0
        self.want_body = True
        self.sample_body = b""
        self.first_measured = 0  # index of the first request whose sample counts
        self.window: tuple[float, float] = (0.0, 0.0)  # closed loop: measured window
        self.finished = 0
        self.expected = 0
        self.done: asyncio.Future[None] = loop.create_future()
        self.stopping = False
        self.failures = 0  # in a row; reset by any answer

    async def connect(self) -> _Conn:
        _, conn = await self.loop.create_connection(
            lambda: _Conn(self),
            self.config.host,
            self.config.port,
            ssl=self.context,
            server_hostname=self.config.host,
        )
        return conn

    def _measured(self, index: int, scheduled: float) -> bool:
        if self.config.closed:
            start, end = self.window
            return start <= scheduled < end
        return index >= self.first_measured

    def sent(self, index: int, scheduled: float) -> None:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        if self._measured(index, scheduled):
            self.lags.append(time.perf_counter() - scheduled)

    def answered(self, conn: _Conn, index: int, scheduled: float, status: int, body: bytes) -> None:
        now = time.perf_counter()
        self.in_flight -= 1
        self.failures = 0
        if not self.sample_body:
            self.sample_body = body
            self.want_body = False
        if self._measured(index, scheduled):
            self.statuses[status] += 1
            if status == 200:
                self.latencies.append(now - scheduled)
            else:
                self.errors += 1
        self._finish_one()
        self._next(conn)

    def lost(self, conn: _Conn, index: int) -> None:
        if conn in self.idle:
            self.idle.remove(conn)
        if index >= 0:
            self.in_flight -= 1
            if self._measured(index, conn.scheduled):
                self.errors += 1
                self.statuses[0] += 1  # status 0: the connection died before an answer
            self.failures += 1
            self._finish_one()
        if self.failures > MAX_FAILURES:
            self._give_up()
        elif not self.stopping:
            # Keep the pool full (the server may close an idle connection, or close after
            # every answer): the replacement picks up queued work once connected.
            task = self.loop.create_task(self._replace())
            task.add_done_callback(_ignore)

    async def _replace(self) -> None:
        try:
            conn = await self.connect()
        except OSError:
            self.errors += 1
            self.failures += 1
            if self.failures > MAX_FAILURES:
                self._give_up()
            else:
                await asyncio.sleep(0.01)
                await self._replace()
            return
        self._next(conn)

    def _give_up(self) -> None:
        # The server is gone or refuses us: stop instead of reconnecting forever; what was
        # not answered counts as errors.
        self.stopping = True
        if not self.done.done():
            self.done.set_result(None)

    def _finish_one(self) -> None:
        self.finished += 1
        if self.expected and self.finished >= self.expected and not self.done.done():
            self.done.set_result(None)

    def _next(self, conn: _Conn) -> None:
        if conn.closed:
            return
        if self.config.closed:
            now = time.perf_counter()
            if not self.stopping and now < self.window[1]:
                if self.config.connection_close and conn.used:
                    return  # the server closes it; lost() opens the next connection
                conn.send(0, now)
            return
        if self.backlog:
            index, scheduled = self.backlog.popleft()
            conn.send(index, scheduled)
        else:
            self.idle.append(conn)

    def dispatch(self, index: int, scheduled: float) -> None:
        if self.idle:
            self.idle.pop().send(index, scheduled)  # LIFO, as Go's idle pool
        else:
            self.queued += 1
            self.backlog.append((index, scheduled))


def _ignore(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()


async def _wait_until(deadline: float) -> None:
    while True:
        left = deadline - time.perf_counter()
        if left <= 0:
            return
        if left > SPIN_WINDOW_S:
            await asyncio.sleep(left - SPIN_WINDOW_S)
        else:
            await asyncio.sleep(0)


async def run_load(config: LoadConfig, on_start: Callable[[], None] | None = None) -> LoadResult:
    """Run one load; the connections are opened (and TLS set up) before the clock starts,
    and ``on_start`` is called when it does."""
    loop = asyncio.get_running_loop()
    gen = _Generator(config, loop)
    conns = await asyncio.gather(*(gen.connect() for _ in range(config.connections)))
    gen.idle.extend(conns)
    if config.closed:
        result = await _closed(gen, config)
    else:
        result = await _open(gen, config, on_start)
    gen.stopping = True
    for conn in list(gen.idle) + list(conns):
        if conn.transport is not None and not conn.closed:
            conn.transport.close()
    await asyncio.sleep(0)
    return result


async def _open(
    gen: _Generator, config: LoadConfig, on_start: Callable[[], None] | None
) -> LoadResult:
    interval = 1.0 / config.rate
    warm = int(config.warmup * config.rate)
    total = warm + max(1, int(config.duration * config.rate))
    gen.first_measured = warm
    gen.expected = total
    start = time.perf_counter() + 0.01
    if on_start is not None:
        on_start()
    for index in range(total):
        if gen.stopping:
            break
        scheduled = start + index * interval
        if time.perf_counter() < scheduled:
            await _wait_until(scheduled)
        elif index % 64 == 0:
            await asyncio.sleep(0)  # running behind: still let answers in
        gen.dispatch(index, scheduled)
    last = start + (total - 1) * interval
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(gen.done), timeout=GRACE_S)
    measured = total - warm
    answered = len(gen.latencies) + gen.errors
    lost = max(0, measured - answered)
    return LoadResult(
        mode="open",
        target_rate=config.rate,
        connections=config.connections,
        measured=measured,
        ok=len(gen.latencies),
        errors=gen.errors + lost,
        duration_s=last - (start + warm * interval),
        achieved_rps=len(gen.latencies) / max(config.duration, 1e-9),
        latency_ms=percentiles(gen.latencies),
        send_lag_ms=percentiles(gen.lags),
        max_in_flight=gen.max_in_flight,
        queued=gen.queued,
        statuses={str(k): v for k, v in sorted(gen.statuses.items())},
        sample_body=gen.sample_body.decode("utf-8", "replace"),
    )


async def _closed(gen: _Generator, config: LoadConfig) -> LoadResult:
    start = time.perf_counter()
    gen.window = (start + config.warmup, start + config.warmup + config.duration)
    conns = list(gen.idle)
    gen.idle.clear()
    for conn in conns:
        conn.send(0, time.perf_counter())
    with contextlib.suppress(TimeoutError):  # the window, or less if the run gives up
        await asyncio.wait_for(
            asyncio.shield(gen.done), timeout=max(0.0, gen.window[1] - time.perf_counter())
        )
    gen.expected = gen.finished + gen.in_flight
    if gen.in_flight:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(gen.done), timeout=GRACE_S)
    ok = len(gen.latencies)
    return LoadResult(
        mode="closed",
        target_rate=None,
        connections=config.connections,
        measured=ok + gen.errors,
        ok=ok,
        errors=gen.errors,
        duration_s=config.duration,
        achieved_rps=ok / config.duration,
        latency_ms=percentiles(gen.latencies),
        send_lag_ms={},
        max_in_flight=gen.max_in_flight,
        queued=0,
        statuses={str(k): v for k, v in sorted(gen.statuses.items())},
        sample_body=gen.sample_body.decode("utf-8", "replace"),
    )


def run(config: LoadConfig, on_start: Callable[[], None] | None = None) -> LoadResult:
    import uvloop

    return uvloop.run(run_load(config, on_start))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--body", type=Path, required=True, help="the request body (a review)")
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--closed", action="store_true", help="closed loop, max throughput")
    parser.add_argument("--connection-close", action="store_true")
    parser.add_argument("--ca", default=None, help="CA file to verify the server with")
    parser.add_argument("--cpu", type=int, default=None, help="pin to this core")
    args = parser.parse_args(argv)
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    config = LoadConfig(
        port=args.port,
        body=args.body.read_bytes(),
        host=args.host,
        rate=args.rate,
        duration=args.duration,
        warmup=args.warmup,
        connections=args.connections,
        closed=args.closed,
        ca_file=args.ca,
        connection_close=args.connection_close,
    )
    result = run(config)
    sys.stdout.buffer.write(orjson.dumps(result.to_json()) + b"\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
