"""A node's Lease read on this process's clock: a kubelet whose clock is off cannot keep a
dead node alive. The pure rule (``renewal_seen``) and the reads through kmock's HTTP server."""

from __future__ import annotations

from typing import Any

import pytest

from coschedule.k8s.timefmt import micro_time
from coschedule.kube.client import KubeClient
from coschedule.reconcile.node_leases import KEEP_SECONDS, NodeLeases, renewal_seen
from coschedule.reconcile.plan import NODE_DOWN_SECONDS
from tests.reconcile.apiserver import MiniApi

NOW = 1_800_000_000.0
HOUR = 3600.0


def test_a_first_sight_trusts_the_renew_time_back_in_time_only() -> None:
    # A kubelet whose Lease is old on its clock: a dead node is found at once, as before.
    assert renewal_seen(None, NOW - 90, NOW) == (NOW - 90, NOW - 90)
    # A renew time ahead of our clock counts from now, not from the kubelet's future.
    assert renewal_seen(None, NOW + HOUR, NOW) == (NOW + HOUR, NOW)


def test_a_renew_time_that_does_not_advance_keeps_counting_the_silence() -> None:
    first = renewal_seen(None, NOW + HOUR, NOW)
    later = renewal_seen(first, NOW + HOUR, NOW + NODE_DOWN_SECONDS + 1)
    assert later == first  # silent since NOW on our clock: long enough to be taken for dead


def test_a_renew_time_that_advances_is_a_renewal_seen_now() -> None:
    first = renewal_seen(None, NOW + HOUR, NOW)
    # A kubelet renewing on a clock an hour ahead: alive, counted from the read that saw it.
    assert renewal_seen(first, NOW + HOUR + 10, NOW + 12) == (NOW + HOUR + 10, NOW + 12)
    # On a clock behind, the same: the advance is what counts, not how old the value looks.
    behind = renewal_seen(None, NOW - 300, NOW)
    assert renewal_seen(behind, NOW - 290, NOW + 10) == (NOW - 290, NOW + 10)


def test_a_lease_made_again_with_an_earlier_time_is_a_first_sight() -> None:
    first = renewal_seen(None, NOW - 5, NOW)
    assert renewal_seen(first, NOW - 120, NOW + 3) == (NOW - 120, NOW - 120)


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def put_lease(api: MiniApi, node: str, renew: float) -> None:
    meta: dict[str, Any] = {"name": node, "namespace": "kube-node-lease"}
    api.put("leases", {"metadata": meta, "spec": {"renewTime": micro_time(renew)}})


@pytest.mark.parametrize("ahead", [HOUR, 0.0])
async def test_a_dead_kubelet_is_silent_from_our_first_read_whatever_its_clock(
    api: MiniApi, client: KubeClient, ahead: float
) -> None:
    """The last renewal a dead kubelet wrote, an hour ahead of our clock or not: read again
    and again, it stops counting as alive NODE_DOWN_SECONDS after our first read at most."""
    clock = Clock(NOW)
    leases = NodeLeases(client, clock)
    put_lease(api, "worker-1", NOW - 1 + ahead)
    first = (await leases.renewed(["worker-1"]))["worker-1"]
    assert first <= NOW
    for step in range(1, 12):
        clock.now = NOW + step * (KEEP_SECONDS + 0.1)
        assert (await leases.renewed(["worker-1"]))["worker-1"] == first
    assert clock.now - first >= NODE_DOWN_SECONDS  # plan's test: dead
    assert api.count("GET", "leases") == 12  # read again each time its keep ran out


async def test_a_kubelet_renewing_on_a_clock_ahead_stays_alive(
    api: MiniApi, client: KubeClient
) -> None:
    clock = Clock(NOW)
    leases = NodeLeases(client, clock)
    for step in range(6):
        clock.now = NOW + step * 10
        put_lease(api, "worker-1", clock.now + HOUR)  # renewed every 10 s, its clock ahead
        renewed = (await leases.renewed(["worker-1"]))["worker-1"]
        assert clock.now - renewed < NODE_DOWN_SECONDS
