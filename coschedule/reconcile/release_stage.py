"""The gated pods' releases, sent apart from the passes that plan them, by rank.

A pass that waited on its own releases held its worker for a round trip: in a burst of
runs, with 4 workers, the fifth run's pass (and its first release) waited for the first
four runs' every release, and the last run's first pod for every other run's every pod.
Here a pass hands its releases over and ends; ``RELEASES_IN_FLIGHT`` runners send them,
each pod's place in its run first (every run's first pod before any run's second), then
in the order handed over. A release planned again before it was sent replaces the earlier
one (a newer pass saw newer facts: the placeholder may have moved). A failed one queues
its run again with backoff (``failed``, with the run's failed releases in a row: the pass
that handed it over succeeded, which resets the queue's own count for the key).

The runners run only while this replica leads (``runs``, started by the manager with the
workers and cancelled with them); what was waiting when the lead was lost is dropped: the
next leader plans again from its caches.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

from coschedule.reconcile.model import ReleasePod

# Release patches in flight at once: a run's gated pods are independent writes, and one
# after another they cost a round trip each (a burst of runs waited seconds); bounded below
# the client's connection pool (100), which other calls share.
RELEASES_IN_FLIGHT = 32

Send = Callable[[str, ReleasePod], Awaitable[None]]
# (run key, what failed, the run's failed releases in a row, this one included)
Failed = Callable[[str, Exception, int], None]


class ReleaseStage:
    def __init__(
        self,
        send: Send,
        failed: Failed,
        *,
        runners: int = RELEASES_IN_FLIGHT,
    ) -> None:
        if runners < 1:
            raise ValueError(f"at least one runner, not {runners}")
        self.send = send
        self.failed = failed
        self.runners = runners
        self._queue: asyncio.PriorityQueue[tuple[int, int, str, ReleasePod]] | None = None
        self._latest: dict[str, int] = {}  # pod key -> the number of its newest release
        self._failures: dict[str, int] = {}  # run key -> its failed releases in a row
        self._numbers = itertools.count()

    def submit(self, key: str, releases: Sequence[ReleasePod]) -> None:
        """Queue a pass's releases (the run's key, its pods in the order planned)."""
        queue = self._ready()
        for rank, release in enumerate(releases):
            number = next(self._numbers)
            self._latest[f"{release.namespace}/{release.name}"] = number
            queue.put_nowait((rank, number, key, release))

    @property
    def waiting(self) -> int:
        """Releases handed over and not yet sent (nor dropped)."""
        return len(self._latest)

    def runs(self) -> list[Coroutine[Any, Any, None]]:
        """The runners, on taking the lead: what an earlier lead left waiting is dropped."""
        self._queue = asyncio.PriorityQueue()
        self._latest.clear()
        self._failures.clear()
        return [self._runner(self._queue) for _ in range(self.runners)]

    def forget(self, key: str) -> None:
        """A run gone: its failures are not kept."""
        self._failures.pop(key, None)

    async def idle(self) -> None:
        """Until everything handed over has been sent or dropped."""
        await self._ready().join()

    def _ready(self) -> asyncio.PriorityQueue[tuple[int, int, str, ReleasePod]]:
        if self._queue is None:  # made on the running loop
            self._queue = asyncio.PriorityQueue()
        return self._queue

    async def _runner(self, queue: asyncio.PriorityQueue[tuple[int, int, str, ReleasePod]]) -> None:
        while True:
            _, number, key, release = await queue.get()
            pod_key = f"{release.namespace}/{release.name}"
            try:
                if self._latest.get(pod_key) != number:
                    continue  # planned again since: the newer one is queued
                try:
                    await self.send(key, release)
                except Exception as exc:  # the run is looked at again, with backoff
                    failures = self._failures[key] = self._failures.get(key, 0) + 1
                    self.failed(key, exc, failures)
                else:
                    self._failures.pop(key, None)
                finally:
                    if self._latest.get(pod_key) == number:
                        del self._latest[pod_key]
            finally:
                queue.task_done()
