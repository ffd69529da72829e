"""API-layer fixtures: kmock's HTTP server on 127.0.0.1 with the ``MiniApi`` state behind it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import kmock
import pytest

from coschedule.kube.client import Credentials, KubeClient
from tests.reconcile.apiserver import MiniApi, Scaffold


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
    check: Callable[[], object], within: float = 3.0, interval: float = 0.01
) -> float:
    """Wait until ``check()`` is truthy; return how long it took (fail after ``within`` s)."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > within:
            raise AssertionError(f"condition not met within {within} s")
        await asyncio.sleep(interval)
    return time.monotonic() - start
