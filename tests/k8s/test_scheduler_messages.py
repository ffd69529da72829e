"""kube-scheduler's Unschedulable messages, parsed: realistic 1.36 messages from fixtures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from coschedule.k8s.scheduler_messages import Cause, classify, parse

FIXTURE = (
    Path(__file__).resolve().parents[1] / "fixtures" / "scheduler" / ("unschedulable-messages.json")
)
CASES: list[dict[str, Any]] = json.loads(FIXTURE.read_text())["cases"]
BY_NAME = {case["name"]: case["message"] for case in CASES}


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_messages_parse_to_counts_causes_and_details(case: dict[str, Any]) -> None:
    parsed = parse(case["message"])
    assert parsed.nodes == case["nodes"]
    got = [[r.count, r.cause.value, r.detail] for r in parsed.reasons]
    assert got == case["expect"]


def test_only_the_pin_to_the_placeholder_is_not_blocking() -> None:
    waiting = parse(BY_NAME["waiting for the placeholder (not stuck on a node)"])
    assert waiting.reasons
    assert not waiting.blocking
    cpu = parse(BY_NAME["cpu on the group's node"])
    assert [r.cause for r in cpu.blocking] == [Cause.RESOURCES]


@pytest.mark.parametrize(
    ("text", "cause"),
    [
        ("node(s) didn't match PersistentVolume's node affinity", Cause.VOLUME),
        ("node(s) had no available volume zone", Cause.VOLUME),
        ("node(s) didn't find available persistent volumes to bind", Cause.VOLUME),
        ("node(s) didn't satisfy existing pods anti-affinity rules", Cause.ANTI_AFFINITY),
        ("node(s) had taints that the pod didn't tolerate", Cause.TAINT),
        ("node(s) didn't have free ports for the requested pod ports", Cause.OTHER),
        ("Insufficient nvidia.com/gpu", Cause.RESOURCES),
    ],
)
def test_reason_wordings_of_other_releases(text: str, cause: Cause) -> None:
    assert classify(text).cause is cause


def test_empty_and_odd_messages_do_not_raise() -> None:
    assert parse("").nodes is None
    assert parse("0/3 nodes are available").reasons == ()
    assert parse("0/3 nodes are available: .").reasons == ()


# A pod pinned to one node by name: kube-scheduler 1.36's words for the other nodes (its
# NodeAffinity PreFilter keeps the one node; seen on the e2e control plane), and the
# Filter's words (a node the pin and the user's own rules both count).
PIN = "node(s) didn't satisfy plugin(s) [NodeAffinity]"
FILTER = "node(s) didn't match Pod's node affinity/selector"


@pytest.mark.parametrize(
    ("message", "blocking"),
    [
        # Its node is full; the five others fail on the pin: only the cpu counts.
        (
            f"0/6 nodes are available: 1 Insufficient cpu, 5 {PIN}. no new claims to "
            "deallocate, preemption: 0/6 nodes are available: 1 No preemption victims found "
            "for incoming pod, 5 Preemption is not helpful for scheduling.",
            [(1, Cause.RESOURCES)],
        ),
        (f"0/6 nodes are available: 1 Insufficient cpu, 5 {FILTER}.", [(1, Cause.RESOURCES)]),
        # Its node is cordoned (that filter runs first there).
        (
            f"0/3 nodes are available: 1 node(s) were unschedulable, 2 {PIN}.",
            [(1, Cause.UNSCHEDULABLE)],
        ),
        # Every node fails node affinity: one of them is its own node (the user's rules
        # exclude it, or the pin names a node the run left): that one still counts.
        (f"0/6 nodes are available: 6 {FILTER}. preemption: 0/6 ...", [(1, Cause.NODE_AFFINITY)]),
        (
            f"0/6 nodes are available: 1 {FILTER}, 5 {PIN}.",
            [(1, Cause.NODE_AFFINITY)],
        ),
        # One node in the cluster: nothing to take away.
        ("0/1 nodes are available: 1 Insufficient memory.", [(1, Cause.RESOURCES)]),
        ("not the scheduler's shape", []),
    ],
)
def test_a_pinned_pods_message_counts_the_pin_as_the_pin_to_the_placeholder(
    message: str, blocking: list[tuple[int, Cause]]
) -> None:
    pinned = parse(message).pinned()
    assert [(r.count, r.cause) for r in pinned.blocking] == blocking
    # The counts still add up to the nodes the scheduler looked at.
    if pinned.nodes is not None:
        assert sum(r.count for r in pinned.reasons) == pinned.nodes
