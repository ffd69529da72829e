"""Leader election on a coordination.k8s.io/v1 Lease (client-go's leaderelection, small).

One replica holds the Lease and acts; the others keep their caches warm and wait. The
Lease is written with PUT carrying the resourceVersion read just before, so two replicas
racing for it cannot both win (the loser gets 409 and tries again later). Expiry is judged
on the local clock from when this replica last saw the record change, as client-go does,
so clock skew between nodes does not matter.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from coschedule.k8s.timefmt import micro_time
from coschedule.kube.client import ApiError, KubeClient, object_path
from coschedule.kube.reachability import is_unreachable

log = logging.getLogger("coschedule.leader")

LEASE_DURATION = 15.0
RENEW_DEADLINE = 10.0
RETRY_PERIOD = 2.0


def default_identity() -> str:
    return f"{os.environ.get('HOSTNAME') or socket.gethostname()}_{secrets.token_hex(4)}"


@dataclass(frozen=True, slots=True)
class ElectionConfig:
    namespace: str
    name: str = "coschedule-reconciler"
    identity: str = ""
    lease_duration: float = LEASE_DURATION
    renew_deadline: float = RENEW_DEADLINE
    retry_period: float = RETRY_PERIOD


class LeaderElector:
    def __init__(
        self,
        client: KubeClient,
        config: ElectionConfig,
        *,
        on_started: Callable[[], None] | None = None,
        on_stopped: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.config = config
        self.identity = config.identity or default_identity()
        self.on_started = on_started
        self.on_stopped = on_stopped
        self.clock = clock
        self.path = object_path("coordination.k8s.io/v1", "leases", config.namespace)
        self.leading = False
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._last_renew = 0.0
        self._released = False
        self._written: dict[str, Any] | None = None  # the Lease as this replica last wrote it

    @property
    def lease_path(self) -> str:
        return f"{self.path}/{self.config.name}"

    async def run(self) -> None:
        """Forever: acquire, then renew every retry period until a renewal fails for the
        whole renew deadline or someone else holds the Lease; then go back to acquiring."""
        try:
            while not self._released:
                acquire_bound = self.config.renew_deadline / 2
                while not await self._try_acquire_or_renew(acquire_bound):  # noqa: ASYNC110 (polls the API)
                    await asyncio.sleep(self.config.retry_period)
                if self._released:
                    break
                self._become_leader()
                while self.leading:
                    await asyncio.sleep(self.config.retry_period)
                    if self._released:
                        break
                    if await self._renew():
                        continue
                    if self.leading:  # else another holder was seen: already stepped down
                        self._step_down("could not renew the Lease within the renew deadline")
        finally:
            if self.leading:
                self._step_down("elector stopped")

    async def _renew(self) -> bool:
        """client-go's renew: try, and again every retry period, until one succeeds or the
        renew deadline (from the start of the last renewal that succeeded) has passed, each
        try bounded by what is left of it. A slow API server costs a try, not the Lease:
        two tries in a row each cut at a fixed half deadline (a GET and a PUT each) lost it
        under load, with time left. And no try outlives the deadline, so the leader stops
        acting by then, before the Lease it last wrote can expire for the others."""
        while True:
            left = self._last_renew + self.config.renew_deadline - self.clock()
            if left <= 0 or self._released:
                return False
            if await self._try_acquire_or_renew(left):
                return True
            if not self.leading:
                return False
            left = self._last_renew + self.config.renew_deadline - self.clock()
            if left <= 0:
                return False
            await asyncio.sleep(min(self.config.retry_period, left))

    def _become_leader(self) -> None:
        self.leading = True
        log.info("became leader", extra={"identity": self.identity, "lease": self.lease_path})
        if self.on_started is not None:
            self.on_started()

    def _step_down(self, why: str) -> None:
        # Stop acting first: the caller's callback cancels all work at once.
        self.leading = False
        log.warning("lost leadership", extra={"identity": self.identity, "why": why})
        if self.on_stopped is not None:
            self.on_stopped()

    def _spec(self, acquire_time: str, transitions: int) -> dict[str, Any]:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.config.lease_duration)),
            "acquireTime": acquire_time,
            "renewTime": micro_time(),
            "leaseTransitions": transitions,
        }

    async def _try_acquire_or_renew(self, bound: float) -> bool:
        # A hung call must not outlive the renew deadline: the leader would act on while
        # the others already see the Lease expire.
        try:
            async with asyncio.timeout(bound):
                return await self._attempt()
        except TimeoutError:
            if not self.client.reachability.waiting:  # else already said, once
                log.warning("lease call timed out", extra={"identity": self.identity})
            return False

    async def _attempt(self) -> bool:
        if self._released:
            return True  # leaves the acquire loop; run() then ends
        now = self.clock()
        try:
            if self.leading and self._written is not None:
                # client-go's fast path: the leader renews the Lease it last wrote, one PUT
                # (the GET first doubled a renewal's time on a slow API server); a Lease
                # changed since (409) or gone (404) is read as below.
                written = self._written
                body = {**written, "spec": {**written["spec"], "renewTime": micro_time()}}
                try:
                    self._written = await self.client.replace(self.lease_path, body)
                    self._last_renew = now
                    return True
                except ApiError as exc:
                    if exc.status not in (404, 409):
                        raise
                    self._written = None
            lease = await self.client.get(self.lease_path)
            if lease is None:
                body = {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {"name": self.config.name, "namespace": self.config.namespace},
                    "spec": self._spec(micro_time(), 0),
                }
                self._written = await self.client.create(self.path, body)
                self._last_renew = now
                return True
            spec = lease.get("spec") if isinstance(lease.get("spec"), dict) else {}
            assert isinstance(spec, dict)
            holder = str(spec.get("holderIdentity") or "")
            record = (holder, spec.get("renewTime"), spec.get("leaseDurationSeconds"))
            if record != self._observed:
                self._observed = record
                self._observed_at = now
            duration = float(spec.get("leaseDurationSeconds") or self.config.lease_duration)
            if holder and holder != self.identity:
                if self.leading:
                    self._step_down(f"the Lease is held by {holder}")
                if self._observed_at + duration > now:
                    return False
            transitions = int(spec.get("leaseTransitions") or 0)
            mine = holder == self.identity
            acquire_time = str(spec.get("acquireTime")) if mine else micro_time()
            meta = lease.get("metadata") if isinstance(lease.get("metadata"), dict) else {}
            assert isinstance(meta, dict)
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {
                    "name": self.config.name,
                    "namespace": self.config.namespace,
                    "resourceVersion": meta.get("resourceVersion"),
                },
                "spec": self._spec(acquire_time, transitions if mine else transitions + 1),
            }
            self._written = await self.client.replace(self.lease_path, body)
            self._last_renew = now
            return True
        except ApiError as exc:
            level = logging.INFO if exc.status == 409 else logging.WARNING
            log.log(level, "lease update failed", extra={"status": exc.status, "error": str(exc)})
            return False
        except Exception as exc:  # network trouble: try again next period
            if not is_unreachable(exc):  # the client's reachability says that, once
                log.warning("lease update failed", extra={"error": repr(exc)})
            return False

    async def release(self) -> None:
        """On clean shutdown: stop the elector, and hand the Lease over now rather than
        after it expires (an empty holder is free for the taking)."""
        self._released = True
        if self.leading:
            self._step_down("released")
        for _ in range(3):  # a renewal still in flight may win the race once: 409, retry
            try:
                lease = await self.client.get(self.lease_path)
                spec = (lease or {}).get("spec") or {}
                if lease is None or spec.get("holderIdentity") != self.identity:
                    return
                spec.update(holderIdentity="", leaseDurationSeconds=1, renewTime=micro_time())
                await self.client.replace(self.lease_path, lease)
                log.info("released the Lease", extra={"identity": self.identity})
                return
            except ApiError as exc:
                if exc.status != 409:
                    log.warning("could not release the Lease", extra={"error": str(exc)})
                    return
            except Exception as exc:
                log.warning("could not release the Lease", extra={"error": repr(exc)})
                return
