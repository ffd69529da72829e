"""The release stage: a pass's releases sent apart from it, every run's first pod before any
run's second, a release planned again replacing the one still waiting, a failure handed back
for its run, and nothing from an earlier lead sent after a new one began."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from coschedule.reconcile.model import ReleasePod
from coschedule.reconcile.release_stage import ReleaseStage
from coschedule.reconcile.workqueue import cancel_and_wait
from tests.conftest import PATIENCE_SECONDS


def pod(name: str, node: str = "worker-1", version: str = "1") -> ReleasePod:
    return ReleasePod("ci", name, "aa", node, (), version)


class Sends:
    """What the stage sent, in order; a pod named ``bad-*`` fails; each send can be held."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, str]] = []  # (run key, pod, node)
        self.failed: list[tuple[str, str, int]] = []
        self.hold = asyncio.Event()
        self.hold.set()

    async def send(self, key: str, release: ReleasePod) -> None:
        await self.hold.wait()
        if release.name.startswith("bad-"):
            raise RuntimeError(f"refused {release.name}")
        self.sent.append((key, release.name, release.node))

    def fail(self, key: str, exc: Exception, failures: int) -> None:
        self.failed.append((key, str(exc), failures))


@asynccontextmanager
async def running(stage: ReleaseStage) -> AsyncIterator[None]:
    runners = [asyncio.create_task(run) for run in stage.runs()]
    try:
        yield
        await asyncio.wait_for(stage.idle(), PATIENCE_SECONDS)
    finally:
        await cancel_and_wait(runners)


async def test_every_runs_first_pod_goes_before_any_runs_second() -> None:
    sends = Sends()
    stage = ReleaseStage(sends.send, sends.fail, runners=1)
    async with running(stage):
        sends.hold.clear()  # the runner takes the first and waits: the rest queue behind it
        stage.submit("ci/a", [pod("a0"), pod("a1"), pod("a2")])
        stage.submit("ci/b", [pod("b0"), pod("b1")])
        stage.submit("ci/c", [pod("c0")])
        await asyncio.sleep(0)
        sends.hold.set()
    assert [name for _, name, _ in sends.sent] == ["a0", "b0", "c0", "a1", "b1", "a2"]
    assert stage.waiting == 0


async def test_a_pass_hands_its_releases_over_without_waiting_for_them() -> None:
    sends = Sends()
    sends.hold.clear()
    stage = ReleaseStage(sends.send, sends.fail, runners=2)
    async with running(stage):
        stage.submit("ci/a", [pod("a0"), pod("a1"), pod("a2")])  # returns at once
        assert stage.waiting == 3
        await asyncio.sleep(0.01)
        assert sends.sent == []  # both runners hold one each, the third waits
        sends.hold.set()
    assert sorted(name for _, name, _ in sends.sent) == ["a0", "a1", "a2"]


async def test_a_release_planned_again_replaces_the_one_still_waiting() -> None:
    sends = Sends()
    stage = ReleaseStage(sends.send, sends.fail, runners=1)
    async with running(stage):
        sends.hold.clear()
        stage.submit("ci/a", [pod("a0")])  # taken by the runner, held
        stage.submit("ci/a", [pod("a1", node="worker-1")])
        await asyncio.sleep(0)
        # A newer pass: the placeholder moved to worker-2 before a1 went out.
        stage.submit("ci/a", [pod("a1", node="worker-2", version="2")])
        sends.hold.set()
    assert sends.sent == [("ci/a", "a0", "worker-1"), ("ci/a", "a1", "worker-2")]


async def test_the_same_release_planned_again_keeps_its_place_and_goes_out_once() -> None:
    """A pass that runs while the first release is on its way plans it again from a cache
    that does not show it yet: nothing more is queued, and what waits keeps its place."""
    sends = Sends()
    stage = ReleaseStage(sends.send, sends.fail, runners=1)
    async with running(stage):
        sends.hold.clear()
        stage.submit("ci/a", [pod("a0"), pod("a1")])  # a0 taken and held, a1 waiting
        stage.submit("ci/b", [pod("b0"), pod("b1")])
        await asyncio.sleep(0)
        stage.submit("ci/a", [pod("a0"), pod("a1")])  # the same, planned again
        assert stage.waiting == 4
        sends.hold.set()
    assert [name for _, name, _ in sends.sent] == ["a0", "b0", "a1", "b1"]


async def test_a_pods_release_is_never_sent_twice_at_once() -> None:
    """Planned from a newer version while the first is on its way: sent after it ends."""
    sends = Sends()
    sending: list[str] = []
    overlaps: list[str] = []

    async def send(key: str, release: ReleasePod) -> None:
        if release.name in sending:
            overlaps.append(release.name)
        sending.append(release.name)
        await sends.send(key, release)
        sending.remove(release.name)

    stage = ReleaseStage(send, sends.fail, runners=4)
    async with running(stage):
        sends.hold.clear()
        stage.submit("ci/a", [pod("a0")])
        await asyncio.sleep(0)
        stage.submit("ci/a", [pod("a0", version="2")])  # a newer version of the pod
        await asyncio.sleep(0.01)
        assert sending == ["a0"]  # the second waits for the first to end
        sends.hold.set()
    assert overlaps == []
    assert [name for _, name, _ in sends.sent] == ["a0", "a0"]


async def test_a_failed_release_is_handed_back_for_its_run_and_stops_no_other() -> None:
    sends = Sends()
    stage = ReleaseStage(sends.send, sends.fail, runners=1)
    async with running(stage):
        stage.submit("ci/a", [pod("a0"), pod("bad-a1"), pod("a2")])
    assert [name for _, name, _ in sends.sent] == ["a0", "a2"]
    assert sends.failed == [("ci/a", "refused bad-a1", 1)]


async def test_a_runs_failed_releases_in_a_row_are_counted_until_one_goes_out() -> None:
    """The pass that handed a release over succeeded (the queue's own count for the run is
    reset by it): the stage counts the run's failures in a row for the backoff."""
    sends = Sends()
    stage = ReleaseStage(sends.send, sends.fail, runners=1)
    async with running(stage):
        for _ in range(3):
            stage.submit("ci/a", [pod("bad-a1")])
            await stage.idle()
        stage.submit("ci/a", [pod("a2")])
        await stage.idle()
        stage.submit("ci/a", [pod("bad-a1")])
    assert [failures for _, _, failures in sends.failed] == [1, 2, 3, 1]


async def test_a_new_lead_drops_what_the_last_one_left_waiting() -> None:
    sends = Sends()
    stage = ReleaseStage(sends.send, sends.fail, runners=1)
    sends.hold.clear()
    first = [asyncio.create_task(run) for run in stage.runs()]
    stage.submit("ci/a", [pod("a0"), pod("a1")])
    await asyncio.sleep(0)
    await cancel_and_wait(first)  # the lead is lost: a0 cancelled mid-send, a1 waiting
    sends.hold.set()
    async with running(stage):
        stage.submit("ci/b", [pod("b0")])
    assert sends.sent == [("ci/b", "b0", "worker-1")]


def test_a_stage_needs_a_runner() -> None:
    with pytest.raises(ValueError, match="at least one runner"):
        ReleaseStage(Sends().send, Sends().fail, runners=0)
