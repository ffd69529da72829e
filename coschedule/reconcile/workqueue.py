"""A keyed, de-duplicating work queue with delayed adds and per-key retry backoff.

client-go's semantics: a key is queued at most once; a key being processed that is added
again is processed once more after the current pass (never twice at the same time);
``retry`` re-adds after an exponential per-key delay that ``forget`` resets. An urgent add
puts the key at the front (a run's placeholder to make, a run's pods to release: what a
burst of runs waits on) instead of behind every other key; ``add_soon`` waits a moment so
that a burst of one key's events makes one pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import deque
from collections.abc import Iterable

RETRY_BASE_SECONDS = 0.05
RETRY_MAX_SECONDS = 60.0


class WorkQueue:
    def __init__(
        self, *, retry_base: float = RETRY_BASE_SECONDS, retry_max: float = RETRY_MAX_SECONDS
    ) -> None:
        self._queue: deque[str] = deque()
        self._queued: set[str] = set()
        self._processing: set[str] = set()
        self._dirty: set[str] = set()  # added while processing: run again afterwards
        self._urgent_dirty: set[str] = set()  # of those, added urgently
        self._failures: dict[str, int] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._ready = asyncio.Event()
        self.retry_base = retry_base
        self.retry_max = retry_max

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def busy(self) -> bool:
        """Keys waiting or being processed (timers not counted)."""
        return bool(self._queue or self._processing)

    def add(self, key: str, *, urgent: bool = False) -> None:
        if key in self._processing:
            self._dirty.add(key)
            if urgent:
                self._urgent_dirty.add(key)
            return
        if key in self._queued:
            if urgent and self._queue[0] != key:
                self._queue.remove(key)
                self._queue.appendleft(key)
            return
        self._queued.add(key)
        if urgent:
            self._queue.appendleft(key)
        else:
            self._queue.append(key)
        self._ready.set()

    def add_after(self, key: str, delay: float) -> None:
        """Add later; an earlier pending timer for the key wins (the sooner look)."""
        if delay <= 0:
            self.add(key)
            return
        loop = asyncio.get_running_loop()
        when = loop.time() + delay
        timer = self._timers.get(key)
        if timer is not None:
            if timer.when() <= when:
                return
            timer.cancel()
        self._timers[key] = loop.call_at(when, self._fire, key)

    def add_soon(self, key: str, window: float) -> None:
        """Add within ``window`` seconds: the changes of one key in that time (a run's pods
        bound one after the other) make one pass, not one each. Nothing more when the key
        is already queued: its pass reads the caches as they are then."""
        if key not in self._queued:
            self.add_after(key, window)

    def _fire(self, key: str) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def retry(self, key: str) -> float:
        """Re-add after this key's next backoff delay (with jitter); returns the delay."""
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        return self.back_off(key, failures)

    def back_off(self, key: str, failures: int) -> float:
        """Re-add after the backoff delay of ``failures`` earlier failures counted by the
        caller (a release sent apart from the passes, whose successes reset the key's own
        count); returns the delay."""
        delay = min(self.retry_max, self.retry_base * float(2 ** min(failures, 32)))
        delay *= 0.8 + 0.4 * random.random()
        self.add_after(key, delay)
        return delay

    def forget(self, key: str) -> None:
        self._failures.pop(key, None)

    def failures(self, key: str) -> int:
        return self._failures.get(key, 0)

    async def get(self) -> str:
        while not self._queue:
            self._ready.clear()
            await self._ready.wait()
        key = self._queue.popleft()
        self._queued.discard(key)
        self._processing.add(key)
        return key

    def done(self, key: str) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._dirty.discard(key)
            urgent = key in self._urgent_dirty
            self._urgent_dirty.discard(key)
            self.add(key, urgent=urgent)

    def cancel_timers(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()


async def cancel_and_wait(tasks: Iterable[asyncio.Task[None]]) -> None:
    """Cancel the controller's tasks (workers, informers) and wait until each has ended."""
    pending = list(tasks)
    for task in pending:
        task.cancel()
    for task in pending:
        with contextlib.suppress(asyncio.CancelledError):
            await task
