"""The API client keeps its TLS connections to the API server: a burst of requests wider
than httpx's default pool of 20 idle connections (the reconciler's releases) must not pay a
handshake again on the next burst."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

from coschedule import certs
from coschedule.kube.client import Credentials, KubeClient

WIDTH = 40  # requests in flight at once: more than httpx keeps by default


async def test_a_wide_burst_reuses_its_connections_on_the_next(tmp_path: Path) -> None:
    certs.write_bundle(certs.generate(["localhost"]), tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tmp_path / certs.CERT_FILE, tmp_path / certs.KEY_FILE)
    handshakes = 0
    waiting: list[asyncio.Event] = []  # requests held until the whole burst is in flight

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal handshakes
        handshakes += 1  # the TLS handshake is done when the connection is handed over
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                held = asyncio.Event()
                waiting.append(held)
                if len(waiting) == WIDTH:  # every request of the burst is on a connection
                    for event in waiting:
                        event.set()
                    waiting.clear()
                await held.wait()
                body = b'{"kind": "Status"}'
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=context)
    port = server.sockets[0].getsockname()[1]
    client = KubeClient(
        Credentials(server=f"https://localhost:{port}", ca_file=str(tmp_path / certs.CA_FILE))
    )
    try:
        for burst in range(3):
            answers = await asyncio.wait_for(
                asyncio.gather(*(client.get("/api") for _ in range(WIDTH))), 60
            )
            assert answers == [{"kind": "Status"}] * WIDTH
            # One connection per request in flight, made by the first burst only (httpx's
            # defaults kept 20 of them: 20 handshakes more for each later burst).
            assert handshakes == WIDTH, f"burst {burst}"
    finally:
        await client.aclose()
        server.close()
