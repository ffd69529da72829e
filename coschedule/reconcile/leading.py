"""What the reconciler's controllers share about leading: their watches run in every
replica (a new leader starts from full caches), their workers only in the leader.

``LeaderWorkers`` owns those tasks and the start/stop callbacks leader election calls; a
controller says which watches it runs, when its caches are full, what it queues on taking
the lead and how it reconciles one key.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Coroutine
from typing import Any

from coschedule.reconcile.workqueue import WorkQueue, cancel_and_wait


class LeaderWorkers(abc.ABC):
    queue: WorkQueue
    workers: int  # worker tasks while leading

    def __init__(self) -> None:
        self._leading = False
        self._informer_tasks: list[asyncio.Task[None]] = []
        self._worker_tasks: list[asyncio.Task[None]] = []

    @property
    def leading(self) -> bool:
        return self._leading

    def start_informers(self) -> None:
        self._informer_tasks = [asyncio.create_task(run) for run in self._informer_runs()]

    def start_leading(self) -> None:
        """Leader election's callback: act on every known key, from the caches."""
        if self._leading:
            return
        self._leading = True
        self._lead_changed(True)
        self._worker_tasks = [asyncio.create_task(self._lead())]

    async def _lead(self) -> None:
        # Acting on half-filled caches would create what exists or delete what is needed.
        await self.wait_synced()
        self._take_over()
        self._worker_tasks += [asyncio.create_task(self._worker()) for _ in range(self.workers)]

    def stop_leading(self) -> None:
        """Stop acting at once: cancel workers mid-call (the new leader re-reconciles)."""
        self._leading = False
        self._lead_changed(False)
        for task in self._worker_tasks:
            task.cancel()
        self._worker_tasks = []
        self.queue.cancel_timers()

    async def stop(self) -> None:
        workers = self._worker_tasks
        self.stop_leading()
        await cancel_and_wait([*workers, *self._informer_tasks])
        self._informer_tasks = []

    def _lead_changed(self, leading: bool) -> None:
        """Taking or losing the lead (a metric, say); nothing by default."""
        return None

    @abc.abstractmethod
    def _informer_runs(self) -> list[Coroutine[Any, Any, None]]:
        """The watches to run in every replica."""

    @abc.abstractmethod
    async def wait_synced(self) -> None:
        """Until every cache the workers read is full."""

    @abc.abstractmethod
    def _take_over(self) -> None:
        """On taking the lead, with full caches: queue everything known."""

    async def _worker(self) -> None:
        """One worker: take keys from the queue and reconcile them, until cancelled."""
        while True:
            key = await self.queue.get()
            try:
                await self.reconcile_key(key)
            finally:
                self.queue.done(key)

    @abc.abstractmethod
    async def reconcile_key(self, key: str) -> None:
        """One key's reconcile; failures are handled (retried, logged), never raised."""
