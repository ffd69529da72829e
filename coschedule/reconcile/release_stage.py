"""The gated pods' releases, sent apart from the passes that plan them, by rank.

A pass that waited on its own releases held its worker for a round trip: in a burst of
runs, with 4 workers, the fifth run's pass (and its first release) waited for the first
four runs' every release, and the last run's first pod for every other run's every pod.
Here a pass hands its releases over and ends; ``RELEASES_IN_FLIGHT`` runners send them,
each pod's place in its run first (every run's first pod before any run's second), then
in the order handed over. A release planned again from the same pod version onto the same
node keeps the one handed over (its place in line, or its send under way): a pass that runs
while the first release is on its way plans it again from a cache that does not show it yet.
Planned from a newer version or onto another node, it replaces the waiting one (a newer
pass saw newer facts: the placeholder may have moved), and is sent only once an earlier
send for the pod has ended: never two at once for one pod (the second would be refused).
A failed one queues its run again with backoff (``failed``, with the run's failed releases
in a row: the pass that handed it over succeeded, which resets the queue's own count for
the key).

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
# after another they cost a round trip each (a burst of runs waited seconds). Not more: a
# release is a pod write (about 10 ms of kube-apiserver's CPU), and 32 at once on a busy
# kube-apiserver delayed its watch events by up to 2 s, the scheduler's among them: the
# first pods' releases, sent first, reached kube-scheduler late (docs/benchmarks.md).
RELEASES_IN_FLIGHT = 8

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
        # pod key -> (number, release) of its newest release, until sent or dropped
        self._latest: dict[str, tuple[int, ReleasePod]] = {}
        self._sending: set[str] = set()  # pod keys whose release is on its way
        # pod key -> a newer release that came up while an earlier one was on its way
        self._after: dict[str, tuple[int, int, str, ReleasePod]] = {}
        self._failures: dict[str, int] = {}  # run key -> its failed releases in a row
        self._numbers = itertools.count()

    def submit(self, key: str, releases: Sequence[ReleasePod]) -> None:
        """Queue a pass's releases (the run's key, its pods in the order planned)."""
        queue = self._ready()
        for rank, release in enumerate(releases):
            pod_key = f"{release.namespace}/{release.name}"
            handed = self._latest.get(pod_key)
            if handed is not None and _same(handed[1], release):
                continue  # the same release, waiting or on its way: it keeps its place
            number = next(self._numbers)
            self._latest[pod_key] = (number, release)
            queue.put_nowait((rank, number, key, release))

    @property
    def waiting(self) -> int:
        """Releases handed over and not yet sent (nor dropped)."""
        return len(self._latest)

    def runs(self) -> list[Coroutine[Any, Any, None]]:
        """The runners, on taking the lead: what an earlier lead left waiting is dropped."""
        self._queue = asyncio.PriorityQueue()
        self._latest.clear()
        self._sending.clear()
        self._after.clear()
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
            entry = await queue.get()
            _, number, key, release = entry
            pod_key = f"{release.namespace}/{release.name}"
            try:
                if self._number(pod_key) != number:
                    continue  # replaced since: the newer one is queued
                if pod_key in self._sending:
                    self._after[pod_key] = entry  # queued again once that send has ended
                    continue
                self._sending.add(pod_key)
                try:
                    await self.send(key, release)
                except Exception as exc:  # the run is looked at again, with backoff
                    failures = self._failures[key] = self._failures.get(key, 0) + 1
                    self.failed(key, exc, failures)
                else:
                    self._failures.pop(key, None)
                finally:
                    self._sending.discard(pod_key)
                    if self._number(pod_key) == number:
                        del self._latest[pod_key]
                    after = self._after.pop(pod_key, None)
                    if after is not None and self._number(pod_key) == after[1]:
                        queue.put_nowait(after)
            finally:
                queue.task_done()

    def _number(self, pod_key: str) -> int | None:
        handed = self._latest.get(pod_key)
        return handed[0] if handed is not None else None


def _same(a: ReleasePod, b: ReleasePod) -> bool:
    """The same release: from the same pod version, onto the same node."""
    return a.resource_version == b.resource_version and a.node == b.node
