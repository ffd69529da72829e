"""Whether the caches an admission endpoint decides from have been read once, and a bounded
wait for the ones that have not (on their own sync events: no API call).

``/readyz`` is 503 until the caches have synced, so a Service sends the webhook nothing
before; but the API server can call it earlier (a webhook registered by URL, a readiness
race, a restart behind ``--enable-aggregator-routing``). A decision made from a cache not
read yet is a wrong answer: a namespace's mode read as the cluster's, a claim as unknown, a
placeholder as unbound. So an endpoint first waits here, up to ``SYNC_WAIT_SECONDS`` (well
inside the API server's 5 s timeout), then decides; once every cache has synced it stops
asking (the endpoint keeps that as one bool: the hot path reads nothing more).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

SYNC_WAIT_SECONDS = 2.0  # well inside the API server's default (and our) 5 s timeout
RULE = "caches-not-synced"


class Syncing(Protocol):
    """A watch-fed cache: read once its first list is in."""

    @property
    def synced(self) -> bool: ...

    async def wait_synced(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Cache:
    """One cache as a gate reads it: its name (for the log and the refusal), whether it is
    read (``ready``), and its own wait until it is."""

    name: str
    ready: Callable[[], bool]
    wait: Callable[[], Awaitable[object]]

    @classmethod
    def of(cls, name: str, cache: Syncing) -> Cache:
        return cls(name, lambda: cache.synced, cache.wait_synced)


class CachesNotSynced(Exception):
    """A request that cannot be decided: its caches were still not read after the wait. The
    door answers HTTP 503, so the API server applies the webhook's failurePolicy."""


class CacheGate:
    def __init__(self, caches: Sequence[Cache]) -> None:
        self.caches = tuple(caches)

    def waiting(self) -> list[str]:
        """The names of the caches not read yet (empty: decide)."""
        return [cache.name for cache in self.caches if not cache.ready()]

    async def wait(self, seconds: float = SYNC_WAIT_SECONDS) -> bool:
        """Until every cache is read, or ``seconds``; whether they all are."""
        pending = [cache.wait() for cache in self.caches if not cache.ready()]
        if not pending:
            return True
        try:
            async with asyncio.timeout(seconds):
                await asyncio.gather(*pending)
        except TimeoutError:
            return False
        return True
