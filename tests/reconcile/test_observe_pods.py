"""What a pass reads of its run's pods (``Controller.observe_pods``) over real HTTP: each
cached version of a pod is parsed once however many passes read it, a pass never reads a
version older than the cache's, and the parses of pods that are gone are not kept."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest

from coschedule.kube.client import KubeClient
from coschedule.marks import BadMark
from coschedule.reconcile import controller as controller_module
from coschedule.reconcile import shapes
from coschedule.reconcile.controller import Controller
from coschedule.reconcile.model import MarkedPod
from tests.reconcile.apiserver import MiniApi
from tests.reconcile.conftest import eventually, placeholder_controller, start
from tests.reconcile.pods import marked_pod, placeholder_of
from tests.reconcile.test_controller import SETTINGS, cached_version


@pytest.fixture
async def controller(api: MiniApi, client: KubeClient) -> AsyncIterator[Controller]:
    # Not leading: the caches fill and nothing acts, so only the pods put here change.
    manager, made = placeholder_controller(client, SETTINGS)
    await start(manager, lead=False)
    yield made
    await manager.stop()


def counting_parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the pods ``shapes.parse_marked`` is called for, from now on."""
    parsed: list[str] = []
    real = shapes.parse_marked

    def counted(obj: Mapping[str, Any]) -> MarkedPod | BadMark:
        parsed.append(str((obj.get("metadata") or {}).get("name")))
        return real(obj)

    monkeypatch.setattr(shapes, "parse_marked", counted)
    return parsed


def by_name(pods: list[MarkedPod]) -> dict[str, MarkedPod]:
    return {pod.name: pod for pod in pods}


async def test_each_version_is_parsed_once_and_a_pass_reads_the_cached_version(
    api: MiniApi, controller: Controller, monkeypatch: pytest.MonkeyPatch
) -> None:
    build = marked_pod("tekton-taskrun", name="build", phase="Pending")
    test = marked_pod("tekton-taskrun", name="test", phase="Pending")
    key = f"ci/{placeholder_of(build)}"
    api.put("pods", build)
    api.put("pods", test)
    await eventually(lambda: len(controller.observe_pods(key)) == 2)
    parsed = counting_parses(monkeypatch)

    first = by_name(controller.observe_pods(key))
    again = by_name(controller.observe_pods(key))
    assert parsed == []  # both read before: no parse
    assert again["build"] is first["build"]
    assert again["test"] is first["test"]

    # The build pod bound and started: a new version in the cache.
    before = cached_version(controller.pods, "ci/build")
    api.edit(
        "pods", "ci", "build", {"spec": {"nodeName": "node-a"}, "status": {"phase": "Running"}}
    )
    await eventually(lambda: cached_version(controller.pods, "ci/build") != before)
    now = by_name(controller.observe_pods(key))
    assert parsed == ["build"]  # only the pod that changed
    assert now["build"].node_name == "node-a"
    assert now["build"].live
    assert now["build"].resource_version == cached_version(controller.pods, "ci/build")
    assert now["build"].resource_version != first["build"].resource_version
    assert now["test"] is first["test"]


async def test_a_deleted_pods_parse_is_dropped_and_the_memo_stays_bounded(
    api: MiniApi, controller: Controller, monkeypatch: pytest.MonkeyPatch
) -> None:
    pods = [marked_pod("tekton-taskrun", name=f"task-{i}", phase="Pending") for i in range(4)]
    key = f"ci/{placeholder_of(pods[0])}"
    for pod in pods:
        api.put("pods", pod)
    await eventually(lambda: len(controller.observe_pods(key)) == 4)
    assert set(controller._parsed) == {f"ci/task-{i}" for i in range(4)}

    api.remove("pods", "ci", "task-0")
    await eventually(lambda: "ci/task-0" not in controller.pods)
    assert "ci/task-0" not in controller._parsed
    assert [p.name for p in controller.observe_pods(key)] != []
    assert "ci/task-0" not in controller._parsed

    # Entries the cache no longer has (a pod gone while no event came) are not kept for
    # ever: the memo never grows past the cache's size and the slack; a parse that would
    # take it there starts it again.
    monkeypatch.setattr(controller_module, "_PARSED_SLACK", 0)
    controller._parsed.update({f"ci/gone-{i}": controller._parsed["ci/task-1"] for i in range(5)})
    before = cached_version(controller.pods, "ci/task-2")
    api.edit("pods", "ci", "task-2", {"status": {"phase": "Running"}})
    await eventually(lambda: cached_version(controller.pods, "ci/task-2") != before)
    parsed = counting_parses(monkeypatch)
    found = by_name(controller.observe_pods(key))
    assert sorted(found) == ["task-1", "task-2", "task-3"]
    assert found["task-2"].resource_version == cached_version(controller.pods, "ci/task-2")
    assert not any(k.startswith("ci/gone-") for k in controller._parsed)
    assert len(controller._parsed) <= len(controller.pods)
    assert "task-2" in parsed
