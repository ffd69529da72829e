"""Smoke test of bench/concurrency.py at a small scale: the synthesized state is what it
claims and the plan over it does what the strategies say (no speed asserted)."""

from __future__ import annotations

from bench import concurrency
from bench.report import concurrency_goals


def test_synthesized_state_and_plan() -> None:
    figures = concurrency.in_process(groups=40, runs_per_group=10, rounds=1)
    assert figures["groups"] == 40
    assert figures["runs"] == 400
    # Per Cancel group (half): the newest (pending) starts, 2 running and 3 older pending runs
    # are cancelled; per Queue group (maxRunning 2, 2 running): nothing starts, and each of its
    # 4 runs pending by us is told, once, why it waits.
    assert figures["actions_in_one_pass"] == 20 * 6 + 20 * 4
    assert figures["plan_us_per_group_median"] > 0
    text = concurrency.render({"in_process": figures, "e2e": {"ran": False, "note": "skipped"}})
    assert "40 / 400" in text
    assert "not measured: skipped" in text


def test_report_goal_without_a_control_plane() -> None:
    (goal,) = concurrency_goals({"results": {"e2e": {"ran": False, "note": "no binaries"}}})
    assert goal.met is None
    assert goal.value == "no binaries"
    (goal,) = concurrency_goals({"results": {"e2e": {"ran": True, "runs": 100, "p99_ms": 80.0}}})
    assert goal.met is True
