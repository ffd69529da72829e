"""``coschedule reconcile`` wired whole: two replicas hand over; the CLI process stops cleanly."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
from collections.abc import Callable
from pathlib import Path

import httpx

from coschedule.config.store import SettingsStore
from coschedule.kube.client import Credentials
from coschedule.reconcile.main import serve_reconciler
from coschedule.reconcile.reconciler_metrics import ReconcileMetrics
from tests.conftest import reconciler_command, write_kubeconfig
from tests.reconcile.apiserver import MiniApi
from tests.reconcile.conftest import eventually
from tests.reconcile.pods import marked_pod, placeholder_of
from tests.reconcile.test_controller import seed_cluster
from tests.test_listen import HAS_IPV6

ROOT = Path(__file__).resolve().parents[2]
LEASE = ("leases", "coschedule-system", "coschedule-reconciler")


def holder(api: MiniApi) -> str:
    lease = api.get(*LEASE)
    return str(lease["spec"]["holderIdentity"]) if lease else ""


async def test_two_replicas_one_acts_and_the_other_takes_over_on_shutdown(
    api: MiniApi, unused_tcp_port_factory: Callable[[], int]
) -> None:
    seed_cluster(api)
    store = SettingsStore(None, {"COSCHEDULE_COSCHEDULE": "pipelineruns"})
    replicas = []
    for _ in range(2):
        args = argparse.Namespace(
            health_port=unused_tcp_port_factory(),
            leader_elect=True,
            namespace="coschedule-system",
        )
        stop = asyncio.Event()
        metrics = ReconcileMetrics()
        task = asyncio.create_task(
            serve_reconciler(args, Credentials(server=api.url), store, metrics, stop)
        )
        replicas.append((stop, metrics, task))
        await eventually(lambda: holder(api) != "")

    def leading(metrics: ReconcileMetrics) -> bool:
        return metrics.registry.get_sample_value("coschedule_reconciler_leader") == 1

    await eventually(lambda: any(leading(m) for _, m, _ in replicas))
    [leader] = [r for r in replicas if leading(r[1])]
    [follower] = [r for r in replicas if r is not leader]
    first = marked_pod("tekton-taskrun")
    api.put("pods", first)
    await eventually(lambda: api.get("statefulsets", "ci", placeholder_of(first)) is not None)
    placeholders = {"controller": "placeholder"}
    reconciles = "coschedule_reconcile_total"
    assert (leader[1].registry.get_sample_value(reconciles, placeholders) or 0) > 0
    assert not follower[1].registry.get_sample_value(reconciles, placeholders)

    leader[0].set()  # SIGTERM: stop acting, release the Lease
    await asyncio.wait_for(leader[2], 5)
    # The 15 s lease was released: the follower acts within a couple of retry periods.
    took = await eventually(lambda: leading(follower[1]))
    assert took < 7.5, f"took {took:.1f} s: the lease was waited out, not released"
    second = marked_pod("argo-workflow-pod")
    [owner] = second["metadata"]["ownerReferences"]
    workflow = {"metadata": {"name": owner["name"], "namespace": "ci", "uid": owner["uid"]}}
    api.put("workflows", {**workflow, "status": {"phase": "Running"}})  # its run runs
    api.put("pods", second)
    await eventually(lambda: api.get("statefulsets", "ci", placeholder_of(second)) is not None)
    follower[0].set()
    await asyncio.wait_for(follower[2], 5)


async def test_cli_process_serves_probes_and_releases_the_lease_on_sigterm(
    api: MiniApi, tmp_path: Path, unused_tcp_port: int
) -> None:
    seed_cluster(api)
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url, "coschedule-system")
    (tmp_path / "config").mkdir()
    argv, env = reconciler_command(kubeconfig, tmp_path / "config", unused_tcp_port)
    process = await asyncio.create_subprocess_exec(
        *argv,
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{unused_tcp_port}") as http:

            async def ready() -> bool:
                try:
                    return (await http.get("/readyz")).status_code == 200
                except httpx.TransportError:
                    return False

            for _ in range(400):
                if await ready():
                    break
                await asyncio.sleep(0.025)
            assert await ready()
            metrics = (await http.get("/metrics")).text
            assert "coschedule_watch_relists_total" in metrics
        if HAS_IPV6:  # the health port listens on IPv6 too (tests/test_listen.py)
            async with httpx.AsyncClient() as http6:
                livez = await http6.get(f"http://[::1]:{unused_tcp_port}/livez")
                assert livez.status_code == 200
        await eventually(lambda: holder(api) != "")
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 5) == 0
        assert holder(api) == ""  # released for a fast handover
        assert process.stderr is not None
        stderr = (await process.stderr.read()).decode()
        assert '"msg":"released the Lease"' in stderr
        # Its caches, once synced, frozen out of the cyclic collector's walks (coschedule.heap),
        # as the webhook's: said once, with how many objects.
        entries = [json.loads(line) for line in stderr.splitlines()]
        [frozen] = [e for e in entries if e["msg"] == "caches synced: heap frozen"]
        assert frozen["logger"] == "coschedule.reconcile"
        assert frozen["frozen_objects"] > 10_000
        # Its API requests (watches, the Lease) are not logged one line each at info.
        loggers = [entry["logger"] for entry in entries]
        assert not [name for name in loggers if name.startswith(("httpx", "httpcore"))], stderr
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
