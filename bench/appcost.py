"""Cost of each ASGI app alone (µs per request): called in process with a ready-made request,
no socket, no TLS, no HTTP parsing. Beside the servers' CPU per request it splits the gap
between webhook and floor into "our app code" and "everything around it".

Run: ``python -m bench.appcost CERT_DIR``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

from bench.payloads import asgi_post_scope, review_bytes, tekton_pod
from bench.target import floor_app, webhook_app
from coschedule.server.admission import Message


async def _per_call_us(app: Any, body: bytes, rounds: int, budget: float) -> float:
    headers = [
        (b"host", b"127.0.0.1:8443"),
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    scope = asgi_post_scope(headers)
    statuses: list[int] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    await app(dict(scope), receive, send)
    if statuses != [200]:
        raise RuntimeError(f"app answered {statuses}")
    calls = 1
    while True:  # calibrate: one round takes about `budget` seconds
        start = time.perf_counter()
        for _ in range(calls):
            await app(dict(scope), receive, send)
        elapsed = time.perf_counter() - start
        if elapsed > budget / 4:
            break
        calls *= 2
    calls = max(1, int(calls * budget / elapsed))
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            await app(dict(scope), receive, send)
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


async def _cold_call_us(app: Any, body: bytes, calls: int) -> float:
    """Median µs of one call made right after 8 MiB were copied (more than L2 and a fair
    share of L3): the code and data start cold, as they do in a server that did TLS and
    HTTP work for other requests in between."""
    scope: dict[str, Any] = {
        "type": "http",
        "method": "POST",
        "path": "/mutate",
        "headers": [(b"content-type", b"application/json")],
    }

    async def receive() -> Message:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: Message) -> None:
        return None

    thrash = bytearray(8 * 1024 * 1024)
    samples = []
    for _ in range(calls):
        bytes(thrash)
        start = time.perf_counter()
        await app(dict(scope), receive, send)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e6


def measure(
    cert_dir: Path, rounds: int = 5, budget: float = 0.3, cold_calls: int = 2000
) -> dict[str, float]:
    """µs per Tekton review for the webhook's HTTPS app and for the floor app, hot (in a
    loop) and cold (caches flushed before each call)."""
    import uvloop

    body = review_bytes(tekton_pod())
    app, _, _ = webhook_app(cert_dir)

    async def both() -> dict[str, float]:
        return {
            "webhook_us": round(await _per_call_us(app, body, rounds, budget), 1),
            "floor_us": round(await _per_call_us(floor_app, body, rounds, budget), 1),
            "webhook_cold_us": round(await _cold_call_us(app, body, cold_calls), 1),
            "floor_cold_us": round(await _cold_call_us(floor_app, body, cold_calls), 1),
        }

    return uvloop.run(both())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("cert_dir", type=Path)
    print(measure(parser.parse_args().cert_dir))


if __name__ == "__main__":
    main()
