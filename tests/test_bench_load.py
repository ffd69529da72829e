"""The pure parts of ``bench.load`` (``make bench-load``): what makes a run a failure, and
when the stack's logs are kept (a run that broke an invariant, failed or raised keeps them;
a clean one does not, unless asked). No stack here: the benchmark runs on the real stack,
as root."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench import load
from tests.real.load import NodeLoss, Outcome, Record

SUCCEEDED = ("True", "Succeeded")
FAILED = ("False", "Failed")


def outcome(
    records: dict[str, Record] | None = None,
    broken: list[str] | None = None,
    left: dict[str, list[str]] | None = None,
    node_loss: NodeLoss | None = None,
) -> Outcome:
    """An outcome with only what ``problems`` reads set; the rest as a quiet run leaves it."""
    runs = records or {
        "load-on/r1": Record("on", 1.0, verdict=SUCCEEDED),
        "load-off/r2": Record("off", 2.0, verdict=SUCCEEDED),
    }
    none: Any = None
    return Outcome(
        records=runs,
        namespaces={},
        broken=broken or [],
        watch_errors=[],
        looks=10,
        most_running_in={},
        held=0,
        create_seconds=60.0,
        drain_seconds=5.0,
        takeover=none,
        takeover_next_start=None,
        api_restart=none,
        api_first_verdict=None,
        etcd_recovery=None,
        webhook_kill=none,
        node_loss=node_loss,
        recoveries={},
        cpu={},
        rss_max={},
        requests=0.0,
        idle_requests_per_s=0.0,
        left=left or {},
        lease_holders=[],
    )


def test_a_clean_run_has_no_problem_and_its_logs_go() -> None:
    found = load.problems(outcome(left={"placeholders": []}))  # an empty list left: nothing
    assert found == []
    assert load.why_keep_logs(found, finished=True, asked=False) is None


def test_a_clean_run_keeps_its_logs_when_asked() -> None:
    assert load.why_keep_logs([], finished=True, asked=True) == "--keep-logs"


def test_a_broken_invariant_keeps_the_logs_and_says_why() -> None:
    found = load.problems(outcome(broken=["two nodes for run load-on/r1"]))
    assert found == ["invariant broke: two nodes for run load-on/r1"]
    why = load.why_keep_logs(found, finished=True, asked=False)
    assert why == "invariant broke: two nodes for run load-on/r1"


def test_a_run_that_raised_keeps_the_logs() -> None:
    assert load.why_keep_logs([], finished=False, asked=False) == "the run did not finish"


def test_failed_runs_and_leftovers_are_problems_but_not_the_dead_nodes_or_the_plain_lanes() -> None:
    records = {
        "load-on/ok": Record("on", 1.0, verdict=SUCCEEDED),
        "load-on/failed": Record("on", 1.0, verdict=FAILED),
        "load-queue/never": Record("queue", 1.0),  # no verdict at all
        "load-on/on-dead-node": Record("on", 1.0, verdict=FAILED),
        "load-off/failed": Record("off", 1.0, verdict=FAILED),  # without coschedule
    }
    lost = NodeLoss("node-b", ["load-on/on-dead-node"], 1.0, 2.0, 3.0, 4.0)
    found = load.problems(
        outcome(records, left={"placeholders": ["load-on/x"], "claims": []}, node_loss=lost)
    )
    assert found == [
        "coscheduled runs not Succeeded: load-on/failed, load-queue/never",
        "left behind: {'placeholders': ['load-on/x']}",
    ]
    why = load.why_keep_logs(found, finished=True, asked=False)
    assert why == f"{found[0]} (and 1 more)"


def test_the_stacks_log_folders_are_tekton_and_every_nodes_now_and_before(tmp_path: Path) -> None:
    for folder in ("tekton/logs", "nodes/n1/logs", "nodes/n2/logs", "nodes/n2/logs.prev"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "nodes/n1/podlogs").mkdir()  # the pods' own: left
    assert load.stack_logs(tmp_path) == {
        "tekton": tmp_path / "tekton/logs",
        "nodes/n1/logs": tmp_path / "nodes/n1/logs",
        "nodes/n2/logs": tmp_path / "nodes/n2/logs",
        "nodes/n2/logs.prev": tmp_path / "nodes/n2/logs.prev",
    }


def test_saved_logs_are_copied_whole_and_missing_folders_skipped(tmp_path: Path) -> None:
    source = tmp_path / "stack" / "logs"
    (source / "sub").mkdir(parents=True)
    (source / "coschedule-reconcile-0.log").write_text("invariant evidence\n")
    (source / "sub" / "etcd.log").write_text("etcd\n")
    dest = tmp_path / "kept"
    made = load.save_logs({"processes": source, "tekton": tmp_path / "absent"}, dest)
    assert made == [dest / "processes"]
    assert (dest / "processes" / "coschedule-reconcile-0.log").read_text() == "invariant evidence\n"
    assert (dest / "processes" / "sub" / "etcd.log").read_text() == "etcd\n"
    assert not (dest / "tekton").exists()
    # Saved again (the stack's folders before it stops, the processes' after): merged.
    (source / "later.log").write_text("after stop\n")
    assert load.save_logs({"processes": source}, dest) == [dest / "processes"]
    assert (dest / "processes" / "later.log").read_text() == "after stop\n"


def test_keep_logs_is_an_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        load.main(["--help"])
    assert info.value.code == 0
    assert "--keep-logs" in capsys.readouterr().out


def test_the_kept_logs_are_under_build_which_git_ignores() -> None:
    assert load.LOGS_DIR.relative_to(load.ROOT).parts[0] == "build"
    ignored = (load.ROOT / ".gitignore").read_text().splitlines()
    assert "build/" in ignored
