"""``coschedule reconcile``: caches, leader election, workers and the health port, wired."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Iterator

import uvicorn

from coschedule import certs, heap
from coschedule.config.store import SettingsStore, open_store_or_exit, reload_loop
from coschedule.kube.client import Credentials, KubeClient, KubeConfigError, require
from coschedule.kube.leader import ElectionConfig, LeaderElector
from coschedule.listen import EVERY_ADDRESS, ListenError, listen_socket
from coschedule.probes import Probes, probes_app
from coschedule.reconcile.cert_plan import RotationPolicy
from coschedule.reconcile.certificates import CertificateController, CertificateTargets
from coschedule.reconcile.concurrency import ConcurrencyController
from coschedule.reconcile.controller import Controller
from coschedule.reconcile.manager import Manager
from coschedule.reconcile.reconciler_metrics import ReconcileMetrics
from coschedule.reconcile.unmarked_controller import UnmarkedController

log = logging.getLogger("coschedule.reconcile")

RELOAD_INTERVAL_SECONDS = 2.0
EXIT_USAGE = 2


class _Server(uvicorn.Server):
    """Signals are ours: stopping releases the Lease before the process ends."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def run_reconciler(args: argparse.Namespace) -> int:
    from coschedule import logs

    logs.setup(args.log_level, args.log_format)
    metrics = ReconcileMetrics()
    store = open_store_or_exit("reconcile", args.config_dir, os.environ, metrics)
    try:
        creds = require(args.kubeconfig, os.environ, "the reconciler")
        keeping = certificate_keeping(args, args.namespace or creds.namespace)
    except (KubeConfigError, ValueError) as exc:
        print(f"coschedule reconcile: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        asyncio.run(
            serve_reconciler(args, creds, store, metrics, keeping=keeping, freeze_heap=True)
        )
    except ListenError as exc:
        print(f"coschedule reconcile: {exc}", file=sys.stderr)
        return 1
    return 0


def certificate_keeping(
    args: argparse.Namespace, namespace: str
) -> tuple[CertificateTargets, RotationPolicy] | None:
    """What ``--cert-*`` asks the leader to keep (None: off); ValueError saying what is wrong."""
    if not getattr(args, "cert_secret", None):
        return None
    names = list(args.cert_dns_name or [])
    if args.cert_service:
        names += certs.service_dns_names(args.cert_service, namespace)
    if not names:
        raise ValueError("--cert-secret needs --cert-service or --cert-dns-name")
    if not args.cert_webhook_config:
        raise ValueError("--cert-secret needs --cert-webhook-config (whose caBundle to keep)")
    certs.check_names(names)
    policy = RotationPolicy(
        names=tuple(names),
        validity=args.cert_validity,
        renew_before=args.cert_renew_before,
        ca_validity=args.ca_validity,
        ca_renew_before=args.ca_renew_before,
    )
    problem = policy.problem()
    if problem is not None:
        raise ValueError(f"--cert-*/--ca-*: {problem}")
    targets = CertificateTargets(
        namespace=namespace,
        secret=args.cert_secret,
        ca_secret=args.cert_ca_secret,
        webhook_configs=tuple(args.cert_webhook_config),
    )
    return targets, policy


async def serve_reconciler(
    args: argparse.Namespace,
    creds: Credentials,
    store: SettingsStore,
    metrics: ReconcileMetrics,
    stopping: asyncio.Event | None = None,
    *,
    keeping: tuple[CertificateTargets, RotationPolicy] | None = None,
    freeze_heap: bool = False,
) -> None:
    """The reconciler until ``stopping`` (SIGTERM in its own process). With ``freeze_heap``
    (the process's own run, not a test's), what the caches hold once first listed is frozen
    (``coschedule.heap``): the reconciles that follow stall on no full collection of it."""
    # Probes reach the pod on its IPv6 or IPv4 address: listen on both (coschedule.listen);
    # bound first, so a port in use stops the process before anything else starts.
    health_socket = listen_socket(EVERY_ADDRESS, args.health_port)
    client = KubeClient(creds, user_agent="coschedule-reconciler")
    manager = Manager(metrics, store)
    manager.add(Controller(client, lambda: store.current, metrics, leading=manager.is_leading))
    manager.add(
        UnmarkedController(client, lambda: store.current, metrics, leading=manager.is_leading)
    )
    manager.add(ConcurrencyController(client, metrics, leading=manager.is_leading))
    if keeping is not None:
        targets, policy = keeping
        manager.add(
            CertificateController(
                client, targets, policy, metrics.registry, leading=manager.is_leading
            )
        )
    probes = Probes()
    probes.checks.update(manager.checks())
    health = _Server(
        uvicorn.Config(
            probes_app(probes, metrics.registry),
            host=EVERY_ADDRESS,
            port=args.health_port,
            log_config=None,
            access_log=False,
            server_header=False,
            lifespan="off",
        )
    )

    elector: LeaderElector | None = None
    # The Lease on a client of its own: a burst of the workers' calls (releases) must not
    # keep a renewal waiting for a pooled connection past its deadline (leadership lost).
    lease_client = KubeClient(
        creds, user_agent="coschedule-reconciler", reachability=client.reachability
    )
    if args.leader_elect:
        elector = LeaderElector(
            lease_client,
            ElectionConfig(namespace=args.namespace or creds.namespace),
            on_started=manager.start_leading,
            on_stopped=manager.stop_leading,
        )
    if stopping is None:  # the process's own run: SIGTERM stops it (and releases the Lease)
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stopping.set)

    manager.start_informers()
    # The caches' first lists are most of a large cluster's heap: frozen once read.
    settler = (
        asyncio.create_task(heap.settle_when(manager.wait_synced(), log)) if freeze_heap else None
    )
    tasks = [
        asyncio.create_task(health.serve(sockets=[health_socket])),
        asyncio.create_task(reload_loop(RELOAD_INTERVAL_SECONDS, manager.reload, "config reload")),
    ]
    if elector is not None:
        tasks.append(asyncio.create_task(elector.run()))
    else:
        manager.start_leading()
    log.info(
        "reconciler started",
        extra={
            "health_port": args.health_port,
            "leader_elect": bool(args.leader_elect),
            "certificate": f"{keeping[0].namespace}/{keeping[0].secret}" if keeping else "off",
        },
    )
    try:
        await stopping.wait()
    finally:
        log.info("shutting down")
        if settler is not None:
            settler.cancel()
        manager.stop_leading()
        if elector is not None:
            tasks[-1].cancel()  # no renewal in flight while we release
            await asyncio.gather(tasks[-1], return_exceptions=True)
            await elector.release()
        health.should_exit = True
        for task in tasks[1:]:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await manager.stop()
        await client.aclose()
        await lease_client.aclose()
        health_socket.close()
