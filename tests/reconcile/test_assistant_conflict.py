"""Tekton's own Affinity Assistant on as well: a TaskRun pod pinned to Tekton's placeholder
and to ours. The decision (pure: observed group -> reports), and the controller carrying it
out over HTTP: one Warning Event on the pod and one on its PipelineRun, each once, however
often the group is looked at, and the metric."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from coschedule.config.settings import Settings
from coschedule.marks import Mode
from coschedule.reconcile import shapes
from coschedule.reconcile.assistant_conflict import REASON, plan_assistant_conflict
from coschedule.reconcile.model import OwnerRef, OwnerState, OwnerStatus, ReportAssistantConflict
from coschedule.reconcile.plan import plan
from tests.reconcile.apiserver import MiniApi
from tests.reconcile.conftest import eventually
from tests.reconcile.pods import marked_pod, parsed, placeholder_of
from tests.reconcile.test_controller import PIPELINERUN_UID, metric
from tests.reconcile.test_controller import make as make  # the fixture
from tests.reconcile.test_plan import observed_for

# What Tekton names its assistant for the run's workspace and puts on the TaskRun's pod
# (pkg/internal/affinityassistant/transformer.go): a required term of the same shape as ours.
TEKTON_ASSISTANT = "affinity-assistant-8d2a09c4b1"
CONFLICTS = "coschedule_tekton_assistant_conflicts_total"


def tekton_term(instance: str = TEKTON_ASSISTANT) -> dict[str, Any]:
    return {
        "labelSelector": {
            "matchLabels": {
                "app.kubernetes.io/instance": instance,
                "app.kubernetes.io/component": "affinity-assistant",
            }
        },
        "topologyKey": "kubernetes.io/hostname",
    }


def pinned_by_tekton(pod: dict[str, Any]) -> None:
    """What Tekton's pod transformer does when its assistant is on."""
    pod["metadata"]["annotations"]["pipeline.tekton.dev/affinity-assistant"] = TEKTON_ASSISTANT
    pod["spec"]["affinity"] = {
        "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [tekton_term()]}
    }


def tekton_pod(mode: Mode = Mode.PIPELINERUNS, **kwargs: Any) -> dict[str, Any]:
    return marked_pod("tekton-taskrun", mode, before=pinned_by_tekton, **kwargs)


RUN_ROOT = OwnerRef("tekton.dev/v1", "PipelineRun", "pr-7f3k2", PIPELINERUN_UID)


def reports(**kwargs: Any) -> list[ReportAssistantConflict]:
    pods = kwargs.pop("pods")
    found = plan_assistant_conflict(observed_for(*pods, **kwargs)).actions
    assert all(isinstance(a, ReportAssistantConflict) for a in found)
    return list(found)  # type: ignore[arg-type]


def test_a_pod_pinned_by_both_is_reported_on_the_pod_and_on_its_run() -> None:
    pod = tekton_pod()
    ours = placeholder_of(pod)
    assert ours != TEKTON_ASSISTANT
    owner = OwnerState(RUN_ROOT, OwnerStatus.RUNNING)
    on_pod, on_run = reports(pods=[pod], owner=owner)
    assert on_pod.subject == f"pod {pod['metadata']['uid']}"
    assert on_pod.assistants == (TEKTON_ASSISTANT,)
    for report in (on_pod, on_run):
        assert report.event.reason == REASON
        assert report.event.type == "Warning"
        assert ours in report.event.message
        assert TEKTON_ASSISTANT in report.event.message
        assert "coschedule: disabled" in report.event.message
    assert on_pod.event.involved == OwnerRef(
        "v1", "Pod", pod["metadata"]["name"], pod["metadata"]["uid"]
    )
    assert on_run.subject == "run PipelineRun/pr-7f3k2"
    assert on_run.event.involved == RUN_ROOT  # the resolved root, with its uid


def test_in_workspaces_mode_the_run_is_named_by_its_label() -> None:
    """A claim's group has no owner of its own: the run comes from the pod's run label."""
    pod = tekton_pod(Mode.WORKSPACES)
    _, on_run = reports(pods=[pod])
    assert on_run.event.involved == OwnerRef("tekton.dev/v1", "PipelineRun", "pr-7f3k2", "")


def test_each_pod_once_and_the_run_once() -> None:
    first, second = tekton_pod(name="build-pod"), tekton_pod(name="test-pod")
    found = reports(pods=[first, second])
    assert [r.subject for r in found] == [
        "pod uid-build-pod",
        "run PipelineRun/pr-7f3k2",
        "pod uid-test-pod",
    ]


def test_nothing_to_report() -> None:
    # Our own term only (Tekton's assistant off), a finished pod, and a pod whose own
    # required terms are not an assistant's.
    assert reports(pods=[marked_pod("tekton-taskrun")]) == []
    assert reports(pods=[tekton_pod(phase="Succeeded")]) == []

    def own_affinity(pod: dict[str, Any]) -> None:
        term = tekton_term()
        term["labelSelector"]["matchLabels"] = {"app": "cache"}
        pod["spec"]["affinity"] = {
            "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}
        }

    users = marked_pod("tekton-taskrun", Mode.PIPELINERUNS, before=own_affinity)
    assert reports(pods=[users]) == []


def test_the_cache_keeps_only_the_other_placeholders() -> None:
    pod = tekton_pod()
    slim = shapes.slim_marked_pod(pod)
    assert slim["spec"]["otherAssistants"] == [TEKTON_ASSISTANT]
    assert "affinity" not in slim["spec"]  # the cache keeps names, not the affinity
    assert parsed(pod).other_assistants == (TEKTON_ASSISTANT,)
    assert "otherAssistants" not in shapes.slim_marked_pod(marked_pod("tekton-taskrun"))["spec"]


def test_the_placeholder_plan_is_unchanged_by_the_conflict() -> None:
    """The report is told beside the placeholder's own plan, which it does not change."""
    owner = OwnerState(RUN_ROOT, OwnerStatus.RUNNING)
    settings = Settings(mode=Mode.PIPELINERUNS)
    with_conflict = plan(observed_for(tekton_pod(), owner=owner), settings, 0.0)
    without = plan(observed_for(marked_pod("tekton-taskrun"), owner=owner), settings, 0.0)
    assert with_conflict == without


async def test_the_reconciler_tells_the_pod_and_the_run_once(
    api: MiniApi, make: Callable[..., Any]
) -> None:
    controller = await make()
    pod = tekton_pod()
    api.put("pods", pod)

    def conflict_events() -> list[dict[str, Any]]:
        return [
            obj
            for (plural, _, _), obj in api.objects.items()
            if plural == "events" and obj["reason"] == REASON
        ]

    await eventually(lambda: len(conflict_events()) == 2)
    kinds = sorted(
        (e["involvedObject"]["kind"], e["involvedObject"]["name"]) for e in conflict_events()
    )
    assert kinds == [("PipelineRun", "pr-7f3k2"), ("Pod", pod["metadata"]["name"])]
    assert all(e["type"] == "Warning" for e in conflict_events())
    assert metric(controller, CONFLICTS) == 1
    # Looked at again (the pod changes, the group is resynced): nothing told twice.
    for n in range(3):
        api.edit("pods", "ci", pod["metadata"]["name"], {"metadata": {"labels": {"n": str(n)}}})
        await asyncio.sleep(0.1)
    assert len(conflict_events()) == 2
    assert metric(controller, CONFLICTS) == 1
    # A second pod of the run: told on the pod, not again on the run.
    api.put("pods", tekton_pod(name="pr-7f3k2-test-pod"))
    await eventually(lambda: len(conflict_events()) == 3)
    await asyncio.sleep(0.2)
    assert len(conflict_events()) == 3
    assert metric(controller, CONFLICTS) == 2
