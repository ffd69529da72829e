"""What ``serve`` knows of the cluster: nothing (offline), or watch-fed caches.

Offline, every namespace counts as enabled (the MutatingWebhookConfiguration's
namespaceSelector chooses them in a cluster) and claims are never rewritten, since no
reconciler would build the StatefulSet that owns the new claims.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, replace

from prometheus_client import Gauge

from coschedule.config.settings import Settings
from coschedule.kube.claim_cache import ClaimCache
from coschedule.kube.client import Credentials, KubeClient, KubeConfigError, discover
from coschedule.kube.controls_cache import ControlCache
from coschedule.kube.informer import Informer, stale_detail
from coschedule.kube.namespace_cache import NamespaceCache
from coschedule.kube.placeholder_cache import PlaceholderCache
from coschedule.kube.volume_cache import VolumeCache
from coschedule.probes import Probes
from coschedule.server.cache_gate import Cache, CacheGate

log = logging.getLogger("coschedule.cluster")


class ClusterUnavailable(RuntimeError):
    """Credentials were given or found but cannot be used."""


@dataclass(slots=True)
class ClusterLink:
    client: KubeClient | None = None
    namespaces: NamespaceCache | None = None
    claims: ClaimCache | None = None
    volumes: VolumeCache | None = None
    controls: ControlCache | None = None
    placeholders: PlaceholderCache | None = None

    @classmethod
    def connect(
        cls, kubeconfig: str | None, environ: Mapping[str, str], *, offline: bool = False
    ) -> ClusterLink:
        if offline:
            return cls()
        try:
            creds: Credentials | None = discover(kubeconfig, environ)
        except KubeConfigError as exc:
            raise ClusterUnavailable(str(exc)) from None
        if creds is None:
            log.info("no cluster credentials found: serving on the cluster config alone")
            return cls()
        client = KubeClient(creds, user_agent="coschedule-webhook")
        informer = Informer(client, "/api/v1/namespaces", name="namespaces")
        claims = ClaimCache(client)
        return cls(
            client,
            NamespaceCache(informer),
            claims,
            VolumeCache(client),
            ControlCache(client),
            # The StatefulSets are watched once, by the claim cache; both read them.
            PlaceholderCache(client, claims.statefulsets),
        )

    @property
    def online(self) -> bool:
        return self.client is not None

    def adjust_settings(self, settings: Settings) -> Settings:
        """The settings as this process can serve them: no claim rewrite offline; with it
        on, the marked pods watched (from now on)."""
        if not self.online:
            return replace(settings, rewrite_claims=False)
        if settings.rewrite_claims and self.claims is not None:
            self.claims.watch_marked_pods()
        return settings

    def pod_caches(self) -> CacheGate | None:
        """What ``/mutate`` decides from: namespaces (the mode), claims, volumes and
        placeholders (None: offline, nothing to wait for)."""
        found = [
            Cache.of(name, cache)
            for name, cache in (
                ("namespaces", self.namespaces),
                ("claims", self.claims),
                ("volumes", self.volumes),
                ("placeholders", self.placeholders),
            )
            if cache is not None
        ]
        return CacheGate(found) if found else None

    def run_caches(self) -> CacheGate | None:
        """What ``/mutate-runs`` decides from: namespaces and the ConcurrencyControls (read
        once discovery says their CRD is not served: then there are none)."""
        found: list[Cache] = []
        namespaces, controls = self.namespaces, self.controls
        if namespaces is not None:
            found.append(Cache.of("namespaces", namespaces))
        if controls is not None:
            found.append(
                Cache(
                    "concurrencycontrols",
                    lambda: controls.synced or controls.absent,
                    controls.wait_synced,
                )
            )
        return CacheGate(found) if found else None

    def informers(self) -> list[Informer]:
        found: list[Informer] = []
        if self.namespaces is not None:
            found.append(self.namespaces.informer)
        if self.claims is not None:
            found += [self.claims.claims, self.claims.statefulsets]
            if self.claims.marked_pods_watched:
                found.append(self.claims.pods)
        if self.volumes is not None:
            found.append(self.volumes.informer)
        if self.placeholders is not None:
            found.append(self.placeholders.informer)
        if self.controls is not None:
            found.append(self.controls.informer)
        return found

    async def wait_synced(self) -> None:
        """Until every cache has made its first list (an absent ConcurrencyControl CRD
        counts as read)."""
        for informer in self.informers():
            if self.controls is None or informer is not self.controls.informer:
                await informer.synced.wait()
        if self.controls is not None:
            await self.controls.wait_synced()

    def add_probes(self, probes: Probes, stale_gauge: Gauge | None = None) -> None:
        cache, client = self.namespaces, self.client
        if cache is None or client is None:
            return
        informers = self.informers()
        if stale_gauge is not None:
            for informer in informers:
                stale_gauge.labels(informer.name).set_function(informer.silent_for)

        def fresh() -> tuple[bool, str | None]:
            # Stale caches are said, not acted on: the webhook stays ready. Taking every
            # replica out of its Service because the API server restarted would stop all
            # admissions (failurePolicy Fail) or let pods pass unmarked (Ignore); answers
            # from caches a few seconds old are better than either.
            return True, stale_detail(self.informers(), client)  # a watch started since

        probes.checks["cache-freshness"] = fresh

        def not_synced(what: str) -> str:
            waiting = client.reachability.waiting_detail()
            return f"{what} not synced yet" + (f"; {waiting}" if waiting else "")

        def namespaces_synced() -> tuple[bool, str | None]:
            synced = cache.synced
            return synced, None if synced else not_synced("namespace cache")

        probes.checks["namespace-cache"] = namespaces_synced
        claims = self.claims
        if claims is not None:

            def claims_synced() -> tuple[bool, str | None]:
                synced = claims.ready
                return synced, None if synced else not_synced("claim cache")

            probes.checks["claim-cache"] = claims_synced
        volumes = self.volumes
        if volumes is not None:

            def volumes_synced() -> tuple[bool, str | None]:
                synced = volumes.synced
                return synced, None if synced else not_synced("volume cache")

            probes.checks["volume-cache"] = volumes_synced
        placeholders = self.placeholders
        if placeholders is not None:

            def placeholders_synced() -> tuple[bool, str | None]:
                synced = placeholders.synced
                return synced, None if synced else not_synced("placeholder cache")

            probes.checks["placeholder-cache"] = placeholders_synced
        if self.controls is not None:
            probes.checks["concurrency-controls"] = self.controls.readiness

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        tasks: list[asyncio.Task[None]] = []
        if self.namespaces is not None:
            tasks.append(asyncio.create_task(self.namespaces.informer.run()))
        if self.claims is not None:
            tasks.append(asyncio.create_task(self.claims.run()))
        if self.volumes is not None:
            tasks.append(asyncio.create_task(self.volumes.informer.run()))
        if self.placeholders is not None:
            tasks.append(asyncio.create_task(self.placeholders.informer.run()))
        if self.controls is not None:
            tasks.append(asyncio.create_task(self.controls.run()))
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            if self.client is not None:
                await self.client.aclose()
