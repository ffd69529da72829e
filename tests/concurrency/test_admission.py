"""Run admission: labels per matching control, pending unless the author said otherwise,
and idempotent under reinvocation (the patch applied, then decided again, adds nothing)."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest

from coschedule.concurrency.admission import Outcome, admit_run
from coschedule.concurrency.control import Control, parse_control
from coschedule.concurrency.runs import State, state_of
from coschedule.engines import Kind
from tests.concurrency.runs import control, pipeline_run, workflow

Obj = dict[str, Any]


def controls(*specs: tuple[str, dict[str, Any]]) -> list[Control]:
    return [parse_control(control(name, spec)) for name, spec in specs]


CI = ("ci", {"selector": {}, "strategy": "Cancel", "key": "$(params.branch)"})


def apply(run: Obj, ops: list[Obj]) -> Obj:
    result: Obj = jsonpatch.apply_patch(copy.deepcopy(run), ops)
    return result


def test_a_matching_pipeline_run_is_labelled_and_made_pending() -> None:
    run = pipeline_run("pr-1", params={"branch": "main"})
    decision = admit_run(Kind.PIPELINE_RUN, run, "ci", controls(CI))
    assert decision.outcome is Outcome.MADE_PENDING
    stored = apply(run, decision.ops)
    assert stored["metadata"]["labels"]["concurrency.coschedule.dev/ci"] == "main"
    assert stored["metadata"]["labels"]["coschedule.dev/concurrency"] == "grouped"
    assert stored["metadata"]["annotations"] == {"coschedule.dev/pending-by": "concurrency"}
    assert stored["spec"]["status"] == "PipelineRunPending"
    assert state_of(Kind.PIPELINE_RUN, stored) is State.PENDING_BY_US
    # Everything else is as submitted.
    stored["metadata"]["labels"] = run["metadata"]["labels"]
    del stored["metadata"]["annotations"]
    del stored["spec"]["status"]
    assert stored == run


def test_a_matching_workflow_is_suspended() -> None:
    run = workflow("wf-1", params={"branch": "dev"})
    decision = admit_run(Kind.WORKFLOW, run, "ci", controls(CI))
    stored = apply(run, decision.ops)
    assert stored["spec"]["suspend"] is True
    assert stored["metadata"]["labels"]["concurrency.coschedule.dev/ci"] == "dev"
    assert state_of(Kind.WORKFLOW, stored) is State.PENDING_BY_US


def test_ops_are_hand_built_and_escaped() -> None:
    run = pipeline_run("pr-1", params={"branch": "main"})
    decision = admit_run(Kind.PIPELINE_RUN, run, "ci", controls(CI))
    paths = [op["path"] for op in decision.ops]
    assert "/metadata/labels/concurrency.coschedule.dev~1ci" in paths
    assert "/metadata/labels/coschedule.dev~1concurrency" in paths
    assert "/spec/status" in paths


@pytest.mark.parametrize(
    ("kind", "run"),
    [
        (Kind.PIPELINE_RUN, pipeline_run("pr", params={"branch": "x"})),
        (Kind.WORKFLOW, workflow("wf", params={"branch": "x"})),
        (Kind.PIPELINE_RUN, pipeline_run("pr", params={"branch": "feature/x"})),
        (Kind.PIPELINE_RUN, pipeline_run("pr", status="PipelineRunPending")),
        (Kind.WORKFLOW, workflow("wf", suspend=True)),
    ],
)
def test_reinvocation_adds_nothing(kind: Kind, run: Obj) -> None:
    found = controls(CI, ("other", {"selector": {}, "strategy": "Queue", "key": "x~y/z"}))
    first = admit_run(kind, run, "ci", found)
    stored = apply(run, first.ops)
    again = admit_run(kind, stored, "ci", found)
    assert again.ops == []
    assert again.matches == first.matches


def test_runs_without_labels_or_annotations_maps_get_them_whole() -> None:
    run = pipeline_run("pr")
    del run["metadata"]["labels"]
    del run["spec"]
    decision = admit_run(Kind.PIPELINE_RUN, run, "ci", controls(CI))
    assert decision.ops[0]["path"] == "/metadata/labels"
    stored = apply(run, decision.ops)
    assert stored["spec"] == {"status": "PipelineRunPending"}
    assert stored["metadata"]["labels"]["concurrency.coschedule.dev/ci"] == ""


def test_author_pending_is_grouped_but_not_ours() -> None:
    run = pipeline_run("pr", status="PipelineRunPending", params={"branch": "main"})
    decision = admit_run(Kind.PIPELINE_RUN, run, "ci", controls(CI))
    assert decision.outcome is Outcome.AUTHOR_PENDING
    stored = apply(run, decision.ops)
    assert "annotations" not in stored["metadata"]
    assert stored["metadata"]["labels"]["concurrency.coschedule.dev/ci"] == "main"
    assert state_of(Kind.PIPELINE_RUN, stored) is State.PENDING_BY_AUTHOR


def test_author_suspended_workflow_is_not_ours() -> None:
    decision = admit_run(Kind.WORKFLOW, workflow("wf", suspend=True), "ci", controls(CI))
    assert decision.outcome is Outcome.AUTHOR_PENDING
    assert all(op["path"] != "/spec/suspend" for op in decision.ops)


def test_a_run_created_cancelled_keeps_its_state() -> None:
    decision = admit_run(
        Kind.PIPELINE_RUN, pipeline_run("pr", status="Cancelled"), "ci", controls(CI)
    )
    assert decision.outcome is Outcome.AUTHOR_STATE
    assert all(not op["path"].startswith("/spec") for op in decision.ops)


def test_unmatched_runs_are_untouched() -> None:
    found = controls(("ci", {"selector": {"matchLabels": {"app": "ci"}}, "strategy": "Cancel"}))
    decision = admit_run(Kind.PIPELINE_RUN, pipeline_run("pr"), "ci", found)
    assert decision.outcome is Outcome.UNTOUCHED
    assert decision.ops == []


def test_kinds_limit_a_control() -> None:
    found = controls(("wf-only", {"selector": {}, "strategy": "Cancel", "kinds": ["Workflow"]}))
    assert admit_run(Kind.PIPELINE_RUN, pipeline_run("pr"), "ci", found).ops == []
    assert admit_run(Kind.WORKFLOW, workflow("wf"), "ci", found).ops


def test_an_invalid_label_value_key_is_hashed_and_kept_in_an_annotation() -> None:
    run = pipeline_run("pr", params={"branch": "feature/login"})
    decision = admit_run(Kind.PIPELINE_RUN, run, "ci", controls(CI))
    (match,) = decision.matches
    assert match.hashed
    stored = apply(run, decision.ops)
    assert stored["metadata"]["labels"]["concurrency.coschedule.dev/ci"] == match.value
    assert len(match.value) == 16
    assert stored["metadata"]["annotations"]["concurrency.coschedule.dev/ci"] == "feature/login"


def test_every_matching_control_labels_the_run() -> None:
    found = controls(
        CI,
        (
            "env",
            {"selector": {}, "strategy": "Queue", "key": "$(context.namespace)-$(labels.team)"},
        ),
    )
    run = pipeline_run("pr", params={"branch": "main"}, labels={"team": "blue"})
    stored = apply(run, admit_run(Kind.PIPELINE_RUN, run, "prod", found).ops)
    labels = stored["metadata"]["labels"]
    assert labels["concurrency.coschedule.dev/ci"] == "main"
    assert labels["concurrency.coschedule.dev/env"] == "prod-blue"


def test_a_copied_runs_stale_group_labels_are_dropped() -> None:
    run = pipeline_run(
        "pr",
        params={"branch": "main"},
        labels={"concurrency.coschedule.dev/gone": "x", "concurrency.coschedule.dev/ci": "old"},
    )
    stored = apply(run, admit_run(Kind.PIPELINE_RUN, run, "ci", controls(CI)).ops)
    labels = stored["metadata"]["labels"]
    assert "concurrency.coschedule.dev/gone" not in labels
    assert labels["concurrency.coschedule.dev/ci"] == "main"


# ---- runs the admission policy held first (coschedule-hold-runs) ----------------------

POLICY_MARKS = {
    "coschedule.dev/held-by": "admission-policy",
    "coschedule.dev/pending-by": "concurrency",
}


def policy_held_run(kind: Kind, name: str, params: dict[str, str]) -> Obj:
    """The run as the policy stores it (what its CEL patch adds; the e2e suite checks the
    real policy does exactly this)."""
    if kind is Kind.PIPELINE_RUN:
        run = pipeline_run(name, params=params, status="PipelineRunPending")
    else:
        run = workflow(name, params=params, suspend=True)
    run["metadata"]["labels"]["coschedule.dev/concurrency"] = "grouped"
    run["metadata"]["annotations"] = dict(POLICY_MARKS)
    return run


@pytest.mark.parametrize("kind", [Kind.PIPELINE_RUN, Kind.WORKFLOW])
def test_a_policy_held_run_a_control_selects_stays_pending_and_is_labelled(kind: Kind) -> None:
    run = policy_held_run(kind, "held", {"branch": "main"})
    decision = admit_run(kind, run, "ci", controls(CI))
    assert decision.outcome is Outcome.ALREADY_PENDING
    stored = apply(run, decision.ops)
    assert stored["metadata"]["labels"]["concurrency.coschedule.dev/ci"] == "main"
    assert stored["metadata"]["annotations"] == {"coschedule.dev/pending-by": "concurrency"}
    assert state_of(kind, stored) is State.PENDING_BY_US
    # As if the webhook alone had admitted it.
    plain = (
        pipeline_run("held", params={"branch": "main"})
        if kind is Kind.PIPELINE_RUN
        else (workflow("held", params={"branch": "main"}))
    )
    assert stored == apply(plain, admit_run(kind, plain, "ci", controls(CI)).ops)
    assert admit_run(kind, stored, "ci", controls(CI)).ops == []  # reinvoked: nothing


@pytest.mark.parametrize("kind", [Kind.PIPELINE_RUN, Kind.WORKFLOW])
def test_a_policy_held_run_no_control_selects_is_started_as_submitted(kind: Kind) -> None:
    run = policy_held_run(kind, "free", {"branch": "main"})
    only_deploys = (
        "deploys",
        {"selector": {"matchLabels": {"team": "x"}}, "strategy": "Queue", "key": "k"},
    )
    decision = admit_run(kind, run, "ci", controls(only_deploys))
    assert decision.outcome is Outcome.RELEASED
    stored = apply(run, decision.ops)
    submitted = (
        pipeline_run("free", params={"branch": "main"})
        if kind is Kind.PIPELINE_RUN
        else workflow("free", params={"branch": "main"})
    )
    submitted["metadata"]["annotations"] = {}
    assert stored == submitted
    assert state_of(kind, stored) is not State.PENDING_BY_US


def test_an_author_pending_run_the_policy_marked_stays_the_authors() -> None:
    run = pipeline_run("mine", status="PipelineRunPending")
    run["metadata"]["labels"]["coschedule.dev/concurrency"] = "grouped"
    run["metadata"]["annotations"] = {"coschedule.dev/held-by": "admission-policy"}
    stored = apply(run, admit_run(Kind.PIPELINE_RUN, run, "ci", []).ops)
    assert stored["spec"]["status"] == "PipelineRunPending"  # its author's: kept
    assert "coschedule.dev/concurrency" not in stored["metadata"]["labels"]


QUEUE_BY_PRIORITY = (
    "deploy",
    {"selector": {}, "strategy": "Queue", "key": "prod", "priority": "$(labels.priority)"},
)


@pytest.mark.parametrize(
    ("label", "written"), [("10", "10"), (" -3 ", "-3"), ("high", "0"), (None, "0")]
)
def test_a_queue_with_a_priority_writes_the_runs_priority(label: str | None, written: str) -> None:
    labels = {"priority": label} if label is not None else {}
    run = pipeline_run("pr-1", labels=labels)
    decision = admit_run(Kind.PIPELINE_RUN, run, "ci", controls(QUEUE_BY_PRIORITY, CI))
    stored = apply(run, decision.ops)
    assert stored["metadata"]["annotations"]["priority.coschedule.dev/deploy"] == written
    # Only the control with a priority writes one.
    assert "priority.coschedule.dev/ci" not in stored["metadata"]["annotations"]
    # Reinvoked: nothing to add.
    assert admit_run(Kind.PIPELINE_RUN, stored, "ci", controls(QUEUE_BY_PRIORITY, CI)).ops == []


def test_a_priority_the_run_already_carries_is_kept() -> None:
    run = pipeline_run(
        "pr-1", labels={"priority": "1"}, annotations={"priority.coschedule.dev/deploy": "7"}
    )
    stored = apply(run, admit_run(Kind.PIPELINE_RUN, run, "ci", controls(QUEUE_BY_PRIORITY)).ops)
    assert stored["metadata"]["annotations"]["priority.coschedule.dev/deploy"] == "7"


KUEUE = {"kueue.x-k8s.io/queue-name": "team-a"}


def test_a_run_kueue_admits_is_not_selected_unless_the_control_says_so() -> None:
    run = pipeline_run("pr-1", params={"branch": "main"}, labels=KUEUE)
    decision = admit_run(Kind.PIPELINE_RUN, run, "ci", controls(CI))
    assert decision.outcome is Outcome.UNTOUCHED
    assert decision.ops == []
    # Without the label the same control holds it.
    plain = pipeline_run("pr-2", params={"branch": "main"})
    assert admit_run(Kind.PIPELINE_RUN, plain, "ci", controls(CI)).outcome is Outcome.MADE_PENDING


def test_kueue_group_labels_the_run_but_leaves_holding_it_to_kueue() -> None:
    grouped = ("ci", {**CI[1], "kueue": "Group"})
    run = pipeline_run("pr-1", params={"branch": "main"}, labels=KUEUE)
    decision = admit_run(Kind.PIPELINE_RUN, run, "ci", controls(grouped))
    assert decision.outcome is Outcome.KUEUE
    stored = apply(run, decision.ops)
    assert stored["metadata"]["labels"]["concurrency.coschedule.dev/ci"] == "main"
    assert "status" not in stored["spec"]
    assert "coschedule.dev/pending-by" not in (stored["metadata"].get("annotations") or {})
    # tekton-kueue made it pending first: pending by its "author", never started by us.
    held = pipeline_run(
        "pr-2", params={"branch": "main"}, labels=KUEUE, status="PipelineRunPending"
    )
    decision = admit_run(Kind.PIPELINE_RUN, held, "ci", controls(grouped))
    assert decision.outcome is Outcome.AUTHOR_PENDING
    assert state_of(Kind.PIPELINE_RUN, apply(held, decision.ops)) is State.PENDING_BY_AUTHOR


def test_kueue_hold_holds_the_run_only_when_every_selecting_control_says_so() -> None:
    hold = ("ci", {**CI[1], "kueue": "Hold"})
    group = ("q", {"selector": {}, "strategy": "Queue", "kueue": "Group"})
    run = pipeline_run("pr-1", params={"branch": "main"}, labels=KUEUE)
    assert admit_run(Kind.PIPELINE_RUN, run, "ci", controls(hold)).outcome is Outcome.MADE_PENDING
    decision = admit_run(Kind.PIPELINE_RUN, run, "ci", controls(hold, group))
    assert decision.outcome is Outcome.KUEUE


def test_a_run_kueue_admits_that_the_policy_held_is_left_to_kueue() -> None:
    """The admission policy holds every run of a namespace with a control (it cannot read
    the control's kueue field); the webhook, or the reconciler in its stead, hands a run
    Kueue admits back as submitted, grouped only."""
    grouped = ("ci", {**CI[1], "kueue": "Group"})
    run = policy_held_run(Kind.PIPELINE_RUN, "pr-1", {"branch": "main"})
    run["metadata"]["labels"].update(KUEUE)
    decision = admit_run(Kind.PIPELINE_RUN, run, "ci", controls(grouped))
    assert decision.outcome is Outcome.KUEUE
    stored = apply(run, decision.ops)
    assert "status" not in stored["spec"]
    assert stored["metadata"]["annotations"] == {}
    assert stored["metadata"]["labels"]["concurrency.coschedule.dev/ci"] == "main"
    assert state_of(Kind.PIPELINE_RUN, stored) is not State.PENDING_BY_US
    # A control that says kueue: Hold keeps the policy's hold.
    hold = ("ci", {**CI[1], "kueue": "Hold"})
    again = policy_held_run(Kind.PIPELINE_RUN, "pr-2", {"branch": "main"})
    again["metadata"]["labels"].update(KUEUE)
    kept = admit_run(Kind.PIPELINE_RUN, again, "ci", controls(hold))
    assert kept.outcome is Outcome.ALREADY_PENDING
    assert state_of(Kind.PIPELINE_RUN, apply(again, kept.ops)) is State.PENDING_BY_US
