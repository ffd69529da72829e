"""``coschedule serve``: the webhook's process, wired: logging, metrics, the settings store,
the serving certificate, the cluster's caches, then both listeners in one event loop."""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from coschedule import certs, heap, logs
from coschedule.config.store import open_store_or_exit
from coschedule.listen import ListenError
from coschedule.server.cluster import ClusterLink, ClusterUnavailable
from coschedule.server.serve import ServeOptions, bind_listeners, build_webhook, log, serve
from coschedule.server.tls import CertificateUnusable
from coschedule.server.webhook_metrics import WebhookMetrics

EXIT_OK = 0
EXIT_LISTEN = 1  # as uvicorn's own exit when a port cannot be bound
EXIT_USAGE = 2


def run_webhook(args: argparse.Namespace) -> int:
    if (refusal := _listen_problem(args.host, args.port, args.health_port)) is not None:
        print(f"coschedule serve: {refusal}", file=sys.stderr)
        return EXIT_USAGE
    logs.setup(args.log_level, args.log_format)
    metrics = WebhookMetrics()
    store = open_store_or_exit("serve", args.config_dir, os.environ, metrics)
    cert_dir = Path(args.cert_dir) if args.cert_dir else Path("certs")
    try:
        refusal = _cert_dir_problem(cert_dir, made=args.cert_dir is None)
    except OSError as exc:
        # An unreadable --cert-dir, or certs/ in a folder we may not write (a read-only
        # root filesystem): say which folder and what to do, not a traceback.
        what = "--cert-dir" if args.cert_dir is not None else "the default certificate folder"
        why = (exc.strerror or str(exc)).lower()
        refusal = (
            f"{what} {cert_dir}: {why}; give --cert-dir a folder with "
            f"{certs.CERT_FILE} and {certs.KEY_FILE} this process can read"
            + ("" if args.cert_dir is not None else " (or run where certs/ can be made)")
        )
    if refusal is not None:
        print(f"coschedule serve: {refusal}", file=sys.stderr)
        return EXIT_USAGE

    try:
        link = ClusterLink.connect(args.kubeconfig, os.environ, offline=args.no_cluster)
    except ClusterUnavailable as exc:
        print(f"coschedule serve: {exc}", file=sys.stderr)
        return EXIT_USAGE
    store.adjust = link.adjust_settings
    store.current = link.adjust_settings(store.current)
    try:
        webhook = build_webhook(
            store,
            metrics,
            cert_dir,
            link.namespaces,
            link.claims,
            link.volumes,
            link.controls,
            link.placeholders,
            pod_caches=link.pod_caches(),
            run_caches=link.run_caches(),
        )
    except CertificateUnusable as exc:
        print(f"coschedule serve: {exc}", file=sys.stderr)
        return EXIT_USAGE
    link.add_probes(webhook.probes, metrics.cache_stale)
    try:
        sockets = bind_listeners(args.host, args.port, args.health_port)
    except ListenError as exc:
        print(f"coschedule serve: {exc}", file=sys.stderr)
        return EXIT_LISTEN
    serve_options = ServeOptions(
        host=args.host,
        port=args.port,
        health_port=args.health_port,
        cert_dir=cert_dir,
        shutdown_delay=args.shutdown_delay.total_seconds(),
        sockets=sockets,
    )

    async def main() -> None:
        async with link.running():
            # The caches' first lists are most of a large cluster's heap: frozen once read.
            settler = (
                asyncio.create_task(heap.settle_when(link.wait_synced(), log))
                if link.online
                else None
            )
            try:
                await serve(webhook, serve_options)
            finally:
                if settler is not None:
                    settler.cancel()

    _run(main())
    return EXIT_OK


def _cert_dir_problem(cert_dir: Path, *, made: bool) -> str | None:
    """Why the certificate folder cannot be served from (None: it can); with ``made``
    (no --cert-dir), a self-signed certificate is made there when it has none. Raises
    OSError for a folder that cannot be read or written."""
    if made:
        if certs.ensure_self_signed(cert_dir):
            print(
                f"coschedule serve: made a self-signed certificate in {cert_dir}/ "
                f"(CA: {cert_dir / certs.CA_FILE})",
                file=sys.stderr,
            )
        return None
    if cert_dir.exists() and not cert_dir.is_dir():
        return (
            f"--cert-dir {cert_dir} is a file, not a folder (one with "
            f"{certs.CERT_FILE} and {certs.KEY_FILE}, as a mounted TLS Secret)"
        )
    if not (cert_dir / certs.CERT_FILE).exists() or not (cert_dir / certs.KEY_FILE).exists():
        return (
            f"{cert_dir} has no {certs.CERT_FILE} and {certs.KEY_FILE}; "
            f"make them with: coschedule certs --dns-name NAME --out {cert_dir}"
        )
    return None


def _listen_problem(host: str, port: int, health_port: int) -> str | None:
    """What stops both listeners from opening, said before anything starts."""
    if port == health_port:
        return f"--port and --health-port are both {port}; give them different ports"
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        return f"--host {host[:100]}: not an address to listen on ({exc})"
    return None


def _run(coro: Coroutine[Any, Any, None]) -> None:
    try:
        import uvloop

        uvloop.run(coro)
    except ImportError:
        asyncio.run(coro)
