"""When a run's pod is worth holding at admission until its placeholder is bound: the
decision marks a pod held only because its placeholder is not bound yet (``unbound``), and
``bind_wait.on_its_way`` says whether that placeholder is likely to be bound soon. Pure."""

from __future__ import annotations

from typing import Any

import pytest

from coschedule.config.settings import Settings
from coschedule.marks import ANNOTATION_RUN_ADMITTED, LABEL_MODE, Mode, Placement
from coschedule.mutate.bind_wait import (
    ON_ITS_WAY_SECONDS,
    PendingPod,
    PlaceholderProgress,
    admitted_op,
    generated_prefix,
    on_its_way,
    run_admitted,
    seedable_run,
    seeded_mode,
    seeded_run,
)
from coschedule.reconcile import run_seed
from tests.fixtures import load_pod
from tests.mutate.test_placement import (
    TEKTON,
    Placeholders,
    admit,
    context,
    gates,
    policy_gated,
)

NOW = 1_800_000_000.0


def pod(age: float | None, unschedulable: bool = False) -> PendingPod:
    return PendingPod(None if age is None else NOW - age, unschedulable)


@pytest.mark.parametrize(
    ("progress", "worth"),
    [
        # Nothing seen: the reconciler has not made the placeholder (a held run, or not yet).
        (PlaceholderProgress(), False),
        # The StatefulSet made a moment ago, its pod not yet: kube-controller-manager's turn.
        (PlaceholderProgress(NOW - 0.4), True),
        (PlaceholderProgress(NOW + 0.5), True),  # the API server's clock a little ahead
        (PlaceholderProgress(NOW - ON_ITS_WAY_SECONDS), True),
        # Made long ago and still no pod: no controller makes it (or a quota refuses it).
        (PlaceholderProgress(NOW - ON_ITS_WAY_SECONDS - 0.1), False),
        # Its pod made a moment ago, not bound yet: kube-scheduler's turn.
        (PlaceholderProgress(NOW - 60, (pod(0.2),)), True),
        # The scheduler said it cannot place it: nothing will bind it soon.
        (PlaceholderProgress(NOW - 0.5, (pod(0.3, unschedulable=True),)), False),
        # Unbound for longer than a placeholder takes: waiting for a node, not coming.
        (PlaceholderProgress(NOW - 1, (pod(ON_ITS_WAY_SECONDS + 1),)), False),
        (PlaceholderProgress(NOW - 1, (pod(None),)), False),  # no readable creation time
        # The StatefulSet's new pod beside an old one that cannot be placed: the new decides.
        (PlaceholderProgress(NOW - 60, (pod(40, unschedulable=True), pod(0.1))), True),
    ],
)
def test_a_placeholder_is_on_its_way_when_made_a_moment_ago_and_not_unschedulable(
    progress: PlaceholderProgress, worth: bool
) -> None:
    assert on_its_way(progress, NOW) is worth


@pytest.mark.parametrize(
    ("progress", "worth"),
    [
        # Nothing of the placeholder seen, but its run admitted a moment ago: the reconciler
        # makes the StatefulSet 0.1-0.3 s after the run.
        (PlaceholderProgress(run_admitted=NOW - 0.1), True),
        (PlaceholderProgress(run_admitted=NOW - ON_ITS_WAY_SECONDS), True),
        # Admitted longer ago and still nothing: the reconciler did not seed it.
        (PlaceholderProgress(run_admitted=NOW - ON_ITS_WAY_SECONDS - 0.1), False),
        # Once the StatefulSet or its pod is seen, they decide, not the run.
        (PlaceholderProgress(NOW - 60, run_admitted=NOW - 0.1), False),
        (PlaceholderProgress(None, (pod(0.1, unschedulable=True),), NOW - 0.2), False),
        (PlaceholderProgress(None, (pod(0.1),), NOW - 60), True),
    ],
)
def test_a_run_admitted_a_moment_ago_puts_its_unseen_placeholder_on_its_way(
    progress: PlaceholderProgress, worth: bool
) -> None:
    assert on_its_way(progress, NOW) is worth


TEKTON_LABELS = {"tekton.dev/pipelineRun": "pr-7f3k2", "tekton.dev/taskRun": "pr-7f3k2-build"}


@pytest.mark.parametrize(
    ("mode", "labels", "rewrite_claims", "run"),
    [
        (Mode.PIPELINERUNS, TEKTON_LABELS, False, "pr-7f3k2"),
        (Mode.ISOLATE_PIPELINERUN, TEKTON_LABELS, False, "pr-7f3k2"),
        # A claim's placeholder (workspaces) is never seeded from the run.
        (Mode.WORKSPACES, TEKTON_LABELS, False, None),
        (None, TEKTON_LABELS, False, None),
        # rewrite-claims: the placeholder's templates wait for the first pod.
        (Mode.PIPELINERUNS, TEKTON_LABELS, True, None),
        # Argo, Shipwright, a Job: their runs are not seeded.
        (Mode.PIPELINERUNS, {"workflows.argoproj.io/workflow": "wf-1"}, False, None),
        (Mode.PIPELINERUNS, {"tekton.dev/taskRun": "tr-1"}, False, None),
    ],
)
def test_only_a_pipelineruns_pod_in_a_per_run_mode_has_a_seeded_run(
    mode: Mode | None, labels: dict[str, str], rewrite_claims: bool, run: str | None
) -> None:
    assert seeded_run(mode, labels, rewrite_claims) == run


def _task_template(template: dict[str, Any]) -> dict[str, Any]:
    return {"taskRunSpecs": [{"pipelineTaskName": "a", "podTemplate": template}]}


@pytest.mark.parametrize(
    ("spec", "started", "seedable"),
    [
        ({"pipelineRef": {"name": "build"}}, False, True),
        ({"status": "PipelineRunPending"}, False, False),  # held: no seed until started
        ({"status": "PipelineRunPending"}, True, True),  # the hold lifted at admission
        ({"taskRunSpecs": [{"pipelineTaskName": "a", "serviceAccountName": "x"}]}, False, True),
        # A task's own placement: which task comes first decides the constraints.
        (_task_template({"nodeSelector": {"a": "b"}}), False, False),
        (_task_template({"tolerations": [{"operator": "Exists"}]}), False, False),
        # A task's podTemplate that places nothing: its pods go where the others do.
        (_task_template({"securityContext": {"runAsNonRoot": True}}), False, True),
        (_task_template({"nodeSelector": {}}), False, True),
        (None, False, False),
    ],
)
def test_a_run_is_seedable_when_started_and_without_per_task_placement(
    spec: object, started: bool, seedable: bool
) -> None:
    run = {"metadata": {"name": "pr"}, "spec": spec}
    assert seedable_run(run, started) is seedable
    if isinstance(spec, dict) and not started:
        # The reconciler's seed reads the run alike: the webhook waits for what it seeds.
        assert run_seed.candidate(run_seed.slim_run(run)) is seedable


@pytest.mark.parametrize(
    ("name", "prefix"),
    [("pr-x7k2q", "pr-"), ("build-run-abcde", "build-run-"), ("abcde", ""), ("ab", "")],
)
def test_a_generated_name_is_its_prefix_and_five_characters(name: str, prefix: str) -> None:
    assert generated_prefix(name) == prefix


def test_how_young_is_a_parameter() -> None:
    progress = PlaceholderProgress(NOW - 3)
    assert on_its_way(progress, NOW, young=5)
    assert not on_its_way(progress, NOW, young=2)


@pytest.mark.parametrize("name", TEKTON)
def test_a_first_admission_held_only_because_the_placeholder_is_unbound_is_marked(
    name: str,
) -> None:
    view = Placeholders()
    decision, patched = admit(load_pod(name), context(view))
    assert decision.held
    assert decision.unbound
    # Bound by the time it is decided again: pinned, nothing to wait for.
    assert decision.placeholder is not None
    view.nodes[("ci", decision.placeholder)] = "node-a"
    pinned, _ = admit(load_pod(name), context(view))
    assert pinned.by_node_name
    assert not pinned.unbound
    assert not pinned.held
    # Reinvoked on its own gated output: stays as decided, never waits again.
    again, same = admit(patched, context(view))
    assert again.held
    assert not again.unbound
    assert same == patched


def test_a_pod_the_admission_policy_gated_may_wait_too() -> None:
    decision, patched = admit(policy_gated(load_pod("tekton-taskrun")), context(Placeholders()))
    assert decision.held
    assert decision.unbound
    assert gates(patched) == [{"name": "coschedule.dev/placeholder"}]


def test_without_a_cluster_view_nothing_is_waited_for() -> None:
    decision, _ = admit(load_pod("tekton-taskrun"), context(None))
    assert decision.held
    assert not decision.unbound


@pytest.mark.parametrize(
    ("name", "placement", "mode"),
    [
        ("argo-workflow-pod", Placement.AUTO, Mode.PIPELINERUNS),  # keeps pod affinity
        ("tekton-taskrun", Placement.POD_AFFINITY, Mode.PIPELINERUNS),
    ],
)
def test_pods_not_placed_by_node_name_never_wait(
    name: str, placement: Placement, mode: Mode
) -> None:
    decision, _ = admit(load_pod(name), context(Placeholders(), placement=placement, mode=mode))
    assert not decision.by_node_name
    assert not decision.unbound


# ---- the run's stamp: what every replica reads on the run's first pod ----------------


def test_the_stamp_goes_into_the_annotations_as_they_will_be() -> None:
    now = 1_795_000_000.25
    stamp = "2026-11-18T11:06:40.250000Z"
    bare = {"metadata": {"name": "pr"}}
    assert admitted_op(bare, [], now) == {
        "op": "add",
        "path": "/metadata/annotations",
        "value": {ANNOTATION_RUN_ADMITTED: stamp},
    }
    # Another op of the admission made the map (a control's notes): one key, not the map.
    made = [{"op": "add", "path": "/metadata/annotations", "value": {"a": "b"}}]
    key = "/metadata/annotations/coschedule.dev~1run-admitted-at"
    assert admitted_op(bare, made, now) == {"op": "add", "path": key, "value": stamp}
    annotated = {"metadata": {"name": "pr", "annotations": {"team": "x"}}}
    op = admitted_op(annotated, [], now)
    assert op is not None
    assert op["path"] == key
    # Reinvoked a moment later: stamped already, the patch stays the same. A copied run's
    # stamp of long ago is replaced.
    stamped = {"metadata": {"name": "pr", "annotations": {ANNOTATION_RUN_ADMITTED: op["value"]}}}
    assert admitted_op(stamped, [], now + 0.4) is None
    assert admitted_op(stamped, [], now + 3600) == {
        "op": "add",
        "path": key,
        "value": "2026-11-18T12:06:40.250000Z",
    }
    # The pod reads back what the run was stamped with (copied by its engine).
    assert run_admitted({ANNOTATION_RUN_ADMITTED: op["value"]}) == pytest.approx(now)
    assert run_admitted({}) is None
    assert run_admitted({ANNOTATION_RUN_ADMITTED: "yesterday"}) is None


@pytest.mark.parametrize(
    ("run_labels", "namespace_labels", "settings", "stamped"),
    [
        ({}, {}, Settings(mode=Mode.PIPELINERUNS), True),
        ({}, {LABEL_MODE: "isolate-pipelinerun"}, Settings(mode=Mode.WORKSPACES), True),
        ({LABEL_MODE: "pipelineruns"}, {LABEL_MODE: "disabled"}, Settings(), True),
        ({}, {LABEL_MODE: "workspaces"}, Settings(mode=Mode.PIPELINERUNS), False),
        ({LABEL_MODE: "disabled"}, {}, Settings(mode=Mode.PIPELINERUNS), False),
        ({LABEL_MODE: "bogus"}, {}, Settings(mode=Mode.PIPELINERUNS), False),
        ({}, {}, Settings(mode=Mode.PIPELINERUNS, rewrite_claims=True), False),
    ],
)
def test_a_run_is_stamped_when_its_pods_get_a_seeded_placeholder(
    run_labels: dict[str, str],
    namespace_labels: dict[str, str],
    settings: Settings,
    stamped: bool,
) -> None:
    """The mode its pods get (their labels are the run's: Tekton copies them), as the pod
    side's ``seeded_run`` reads it."""
    run = {"metadata": {"name": "pr", "labels": run_labels}}
    assert seeded_mode(run, namespace_labels, settings) is stamped
