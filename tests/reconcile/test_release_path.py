"""The release path under a burst, against the kmock emulator (real HTTP, JSON patches applied
as kube-apiserver does: a failed ``test`` is 422): a pass's releases each stand alone, a
release is not sent twice from the same version (the 422s a lagging cache caused), and a
placeholder an earlier look made is not "restored" when the cache has not seen it yet. The
work queue puts urgent keys (a placeholder to make, pods to release) first."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from coschedule.config.settings import Settings
from coschedule.kube.client import METADATA_ACCEPT, KubeClient
from coschedule.marks import GATE_PLACEHOLDER, Mode
from coschedule.placement import node_pin
from coschedule.reconcile.executor import Executor
from coschedule.reconcile.model import CreateStatefulSet, RecordEvent, ReleasePod
from coschedule.reconcile.placeholder import build_statefulset, group_spec
from coschedule.reconcile.reconciler_metrics import ReconcileMetrics
from coschedule.reconcile.stuck_facts import StuckMemory
from coschedule.reconcile.workqueue import WorkQueue, cancel_and_wait
from tests.conftest import PATIENCE_SECONDS
from tests.reconcile.apiserver import MiniApi
from tests.reconcile.pods import by_node_name, marked_pod, parsed, placeholder_of

NODE = "worker-1"


def _executor(client: KubeClient) -> Executor:
    metrics = ReconcileMetrics(CollectorRegistry())
    return Executor(
        client,
        metrics,
        leading=lambda: True,
        run_of=lambda key: "run",
        pod_version=lambda key: "",
        torn_down=lambda key: None,
        stuck=StuckMemory(metrics.stuck_groups),
    )


@asynccontextmanager
async def releasing(executor: Executor) -> AsyncIterator[None]:
    """The executor's release runners, as while leading; at the end, everything handed
    over has been sent."""
    runners = [asyncio.create_task(run) for run in executor.releases.runs()]
    try:
        yield
        await asyncio.wait_for(executor.releases.idle(), PATIENCE_SECONDS)
    finally:
        await cancel_and_wait(runners)


def gated(name: str) -> dict[str, Any]:
    return by_node_name(marked_pod("tekton-taskrun", name=name, phase="Pending"), None)


def release(pod: dict[str, Any], version: str) -> ReleasePod:
    meta = pod["metadata"]
    ops = tuple(node_pin.release_ops(pod, NODE))
    return ReleasePod(meta["namespace"], meta["name"], placeholder_of(pod), NODE, ops, version)


def gates(api: MiniApi, name: str) -> list[str]:
    pod = api.get("pods", "ci", name)
    assert pod is not None
    return [g["name"] for g in pod["spec"].get("schedulingGates") or []]


async def test_every_release_of_a_pass_takes_effect_and_a_stale_one_stops_none(
    api: MiniApi, client: KubeClient
) -> None:
    pods = [gated(f"pr-7f3k2-task-{i}-pod") for i in range(5)]
    actions = [release(pod, api.put("pods", pod)["metadata"]["resourceVersion"]) for pod in pods]
    # The third one's gate went meanwhile (the patch's ``test`` fails: 422, stale).
    api.edit("pods", "ci", pods[2]["metadata"]["name"], {"spec": {"schedulingGates": None}})
    executor = _executor(client)
    async with releasing(executor):
        await executor.execute(f"ci/{placeholder_of(pods[0])}", actions, None)
    for index, pod in enumerate(pods):
        stored = api.get("pods", "ci", pod["metadata"]["name"])
        assert stored is not None
        assert GATE_PLACEHOLDER not in gates(api, pod["metadata"]["name"])
        pinned = node_pin.pinned_node(stored["metadata"])
        assert pinned == (None if index == 2 else NODE), index
    assert api.count("PATCH", "pods") == 5
    # The answers are not read: each asks for the pod's metadata alone (the emulator, like a
    # server that does not convert, answers the whole pod, which is taken the same).
    patches = [
        accept for verb, plural, accept in api.accepts if (verb, plural) == ("PATCH", "pods")
    ]
    assert patches == [METADATA_ACCEPT] * 5


async def test_a_release_is_not_sent_again_from_the_version_it_was_planned_from(
    api: MiniApi, client: KubeClient
) -> None:
    pod = gated("pr-7f3k2-build-pod")
    seen = api.put("pods", pod)["metadata"]["resourceVersion"]
    executor = _executor(client)
    key = f"ci/{placeholder_of(pod)}"
    async with releasing(executor):
        await executor.execute(key, [release(pod, seen)], None)
    assert gates(api, "pr-7f3k2-build-pod") == []
    # A look before the watch shows the patch plans the same release from the same version:
    # not sent (it would be refused, 422, and the key looked at once more).
    async with releasing(executor):
        await executor.execute(key, [release(pod, seen)], None)
    assert api.count("PATCH", "pods") == 1
    # Gated again (a newer version): released again.
    again = api.put("pods", pod)["metadata"]["resourceVersion"]
    async with releasing(executor):
        await executor.execute(key, [release(pod, again)], None)
    assert api.count("PATCH", "pods") == 2
    assert gates(api, "pr-7f3k2-build-pod") == []
    # Forgotten with the pod (deleted): a pod made again under its name from the same
    # version number would be released.
    executor.forget_pod(f"ci/{pod['metadata']['name']}")
    assert f"ci/{pod['metadata']['name']}" not in executor.released


def _create_action(pod: dict[str, Any]) -> CreateStatefulSet:
    name = placeholder_of(pod)
    spec = group_spec("ci", name, [parsed(pod)])
    assert spec is not None
    body = build_statefulset(spec, Settings(mode=Mode.PIPELINERUNS))
    return CreateStatefulSet("ci", name, body, RecordEvent("ci", name, "Created", "made"))


async def test_a_placeholder_made_by_an_earlier_look_is_not_restored_nor_announced_again(
    api: MiniApi, client: KubeClient, caplog: pytest.LogCaptureFixture
) -> None:
    """The cache race: a second look at a run before the watch shows its new StatefulSet
    plans the create again; the 409 meets our own, labels intact. Nothing was lost."""
    pod = marked_pod("tekton-taskrun")
    action = _create_action(pod)
    executor = _executor(client)
    await executor.execute(f"ci/{action.name}", [action], None)
    assert api.count("POST", "events") == 1
    with caplog.at_level(logging.DEBUG, logger="coschedule.reconcile"):
        await executor.execute(f"ci/{action.name}", [action], None)
    assert api.count("POST", "statefulsets") == 2  # the second refused: 409
    assert api.count("PATCH", "statefulsets") == 0
    assert api.count("POST", "events") == 1
    assert not [r for r in caplog.records if "lost its labels" in r.getMessage()]
    assert [r for r in caplog.records if "cache is behind" in r.getMessage()]


async def test_a_placeholder_that_lost_a_label_is_still_restored(
    api: MiniApi, client: KubeClient, caplog: pytest.LogCaptureFixture
) -> None:
    pod = marked_pod("tekton-taskrun")
    action = _create_action(pod)
    executor = _executor(client)
    await executor.execute(f"ci/{action.name}", [action], None)
    api.edit(
        "statefulsets",
        "ci",
        action.name,
        {"metadata": {"labels": {"app.kubernetes.io/managed-by": None}}},
    )
    with caplog.at_level(logging.INFO, logger="coschedule.reconcile"):
        await executor.execute(f"ci/{action.name}", [action], None)
    stored = api.get("statefulsets", "ci", action.name)
    assert stored is not None
    assert stored["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "coschedule"
    assert [r for r in caplog.records if "lost its labels" in r.getMessage()]
    assert api.count("POST", "events") == 1


async def test_an_urgent_key_goes_before_the_queued_ones() -> None:
    queue = WorkQueue()
    for key in ("ci/a", "ci/b", "ci/c"):
        queue.add(key)
    queue.add("ci/new", urgent=True)  # a run whose placeholder is still to make
    queue.add("ci/c", urgent=True)  # already queued: moved to the front, not doubled
    got = [await queue.get() for _ in range(4)]
    assert got == ["ci/c", "ci/new", "ci/a", "ci/b"]
    assert len(queue) == 0


async def test_an_urgent_add_while_processing_comes_back_first() -> None:
    queue = WorkQueue()
    queue.add("ci/a")
    key = await queue.get()
    queue.add("ci/b")
    queue.add("ci/a", urgent=True)  # its placeholder pod was bound meanwhile
    queue.done(key)
    assert [await queue.get(), await queue.get()] == ["ci/a", "ci/b"]
