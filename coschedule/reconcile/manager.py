"""One manager for the reconciler's controllers (controller-runtime's Manager and its
``reconcileHandler`` are the model).

A controller gives its watches, when its caches are full, what it queues on taking the
lead, and ``reconcile(key) -> Plan | None`` for one key of its queue. The manager owns the
rest, once for every controller: the watches run in every replica (a new leader starts
from full caches), the workers only in the leader; readiness; settings reload; stop; and
what a reconcile's outcome does to the key's place in the queue:

- an error (any API error, a 409 Conflict included: the cache was behind; or a bug) ->
  retried with the key's rate-limited backoff, counted in
  ``coschedule_reconcile_errors_total{controller,code}``;
- the plan asks for a retry (it decided nothing on half the facts) -> the same backoff;
- the plan asks to look again after a delay -> requeued after it; the backoff is reset;
- leadership lost mid-reconcile -> dropped (the new leader reconciles everything).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from coschedule.config.store import SettingsStore
from coschedule.kube.client import ApiError
from coschedule.reconcile.executor import NotLeader
from coschedule.reconcile.model import Plan
from coschedule.reconcile.reconciler_metrics import ReconcileMetrics
from coschedule.reconcile.workqueue import WorkQueue, cancel_and_wait


class Reconciler(Protocol):
    """What one controller gives the manager."""

    name: str  # the ``controller`` label of the reconcile metrics
    probe: str  # the name of its readiness check
    log: logging.Logger
    queue: WorkQueue  # its event handlers add keys; the manager's workers take them
    workers: int  # worker tasks while leading

    def informer_runs(self) -> list[Coroutine[Any, Any, None]]:
        """The watches to run in every replica."""
        ...

    async def wait_synced(self) -> None:
        """Until every cache the workers read is full."""
        ...

    def take_over(self) -> None:
        """On taking the lead, with full caches: queue everything known."""
        ...

    def leader_runs(self) -> list[Coroutine[Any, Any, None]]:
        """What runs beside the workers while leading (started and cancelled with them)."""
        ...

    def readiness(self) -> tuple[bool, str | None]: ...

    def settings_changed(self) -> None:
        """After a settings reload."""
        ...

    def log_fields(self, key: str) -> dict[str, str]:
        """What a log line about ``key`` names (the placeholder and its run, the group)."""
        ...

    async def reconcile(self, key: str) -> Plan | None:
        """Observe, decide, act for one key; the plan says when to look again (None: on
        the next change). Raises on failure."""
        ...


Check = Callable[[], tuple[bool, str | None]]


class Manager:
    def __init__(self, metrics: ReconcileMetrics, store: SettingsStore | None = None) -> None:
        self.metrics = metrics
        self.store = store
        self.controllers: list[Reconciler] = []
        self._leading = False
        self._informer_tasks: list[asyncio.Task[None]] = []
        self._worker_tasks: list[asyncio.Task[None]] = []

    def add(self, controller: Reconciler) -> None:
        self.controllers.append(controller)
        self.metrics.reconciles.labels(controller.name)

    @property
    def leading(self) -> bool:
        return self._leading

    def is_leading(self) -> bool:
        """For the controllers' executors: checked before every API call."""
        return self._leading

    # ---- lifecycle ----------------------------------------------------------------------

    def start_informers(self) -> None:
        self._informer_tasks = [
            asyncio.create_task(run) for c in self.controllers for run in c.informer_runs()
        ]

    async def wait_synced(self) -> None:
        await asyncio.gather(*(c.wait_synced() for c in self.controllers))

    def checks(self) -> dict[str, Check]:
        """The readiness checks for the probes: each controller's, and the settings'."""
        found: dict[str, Check] = {c.probe: c.readiness for c in self.controllers}
        store = self.store
        if store is not None:
            found["config"] = lambda: (True, store.detail())
        return found

    def reload(self) -> None:
        """Reload the settings if their files changed; tell the controllers."""
        if self.store is not None and self.store.maybe_reload():
            self.settings_changed()

    def settings_changed(self) -> None:
        for controller in self.controllers:
            controller.settings_changed()

    def start_leading(self) -> None:
        """Leader election's callback: act on every known key, from the caches."""
        if self._leading:
            return
        self._leading = True
        self.metrics.leader.set(1)
        self._worker_tasks = [asyncio.create_task(self._lead(c)) for c in self.controllers]

    async def _lead(self, controller: Reconciler) -> None:
        # Acting on half-filled caches would create what exists or delete what is needed.
        await controller.wait_synced()
        controller.take_over()
        self._worker_tasks += [asyncio.create_task(run) for run in controller.leader_runs()]
        self._worker_tasks += [
            asyncio.create_task(self._worker(controller)) for _ in range(controller.workers)
        ]

    def stop_leading(self) -> None:
        """Stop acting at once: cancel workers mid-call (the new leader re-reconciles)."""
        self._leading = False
        self.metrics.leader.set(0)
        for task in self._worker_tasks:
            task.cancel()
        self._worker_tasks = []
        for controller in self.controllers:
            controller.queue.cancel_timers()

    async def stop(self) -> None:
        workers = self._worker_tasks
        self.stop_leading()
        await cancel_and_wait([*workers, *self._informer_tasks])
        self._informer_tasks = []

    # ---- workers ------------------------------------------------------------------------

    async def _worker(self, controller: Reconciler) -> None:
        """One worker: take keys from the controller's queue and reconcile them."""
        while True:
            key = await controller.queue.get()
            try:
                await self.reconcile_key(controller, key)
            finally:
                controller.queue.done(key)

    async def reconcile_key(self, controller: Reconciler, key: str) -> None:
        """One reconcile and what its outcome does to the key; never raises."""
        name = controller.name
        self.metrics.reconciles.labels(name).inc()
        try:
            result = await controller.reconcile(key)
        except asyncio.CancelledError:
            raise
        except NotLeader:
            return
        except ApiError as exc:
            self.metrics.errors.labels(name, str(exc.status)).inc()
            delay = controller.queue.retry(key)
            controller.log.log(
                logging.INFO if exc.status == 409 else logging.WARNING,
                f"API error {exc.status} {exc.reason}; retrying",
                extra={
                    **controller.log_fields(key),
                    "error": exc.message,
                    "retry_in": round(delay, 3),
                },
            )
        except Exception as exc:  # the loop never dies; the key is retried later
            self.metrics.errors.labels(name, "0").inc()
            delay = controller.queue.retry(key)
            controller.log.exception(
                "reconcile failed",
                extra={
                    **controller.log_fields(key),
                    "error": repr(exc),
                    "retry_in": round(delay, 3),
                },
            )
        else:
            self._follow(controller, key, result or Plan())

    def _follow(self, controller: Reconciler, key: str, result: Plan) -> None:
        """What the plan said about this key's place in the queue."""
        queue = controller.queue
        extra = controller.log_fields(key)
        if result.retry is not None:
            self.metrics.errors.labels(controller.name, "owner").inc()
            delay = queue.retry(key)
            controller.log.warning(
                "owner lookup failed; retrying",
                extra={**extra, "error": result.retry, "retry_in": round(delay, 3)},
            )
        else:
            queue.forget(key)
        if result.warning is not None:
            controller.log.warning(result.warning, extra=extra)
        if result.note is not None:
            controller.log.debug("nothing to do", extra={**extra, "why": result.note})
        if result.requeue is not None:
            queue.add_after(key, result.requeue.after)
            controller.log.debug("requeued", extra={**extra, "why": result.requeue.why})
