"""The one mapping from a reconcile's outcome to the key's place in the queue, for every
controller the manager runs (controller-runtime's reconcileHandler)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

import pytest

from coschedule.kube.client import ApiError
from coschedule.reconcile.executor import NotLeader
from coschedule.reconcile.manager import Manager
from coschedule.reconcile.model import Plan, Requeue
from coschedule.reconcile.reconciler_metrics import ReconcileMetrics
from coschedule.reconcile.workqueue import WorkQueue

log = logging.getLogger("tests.manager")


class Scripted:
    """A controller whose reconciles answer from a script, in order."""

    name = "scripted"
    probe = "scripted"
    log = log
    workers = 1

    def __init__(self, *outcomes: Plan | BaseException | None) -> None:
        self.queue = WorkQueue(retry_base=10.0)
        self.outcomes = list(outcomes)
        self.seen: list[str] = []
        self.beside: list[str] = []  # what the leader runs beside the workers did

    def informer_runs(self) -> list[Coroutine[Any, Any, None]]:
        return []

    async def wait_synced(self) -> None:
        return None

    def take_over(self) -> None:
        self.queue.add("ns/a")

    def leader_runs(self) -> list[Coroutine[Any, Any, None]]:
        return [self._beside()]

    async def _beside(self) -> None:
        self.beside.append("started")
        try:
            await asyncio.Event().wait()
        finally:
            self.beside.append("stopped")

    def readiness(self) -> tuple[bool, str | None]:
        return True, None

    def settings_changed(self) -> None:
        return None

    def log_fields(self, key: str) -> dict[str, str]:
        return {"key": key}

    async def reconcile(self, key: str) -> Plan | None:
        self.seen.append(key)
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


def sample(manager: Manager, name: str, **labels: str) -> float:
    return manager.metrics.registry.get_sample_value(name, labels) or 0.0


def managed(controller: Scripted) -> Manager:
    manager = Manager(ReconcileMetrics())
    manager.add(controller)
    return manager


async def test_errors_back_off_whatever_they_are_and_a_success_resets_the_backoff() -> None:
    conflict = ApiError(409, "Conflict", "the object has been modified")
    controller = Scripted(conflict, ApiError(500, "Internal", "boom"), ValueError("bug"), None)
    manager = managed(controller)
    for _ in range(3):
        await manager.reconcile_key(controller, "ns/a")
    assert controller.queue.failures("ns/a") == 3
    errors = "coschedule_reconcile_errors_total"
    for code in ("409", "500", "0"):
        assert sample(manager, errors, controller="scripted", code=code) == 1
    await manager.reconcile_key(controller, "ns/a")
    assert controller.queue.failures("ns/a") == 0
    assert sample(manager, "coschedule_reconcile_total", controller="scripted") == 4
    controller.queue.cancel_timers()


async def test_a_plan_says_retry_or_look_again_later() -> None:
    controller = Scripted(
        Plan(retry="owner lookup failed: 503"),
        Plan(requeue=Requeue(0.05, "idle grace")),
    )
    manager = managed(controller)
    await manager.reconcile_key(controller, "ns/a")
    assert controller.queue.failures("ns/a") == 1
    assert sample(manager, "coschedule_reconcile_errors_total", controller="scripted", code="owner")
    controller.queue.cancel_timers()
    await manager.reconcile_key(controller, "ns/a")
    assert controller.queue.failures("ns/a") == 0
    assert len(controller.queue) == 0
    await asyncio.sleep(0.1)
    assert len(controller.queue) == 1  # looked at again after the delay


async def test_leadership_lost_mid_reconcile_drops_the_key() -> None:
    controller = Scripted(NotLeader())
    manager = managed(controller)
    await manager.reconcile_key(controller, "ns/a")
    assert controller.queue.failures("ns/a") == 0
    assert len(controller.queue) == 0
    assert not sample(manager, "coschedule_reconcile_errors_total", controller="scripted", code="0")


async def test_only_the_leader_runs_workers_after_its_caches_are_full() -> None:
    controller = Scripted(None)
    manager = managed(controller)
    manager.start_informers()
    await asyncio.sleep(0.05)
    assert controller.seen == []
    manager.start_leading()
    for _ in range(100):
        if controller.seen:
            break
        await asyncio.sleep(0.01)
    assert controller.seen == ["ns/a"]
    assert controller.beside == ["started"]  # the release runners, say: with the workers
    assert sample(manager, "coschedule_reconciler_leader") == 1
    manager.stop_leading()
    await asyncio.sleep(0)
    assert controller.beside == ["started", "stopped"]  # and stopped with them
    await manager.stop()
    assert sample(manager, "coschedule_reconciler_leader") == 0


@pytest.mark.parametrize("reloaded", [True, False])
def test_a_reload_tells_the_controllers_only_when_the_settings_changed(reloaded: bool) -> None:
    told: list[str] = []

    class Store:
        def maybe_reload(self) -> bool:
            return reloaded

        def detail(self) -> str:
            return "ok"

    controller = Scripted()
    controller.settings_changed = lambda: told.append("changed")  # type: ignore[method-assign]
    manager = Manager(ReconcileMetrics(), Store())  # type: ignore[arg-type]
    manager.add(controller)
    manager.reload()
    assert told == (["changed"] if reloaded else [])
    assert set(manager.checks()) == {"scripted", "config"}
