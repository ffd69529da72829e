"""API-layer fixtures: kmock's HTTP server on 127.0.0.1 with the ``MiniApi`` state behind it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import kmock
import pytest

from coschedule.config.settings import Settings
from coschedule.kube.client import Credentials, KubeClient
from coschedule.reconcile.controller import Controller
from coschedule.reconcile.manager import Manager
from coschedule.reconcile.reconciler_metrics import ReconcileMetrics
from tests.conftest import PATIENCE_SECONDS
from tests.reconcile.apiserver import MiniApi, Scaffold
from tests.reconcile.pods import placeholder_of


@pytest.fixture
async def api() -> AsyncIterator[MiniApi]:
    async with Scaffold() as handler, kmock.Server(handler) as server:
        state = MiniApi(handler)
        state.url = str(server.url).rstrip("/")
        yield state
        state.end_watches()


@pytest.fixture
async def client(api: MiniApi) -> AsyncIterator[KubeClient]:
    kube = KubeClient(Credentials(server=api.url), timeout=5.0)
    yield kube
    await kube.aclose()


async def eventually(
    check: Callable[[], object], within: float = PATIENCE_SECONDS, interval: float = 0.01
) -> float:
    """Wait until ``check()`` is truthy; return how long it took (fail after ``within`` s:
    by default the generous bound of a busy machine, which a passing test never waits for)."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > within:
            raise AssertionError(f"condition not met within {within} s")
        await asyncio.sleep(interval)
    return time.monotonic() - start


async def made_placeholder(api: MiniApi, pod: dict[str, Any]) -> str:
    """Put a marked run pod; once the reconciler has made its placeholder StatefulSet,
    the placeholder's name."""
    name = placeholder_of(pod)
    api.put("pods", pod)
    await eventually(lambda: api.get("statefulsets", "ci", name) is not None)
    return name


def placeholder_controller(
    client: KubeClient, settings: Settings, **options: Any
) -> tuple[Manager, Controller]:
    """The placeholder controller under its own manager, as the reconciler wires it."""
    manager = Manager(ReconcileMetrics())
    controller = Controller(
        client, lambda: settings, manager.metrics, leading=manager.is_leading, **options
    )
    manager.add(controller)
    return manager, controller


async def start(manager: Manager, *, lead: bool = True) -> None:
    """Watches on, caches full, and (``lead``) the workers acting."""
    manager.start_informers()
    await asyncio.wait_for(manager.wait_synced(), 3)
    if lead:
        manager.start_leading()
