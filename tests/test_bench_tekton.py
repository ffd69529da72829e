"""The pure parts of ``bench.tekton`` (``make bench-tekton``): its arguments, the flag it reads
back from a PipelineRun, and the markdown it prints, from sample figures. No stack here: the
benchmark itself runs on the real stack, as root."""

from __future__ import annotations

import pytest

from bench import tekton
from bench.real_latency import WITHOUT


def test_arguments_default_and_size() -> None:
    args = tekton.parse([])
    assert (args.rounds, args.wait, args.json) == (10, 120.0, None)
    assert not args.no_latency
    assert not args.no_behaviours
    args = tekton.parse(["--rounds", "5", "--wait", "60", "--no-behaviours"])
    assert (args.rounds, args.wait, args.no_behaviours) == (5, 60.0, True)


@pytest.mark.parametrize("argv", [["--rounds", "0"], ["--wait", "0"], ["--rounds", "x"]])
def test_arguments_out_of_range_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        tekton.parse(argv)
    assert info.value.code == 2


def test_the_flag_a_run_was_reconciled_with_is_read_from_its_provenance() -> None:
    run = {"status": {"provenance": {"featureFlags": {"coschedule": "pipelineruns"}}}}
    assert tekton.seen_flag(run) == "pipelineruns"
    assert tekton.seen_flag({"status": {}}) is None  # not reconciled yet
    assert tekton.seen_flag({}) is None


def test_each_column_switches_tekton_s_assistant_as_the_docstring_says() -> None:
    assert tekton.TEKTON_FLAG == {
        WITHOUT: "disabled",
        "tekton": "pipelineruns",
        "coschedule": "disabled",
    }


def _figures() -> dict[str, dict[str, list[float]]]:
    # Round by round, Tekton's column is 0.1, 0.5, 0.9 s behind: a paired median of +0.50 s,
    # while its median minus the other's median is +0.30 s (the pairing is what is shown).
    # Bound: coschedule's first pod before Tekton's in rounds 0 and 2, after it in round 1.
    return {
        WITHOUT: {
            "first_created": [0.4, 0.5, 0.3],
            "first_bound": [0.5, 0.6, 0.4],
            "first_running": [3.0, 3.4, 3.2],
            "succeeded": [9.0, 10.0, 9.5],
        },
        "tekton": {
            "first_created": [0.5, 0.5, 0.4],
            "first_bound": [0.9, 0.6, 0.8],
            "first_running": [3.1, 3.9, 4.1],
            "succeeded": [9.2, 10.4, 11.0],
        },
        "coschedule": {
            "first_created": [0.5, 0.6, 0.4],
            "first_bound": [0.6, 0.7, 0.5],
            "first_running": [3.2, 3.3, 3.4],
            "succeeded": [9.1, 9.6, 9.9],
        },
    }


def test_latency_table_medians_ranges_and_paired_differences() -> None:
    table, result = tekton.latency_table(_figures())
    rows = table.splitlines()
    assert rows[0] == (
        "| creation → | no co-scheduling | Tekton's assistant `pipelineruns` "
        "| coschedule `pipelineruns` |"
    )
    assert rows[1] == "|---|---|---|---|"
    assert rows[2] == (
        "| first TaskRun pod made, median (min-max) | 0.40 s (0.30-0.50) "
        "| 0.50 s (0.40-0.50) | 0.50 s (0.40-0.60) |"
    )
    assert rows[3] == (
        "| paired difference over none, median (min to max) | - "
        "| +0.10 s (+0.00 to +0.10) | +0.10 s (+0.10 to +0.10) |"
    )
    rows = rows[:2] + rows[4:]
    assert rows[2] == (
        "| first TaskRun pod bound to a node, median (min-max) | 0.50 s (0.40-0.60) "
        "| 0.80 s (0.60-0.90) | 0.60 s (0.50-0.70) |"
    )
    assert rows[3] == (
        "| paired difference over none, median (min to max) | - "
        "| +0.40 s (+0.00 to +0.40) | +0.10 s (+0.10 to +0.10) |"
    )
    assert rows[4] == (
        "| first TaskRun pod Running, median (min-max) | 3.20 s (3.00-3.40) "
        "| 3.90 s (3.10-4.10) | 3.30 s (3.20-3.40) |"
    )
    assert rows[5] == (
        "| paired difference over none, median (min to max) | - "
        "| +0.50 s (+0.10 to +0.90) | +0.20 s (-0.10 to +0.20) |"
    )
    assert rows[6].startswith("| PipelineRun Succeeded, median (min-max) | 9.50 s (9.00-10.00) ")
    # Running: coschedule's 3.2 / 3.3 / 3.4 against Tekton's 3.1 / 3.9 / 4.1, behind in
    # round 0 only; bound: behind in round 1 only (0.7 against 0.6).
    assert rows[7] == (
        "| rounds with coschedule's first pod no later than Tekton's assistant's "
        "(bound / Running) | - | - | 2 / 2 of 3 |"
    )
    assert result["paired_first_running"]["tekton"]["median"] == pytest.approx(0.5)
    assert result["paired_first_bound"]["coschedule"]["median"] == pytest.approx(0.1)
    assert result["paired_first_created"]["tekton"]["max"] == pytest.approx(0.1)
    assert result["summary"]["coschedule"]["succeeded"]["max"] == 9.9
    assert result["coschedule_not_behind_tekton"] == {
        "first_bound": 2,
        "first_running": 2,
        "rounds": 3,
    }


def test_behaviour_cells_say_the_outcome_and_when() -> None:
    done = tekton.Outcome("Succeeded", 40.66, "placeholder moved 2.9 s after the cordon")
    stuck = tekton.Outcome(
        "stuck", 131.7, "the next task Pending", "uncordoned at 132 s; Succeeded at 141.0 s"
    )
    cancelled = tekton.Outcome("stuck", 120.2, "the second task Pending", "cancelled")
    failed = tekton.Outcome("error", 12.0, "the first task to run: timed out")
    assert done.cell() == "placeholder moved 2.9 s after the cordon; Succeeded at 40.7 s"
    assert stuck.cell() == (
        "the next task Pending; stuck 132 s; uncordoned at 132 s; Succeeded at 141.0 s"
    )
    assert cancelled.cell() == "the second task Pending; stuck 120 s; cancelled"
    assert "not measured" in failed.cell()
    assert "timed out" in failed.cell()
    table = tekton.behaviour_table(
        {
            "cordon": {"tekton": stuck, "coschedule": done},
            "small": {"tekton": cancelled},
        }
    ).splitlines()
    assert table[0] == "| behaviour, one run each | Tekton's assistant | coschedule |"
    assert table[2] == f"| {tekton.BEHAVIOURS['cordon']} | {stuck.cell()} | {done.cell()} |"
    assert table[3] == f"| {tekton.BEHAVIOURS['small']} | {cancelled.cell()} | - |"
    assert len(table) == 4  # behaviours not measured get no row


def test_heading_labels_a_loaded_machine_and_local_changes() -> None:
    quiet = tekton.heading({"commit": "fed78da", "modified_files": []}, [0.4, 1.9], 5, 120)
    assert quiet.startswith("commit fed78da; 5 interleaved rounds")
    assert "1-minute load average 0.40-1.90" in quiet
    loaded = tekton.heading({"commit": "fed78da", "modified_files": ["x"]}, [1.0, 4.2], 5, 120)
    assert loaded.startswith("measured on a shared, loaded machine; commit fed78da + changes")
    assert "waits bounded at 120 s" in loaded
    latency_only = tekton.heading(
        {"commit": "fed78da", "modified_files": []}, [0.4], 20, 120, behaviours=False
    )
    assert latency_only.startswith("commit fed78da; 20 interleaved rounds after one warm-up; 1-")
    assert "behaviours" not in latency_only
    behaviours_only = tekton.heading(
        {"commit": "fed78da", "modified_files": []}, [0.4], 20, 120, latency=False
    )
    assert behaviours_only.startswith("commit fed78da; behaviours one run each")
