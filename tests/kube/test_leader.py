"""Lease leader election between real electors over HTTP: one leader, handover, release."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest

from coschedule.kube.client import KubeClient
from coschedule.kube.leader import ElectionConfig, LeaderElector
from tests.reconcile.apiserver import MiniApi
from tests.reconcile.conftest import eventually

LEASE = ("leases", "coschedule-system", "coschedule-reconciler")


class Tracked:
    """An elector with its task and a log of start/stop callbacks."""

    def __init__(
        self,
        client: KubeClient,
        identity: str,
        *,
        lease_duration: float,
        renew_deadline: float,
        retry_period: float,
    ) -> None:
        self.events: list[str] = []
        config = ElectionConfig(
            namespace="coschedule-system",
            identity=identity,
            lease_duration=lease_duration,
            renew_deadline=renew_deadline,
            retry_period=retry_period,
        )
        self.elector = LeaderElector(
            client,
            config,
            on_started=lambda: self.events.append("started"),
            on_stopped=lambda: self.events.append("stopped"),
        )
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self.elector.run())

    async def crash(self) -> None:
        """Stop renewing without releasing (a killed pod)."""
        assert self.task is not None
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task

    @property
    def leading(self) -> bool:
        return self.elector.leading


FAST = {"lease_duration": 1.0, "renew_deadline": 0.6, "retry_period": 0.1}


@pytest.fixture
async def pair(api: MiniApi, client: KubeClient) -> AsyncIterator[tuple[Tracked, Tracked]]:
    electors: list[Tracked] = []

    def make(identity: str, **timing: float) -> Tracked:
        tracked = Tracked(client, identity, **timing)
        electors.append(tracked)
        return tracked

    a, b = make("replica-a", **FAST), make("replica-b", **FAST)
    yield a, b
    for tracked in electors:
        if tracked.task is not None and not tracked.task.done():
            await tracked.crash()


async def test_one_leader_and_takeover_within_a_lease_after_the_leader_dies(
    api: MiniApi, pair: tuple[Tracked, Tracked]
) -> None:
    a, b = pair
    a.start()
    await eventually(lambda: a.leading)
    b.start()
    both = False
    for _ in range(60):  # 0.6 s of renewals: b must stay a follower
        both = both or (a.leading and b.leading)
        await asyncio.sleep(0.01)
    assert not both
    assert not b.leading
    lease = api.get(*LEASE)
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == "replica-a"
    assert lease["spec"]["leaseDurationSeconds"] == 1

    await a.crash()
    started = time.monotonic()
    await eventually(lambda: b.leading, within=3)
    took = time.monotonic() - started
    assert took <= FAST["lease_duration"] + 2 * FAST["retry_period"] + 0.3
    lease = api.get(*LEASE)
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == "replica-b"
    assert lease["spec"]["leaseTransitions"] == 1
    assert b.events == ["started"]


async def test_release_sets_an_empty_holder_and_the_follower_takes_over_fast(
    api: MiniApi, client: KubeClient
) -> None:
    slow = {"lease_duration": 15.0, "renew_deadline": 10.0, "retry_period": 0.1}
    a, b = Tracked(client, "replica-a", **slow), Tracked(client, "replica-b", **slow)
    a.start()
    await eventually(lambda: a.leading)
    b.start()
    await asyncio.sleep(0.3)
    assert not b.leading
    await a.elector.release()
    assert a.events == ["started", "stopped"]
    lease = api.get(*LEASE)
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == ""
    assert lease["spec"]["leaseDurationSeconds"] == 1
    took = await eventually(lambda: b.leading, within=2)
    assert took < 1.0  # not the 15 s lease
    await a.crash()
    await b.crash()


async def test_racing_writers_conflict_and_exactly_one_wins(
    api: MiniApi, client: KubeClient
) -> None:
    electors = [Tracked(client, f"replica-{i}", **FAST) for i in range(3)]
    for tracked in electors:
        tracked.start()
    for _ in range(100):
        assert sum(t.leading for t in electors) <= 1
        await asyncio.sleep(0.01)
    assert sum(t.leading for t in electors) == 1
    # Optimistic concurrency did its job: stale PUTs/POSTs were refused, not applied.
    writes = api.count("PUT", "leases") + api.count("POST", "leases")
    assert writes >= 5
    for tracked in electors:
        await tracked.crash()


async def test_leader_steps_down_when_another_holder_appears(
    api: MiniApi, pair: tuple[Tracked, Tracked]
) -> None:
    a, _ = pair
    a.start()
    await eventually(lambda: a.leading)
    api.edit(*LEASE, {"spec": {"holderIdentity": "someone-else"}})
    await eventually(lambda: not a.leading, within=2)
    assert a.events == ["started", "stopped"]


async def test_leader_that_cannot_renew_stops_acting_by_the_renew_deadline(
    api: MiniApi, pair: tuple[Tracked, Tracked]
) -> None:
    a, _ = pair
    a.start()
    await eventually(lambda: a.leading)
    # The leader renews with a PUT of the Lease it last wrote (and GETs it after a 409).
    api.faults[("GET", "leases")] = [503] * 100
    api.faults[("PUT", "leases")] = [503] * 100
    took = await eventually(lambda: not a.leading, within=3)
    assert took <= FAST["renew_deadline"] + 2 * FAST["retry_period"] + 0.3
    assert a.events == ["started", "stopped"]


async def test_hung_lease_calls_time_out_and_the_leader_steps_down_in_time(
    api: MiniApi, pair: tuple[Tracked, Tracked]
) -> None:
    a, _ = pair
    a.start()
    await eventually(lambda: a.leading)
    api.delays[("GET", "leases")] = 30.0  # the apiserver stops answering
    api.delays[("PUT", "leases")] = 30.0
    took = await eventually(lambda: not a.leading, within=3)
    assert took <= FAST["renew_deadline"] + FAST["renew_deadline"] / 2 + 0.3


async def test_a_slow_api_server_costs_a_renewal_its_time_not_the_lease(
    api: MiniApi, client: KubeClient
) -> None:
    """Every Lease call answered after a third of the renew deadline (the load of a 500-node
    bench): a GET and a PUT are more than the half deadline a renewal was once cut at, and
    the leader lost the Lease again and again. It renews with one PUT, each try bounded by
    what is left of the deadline: it keeps the Lease, and the follower never leads."""
    timing = {"lease_duration": 3.0, "renew_deadline": 2.0, "retry_period": 0.2}
    a, b = Tracked(client, "replica-a", **timing), Tracked(client, "replica-b", **timing)
    a.start()
    await eventually(lambda: a.leading)
    b.start()
    try:
        await asyncio.sleep(0.5)
        api.delays[("GET", "leases")] = timing["renew_deadline"] / 3
        api.delays[("PUT", "leases")] = timing["renew_deadline"] / 3
        renewals = api.count("PUT", "leases")
        for _ in range(100):  # 5 s: more than two renew deadlines
            assert a.leading
            assert not b.leading
            await asyncio.sleep(0.05)
        assert api.count("PUT", "leases") >= renewals + 4
        assert a.events == ["started"]
        assert b.events == []
    finally:
        await a.crash()
        await b.crash()


async def test_a_leader_stops_acting_by_the_renew_deadline_from_its_last_renewal(
    api: MiniApi, client: KubeClient
) -> None:
    """The safety rule: the Lease calls hang, and the leader stops acting no later than the
    renew deadline after the start of its last renewal that succeeded (a try is bounded by
    what is left of the deadline, never by a fixed time that may run past it), well before
    the Lease it wrote then can expire for the others."""
    stopped: list[float] = []
    config = ElectionConfig(
        namespace="coschedule-system",
        identity="replica-a",
        lease_duration=3.0,
        renew_deadline=2.0,
        retry_period=0.1,
    )
    elector = LeaderElector(client, config, on_stopped=lambda: stopped.append(time.monotonic()))
    task = asyncio.create_task(elector.run())
    try:
        await eventually(lambda: elector.leading)
        await asyncio.sleep(0.25)
        api.delays[("GET", "leases")] = 30.0
        api.delays[("PUT", "leases")] = 30.0
        await eventually(lambda: not elector.leading, within=4)
        assert stopped[0] - elector._last_renew <= config.renew_deadline + 0.1
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
