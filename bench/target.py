"""A benchmark server process: the webhook, or the floor, behind the same uvicorn + TLS setup.

Run: ``python -m bench.target --app webhook|floor --port P --cert-dir D [--cpu N]
[--reuse-port]``. It serves until SIGTERM/SIGINT (uvicorn's own signal handling).

Both apps get the SSLContext of ``ServingCertificate`` (the webhook's TLS settings) and the
uvicorn options of ``coschedule.server.serve.serve`` (``https_config`` mirrors them;
tests/test_bench_smoke.py checks that they stay equal). The only difference between the
two processes is the ASGI app, so their ratio is the cost of our code.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import logging
import os
import socket
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import orjson
import uvicorn

from bench.payloads import BENCH_UID
from coschedule import heap, logs
from coschedule.server.admission import Receive, Scope, Send

WEBHOOK_MODE: Final[str] = "pipelineruns"
RELOAD_INTERVAL_SECONDS: Final[float] = 2.0  # as serve(): the reload loop runs in production


def _floor_response() -> bytes:
    """A fixed allowed review with a JSONPatch, sized like the webhook's Tekton answer
    (1,345 bytes), so both servers write the same amount."""
    ops = [{"op": "add", "path": "/metadata/labels/floor", "value": "x" * 823}]
    return orjson.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": {
                "uid": BENCH_UID,
                "allowed": True,
                "patchType": "JSONPatch",
                "patch": base64.b64encode(orjson.dumps(ops)).decode("ascii"),
            },
        }
    )


FLOOR_RESPONSE: Final[bytes] = _floor_response()
_FLOOR_HEADERS: Final[list[tuple[bytes, bytes]]] = [
    (b"content-type", b"application/json"),
    (b"content-length", str(len(FLOOR_RESPONSE)).encode()),
]


async def floor_app(scope: Scope, receive: Receive, send: Send) -> None:
    """The least any Python admission webhook must do: read the body, parse it, answer."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    orjson.loads(chunks[0] if len(chunks) == 1 else b"".join(chunks))
    await send({"type": "http.response.start", "status": 200, "headers": _FLOOR_HEADERS})
    await send({"type": "http.response.body", "body": FLOOR_RESPONSE})


def https_config(app: Any, context: ssl.SSLContext, host: str, port: int) -> uvicorn.Config:
    """The HTTPS listener's uvicorn options, as ``coschedule.server.serve.serve`` sets them."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        ssl_context_factory=lambda _config, _default: context,
        log_config=None,
        access_log=False,
        server_header=False,
        lifespan="off",
        interface="asgi3",  # HttpsApp returns its handler's coroutine: not guessable
        timeout_keep_alive=30,
        proxy_headers=False,
    )


def webhook_app(cert_dir: Path, mode: str = WEBHOOK_MODE) -> tuple[Any, ssl.SSLContext, Any]:
    """(app, TLS context, reload callable) of the real webhook, offline, as ``serve
    --no-cluster`` builds it: cluster settings alone, no claim rewrite."""
    from coschedule.config.store import SettingsStore
    from coschedule.probes import probes_app
    from coschedule.server.cluster import ClusterLink
    from coschedule.server.https_app import HttpsApp
    from coschedule.server.serve import build_webhook
    from coschedule.server.webhook_metrics import WebhookMetrics

    link = ClusterLink()
    metrics = WebhookMetrics()
    store = SettingsStore(
        None, {"COSCHEDULE_COSCHEDULE": mode}, on_error=metrics.config_reload_errors.inc
    )
    store.adjust = link.adjust_settings
    store.current = link.adjust_settings(store.current)
    webhook = build_webhook(store, metrics, cert_dir, link.namespaces, link.claims, link.volumes)
    app = HttpsApp(webhook.pods, probes_app(webhook.probes, None))
    return app, webhook.certificate.context, webhook.reload_once


def floor_context(cert_dir: Path) -> ssl.SSLContext:
    """The webhook's own TLS context class, so the floor's handshakes cost the same."""
    from coschedule.server.tls import ServingCertificate
    from coschedule.server.webhook_metrics import WebhookMetrics

    certificate = ServingCertificate(cert_dir, WebhookMetrics())
    certificate.load()
    return certificate.context


def listen_socket(host: str, port: int, reuse_port: bool) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        # Several worker processes bind the same port; the kernel spreads connections.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


async def _serve(server: uvicorn.Server, sock: socket.socket, reload: Callable[[], None]) -> None:
    async def reload_loop() -> None:
        while True:
            await asyncio.sleep(RELOAD_INTERVAL_SECONDS)
            reload()

    reloader = asyncio.create_task(reload_loop())
    try:
        await server.serve(sockets=[sock])
    finally:
        reloader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reloader


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--app", choices=["webhook", "floor"], required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--cert-dir", type=Path, required=True)
    parser.add_argument("--cpu", type=int, default=None, help="pin this process to one core")
    parser.add_argument("--reuse-port", action="store_true")
    parser.add_argument(
        "--log-level",
        choices=["debug", "info", "off"],
        default="info",
        help="the webhook's logging as `coschedule serve --log-format json` sets it up, "
        "to stderr; off: logging disabled (the logging-cost comparison)",
    )
    args = parser.parse_args(argv)
    if args.log_level == "off":
        logging.disable(logging.CRITICAL)
    else:
        logs.setup(args.log_level, "json")
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    if args.app == "webhook":
        app, context, reload = webhook_app(args.cert_dir)
        heap.settle()  # as serve() does before it serves
    else:
        app, context, reload = floor_app, floor_context(args.cert_dir), lambda: None
    sock = listen_socket(args.host, args.port, args.reuse_port)
    server = uvicorn.Server(https_config(app, context, args.host, args.port))
    import uvloop  # the loop `coschedule serve` runs on

    uvloop.run(_serve(server, sock, reload))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
