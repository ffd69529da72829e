"""``coschedule explain --run KIND/NAME``: the report over observed runs (the cluster part runs
in the e2e suite), and the run reference."""

from __future__ import annotations

import dataclasses

import orjson
import pytest

from coschedule.cli.explain_live import live_report, parse_run_ref, render_live_text
from coschedule.cli.main import main
from coschedule.concurrency.plan import Group, GroupKey
from coschedule.engines import Kind
from tests.concurrency.test_plan import WAITING, ctl, pending_pr, pr

KEY = GroupKey("ci", "deploy", "prod")


def test_run_references() -> None:
    assert parse_run_ref("pipelinerun/a") == (Kind.PIPELINE_RUN, "a")
    assert parse_run_ref("PipelineRuns/a") == (Kind.PIPELINE_RUN, "a")
    assert parse_run_ref("wf/b") == (Kind.WORKFLOW, "b")
    for bad in ("pipelinerun", "pod/a", "workflow/"):
        with pytest.raises(ValueError, match="write pipelinerun/NAME or workflow/NAME"):
            parse_run_ref(bad)


def test_a_held_run_shows_its_place_its_group_and_that_its_reason_is_not_written_yet() -> None:
    prod = {"deploy": "prod"}
    running = pr("deploy-7x2", 0, groups=prod)
    held = pending_pr("deploy-8a1", 1, groups=prod)
    control = ctl("deploy", strategy="Queue", key="prod")
    groups = {KEY: Group(KEY, control, (running, held))}
    report = live_report(held, [control, ctl("other")], groups)
    why = (
        "waiting: 2nd in queue for key prod of ConcurrencyControl deploy, behind deploy-7x2, "
        "which is running (1 may run at once)"
    )
    assert report["state"] == "pending by coschedule"
    assert report["waiting"] == why
    assert report["annotation"] is None
    (row,) = report["groups"]
    assert (row["control"], row["strategy"], row["running"], row["pending"]) == (
        "deploy",
        "Queue",
        1,
        1,
    )
    assert row["next"] == ["tell deploy-8a1 why it waits"]
    assert report["otherControls"] == ["other"]
    text = render_live_text(report)
    assert f"why:      {why}" in text
    assert "not on the run yet" in text
    assert "1 running, 1 pending" in text
    # Once the reconciler wrote it, the report says nothing is left to do.
    assert report["waitingData"] == {
        "control": "deploy",
        "key": "prod",
        "strategy": "Queue",
        "maxRunning": 1,
        "position": 2,
        "ahead": [{"kind": "PipelineRun", "name": "deploy-7x2", "state": "running"}],
    }
    data = orjson.dumps(report["waitingData"], option=orjson.OPT_SORT_KEYS).decode()
    notes = {**held.annotations, WAITING: why, "coschedule.dev/waiting-data": data}
    written = dataclasses.replace(held, annotations=notes)
    groups = {KEY: Group(KEY, control, (running, written))}
    text = render_live_text(live_report(written, [control], groups))
    assert "not on the run yet" not in text
    assert "next look: nothing to do" in text


def test_a_run_whose_control_is_gone_starts_on_the_next_look() -> None:
    held = pending_pr("a", 1, groups={"deploy": "prod"})
    report = live_report(held, [], {KEY: Group(KEY, None, (held,))})
    assert report["waiting"] is None
    (row,) = report["groups"]
    assert row["control_state"] == "gone: its runs pending by us start"
    assert row["next"] == ["start a: ConcurrencyControl deploy no longer exists"]


def test_run_and_file_are_one_or_the_other(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "--run", "pipelinerun/a", "-f", "x.yaml"]) == 2
    assert "give -f FILE, or --run KIND/NAME" in capsys.readouterr().err
    assert main(["explain"]) == 2
    assert "give -f FILE, or --run KIND/NAME" in capsys.readouterr().err
