"""``coschedule serve``: HTTPS on 8443 and plain HTTP probes on 8080, in one event loop,
with the config folder and the certificate files watched for changes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from coschedule import heap
from coschedule.config.store import SettingsStore, reload_loop
from coschedule.listen import EVERY_ADDRESS, ListenError, describe, listen_socket
from coschedule.mutate.decision import VolumeView
from coschedule.probes import Probes, probes_app
from coschedule.server.admission import NamespaceLookup
from coschedule.server.cache_gate import CacheGate
from coschedule.server.drain import Drain
from coschedule.server.https_app import HttpsApp
from coschedule.server.pod_endpoint import ClaimCacheView, PlaceholderCacheView, PodEndpoint
from coschedule.server.run_endpoint import ControlLookup, RunEndpoint
from coschedule.server.tls import ServingCertificate
from coschedule.server.webhook_metrics import WebhookMetrics
from coschedule.server.young_runs import YoungRuns

log = logging.getLogger("coschedule.serve")

RELOAD_INTERVAL_SECONDS = 2.0  # the design allows 10 s for a reload to take effect


Listener = tuple[socket.socket, ...]  # the sockets one listener serves


@dataclass(frozen=True, slots=True)
class ServeOptions:
    host: str = EVERY_ADDRESS  # IPv6 and IPv4 (coschedule.listen)
    port: int = 8443
    health_port: int = 8080
    cert_dir: Path = Path("certs")
    reload_interval: float = RELOAD_INTERVAL_SECONDS
    # On SIGTERM, serve this long more, not ready, before stopping (coschedule.server.drain).
    shutdown_delay: float = 0.0
    # Both listeners' sockets, bound by ``bind_listeners`` before the event loop (else here).
    sockets: tuple[Listener, Listener] | None = None


def bind_listeners(host: str, port: int, health_port: int) -> tuple[Listener, Listener]:
    """The HTTPS and the probe listeners, bound now: a port in use is said before anything
    starts, not by uvicorn after "serving" was logged (ListenError names the flag)."""
    first = _bind(host, port, "--port")
    try:
        return first, _bind(host, health_port, "--health-port")
    except ListenError:
        for sock in first:
            sock.close()
        raise


def _bind(host: str, port: int, flag: str) -> Listener:
    try:
        return (listen_socket(host, port),)
    except ListenError as exc:
        raise ListenError(f"{flag} {port}: {exc}") from None


class _Server(uvicorn.Server):
    """Signals are handled once for both listeners, by ``serve``."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if sockets is not None and self.started:
            # uvicorn says where it listens only for the sockets it bound itself; ours were
            # bound beforehand (bind_listeners): the same line, once per listener.
            self._log_started_message(sockets)


@dataclass(slots=True)
class Webhook:
    """The wired parts of a serving process, built before any socket opens."""

    settings: SettingsStore
    metrics: WebhookMetrics
    certificate: ServingCertificate
    probes: Probes
    pods: PodEndpoint
    runs: RunEndpoint
    drain: Drain

    def reload_once(self) -> None:
        self.settings.maybe_reload()
        self.certificate.maybe_reload()
        self.certificate.warning()  # logs once when the certificate nears its expiry


def build_webhook(
    settings: SettingsStore,
    metrics: WebhookMetrics,
    cert_dir: Path,
    namespaces: NamespaceLookup | None = None,
    claims: ClaimCacheView | None = None,
    volumes: VolumeView | None = None,
    controls: ControlLookup | None = None,
    placeholders: PlaceholderCacheView | None = None,
    *,
    pod_caches: CacheGate | None = None,
    run_caches: CacheGate | None = None,
) -> Webhook:
    certificate = ServingCertificate(cert_dir, metrics)
    certificate.load()
    probes = Probes()

    def cert_check() -> tuple[bool, str | None]:
        # Near expiry the pod stays ready (the certificate still works), and says so.
        details = [d for d in (certificate.state.error, certificate.warning()) if d]
        return certificate.state.loaded, "; ".join(details) or None

    def config_check() -> tuple[bool, str | None]:
        # Loaded at start or the process would not be here; a refused reload is detail only.
        return True, settings.detail()

    drain = Drain()
    probes.checks["certificate"] = cert_check
    probes.checks["config"] = config_check
    probes.checks["shutdown"] = drain.readiness
    # The runs admitted a moment ago: a run's first pod may come before its placeholder.
    young = YoungRuns()
    pods = PodEndpoint(
        settings,
        metrics,
        namespaces,
        claims,
        volumes,
        placeholders,
        pod_caches,
        placeholders,
        young,
    )
    runs = RunEndpoint(metrics, controls, namespaces, run_caches, young, settings)
    return Webhook(settings, metrics, certificate, probes, pods, runs, drain)


async def serve(webhook: Webhook, options: ServeOptions) -> None:
    https_config = uvicorn.Config(
        HttpsApp(webhook.pods, probes_app(webhook.probes, None), webhook.runs, webhook.drain),
        host=options.host,
        port=options.port,
        ssl_context_factory=lambda _config, _default: webhook.certificate.context,
        log_config=None,
        access_log=False,
        server_header=False,
        lifespan="off",
        interface="asgi3",  # HttpsApp returns its endpoint's coroutine: not guessable
        timeout_keep_alive=30,  # kube-apiserver keeps connections to webhooks open
        # kube-apiserver calls the webhook directly: no proxy's X-Forwarded-* to trust, and
        # uvicorn's middleware for them would run on every admission.
        proxy_headers=False,
    )
    health_config = uvicorn.Config(
        probes_app(webhook.probes, webhook.metrics.registry),
        host=options.host,
        port=options.health_port,
        log_config=None,
        access_log=False,
        server_header=False,
        lifespan="off",
        proxy_headers=False,  # the kubelet and Prometheus call it directly
    )
    servers = [_Server(https_config), _Server(health_config)]
    sockets = options.sockets or bind_listeners(options.host, options.port, options.health_port)

    loop = asyncio.get_running_loop()

    def stop() -> None:
        log.info("shutting down")
        for server in servers:
            server.should_exit = True

    drain = webhook.drain
    drain.delay = options.shutdown_delay

    def on_signal(sig: signal.Signals) -> None:
        # SIGTERM (the kubelet) drains first; SIGINT (Ctrl-C) or a second SIGTERM stops now.
        if sig is signal.SIGTERM and drain.begin():
            log.info("draining", extra={"seconds": drain.delay})
            loop.call_later(drain.delay, stop)
        else:
            stop()

    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, on_signal, sig)

    reloader = asyncio.create_task(
        reload_loop(options.reload_interval, webhook.reload_once, "reload")
    )
    # Everything built so far lives as long as the process: no collection walks it again.
    frozen = heap.settle()
    log.info(
        "serving",
        extra={
            "frozen_objects": frozen,
            "https_port": options.port,
            "health_port": options.health_port,
            "listen": [describe(sock) for listener in sockets for sock in listener],
            "mode": webhook.settings.current.mode.value,
        },
    )
    try:
        await asyncio.gather(
            *(
                server.serve(sockets=list(listener))
                for server, listener in zip(servers, sockets, strict=True)
            )
        )
    finally:
        reloader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reloader
        for listener in sockets:
            for sock in listener:
                sock.close()
    log.info("stopped")
