"""The pure part of ``bench.real_latency``: the text it prints from sample figures (the
benchmark itself runs on the real stack, as root)."""

from __future__ import annotations

import pytest

from bench.real_latency import METRICS, WITHOUT, report


def test_the_report_has_each_figure_with_its_paired_difference() -> None:
    figures = {
        WITHOUT: {
            "first_created": [0.4, 0.6],
            "first_bound": [0.5, 0.7],
            "first_running": [3.0, 3.6],
            "succeeded": [9.0, 9.4],
        },
        "pipelineruns": {
            "first_created": [0.5, 0.6],
            "first_bound": [0.6, 0.7],
            "first_running": [3.9, 3.7],
            "succeeded": [9.2, 9.8],
        },
    }
    code = {"commit": "abc1234", "modified_files": []}
    text, summaries, paired = report(figures, ["pipelineruns"], [0.5, 1.5], code)
    lines = text.splitlines()
    assert [line.split("  ")[0] for line in lines[2:]] == [
        "first pod created",
        "first pod bound",
        "first pod Running",
        "Succeeded",
        "first pod created, paired",
        "first pod bound, paired",
        "first pod Running, paired",
        "Succeeded, paired",
    ]
    assert {key for key, _ in METRICS} == set(summaries[WITHOUT])
    # Round by round: bound +0.1 and 0.0 s, Running +0.9 and +0.1 s.
    assert paired["pipelineruns"]["first_bound"] == pytest.approx(0.05)
    assert paired["pipelineruns"]["first_running"] == pytest.approx(0.5)
    assert "+0.05 s" in lines[7]
    assert summaries["pipelineruns"]["first_running"]["max"] == 3.9
