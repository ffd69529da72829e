"""The runs the webhook admitted a moment ago: found by name or by their ``generateName``,
in their namespace only, for ``young`` seconds, and never more than ``limit`` of them."""

from __future__ import annotations

from coschedule.mutate.bind_wait import ON_ITS_WAY_SECONDS
from coschedule.server.young_runs import YoungRuns

NOW = 1_800_000_000.0


def test_a_run_is_found_by_its_name_in_its_namespace_while_young() -> None:
    runs = YoungRuns()
    runs.record("ci", "pr-7f3k2", "", NOW)
    assert runs.admitted("ci", "pr-7f3k2", NOW + 1) == NOW
    assert runs.admitted("ci", "pr-7f3k2", NOW + ON_ITS_WAY_SECONDS) == NOW
    assert runs.admitted("ci", "pr-7f3k2", NOW + ON_ITS_WAY_SECONDS + 0.1) is None
    assert runs.admitted("team", "pr-7f3k2", NOW + 1) is None
    assert runs.admitted("ci", "pr-7f3k3", NOW + 1) is None


def test_a_generated_run_is_found_by_its_prefix_and_five_characters() -> None:
    runs = YoungRuns()
    runs.record("ci", "", "build-", NOW)
    assert runs.admitted("ci", "build-x7k2q", NOW + 0.5) == NOW
    assert runs.admitted("ci", "build-x7k2", NOW + 0.5) is None  # 4: not generated from it
    assert runs.admitted("ci", "build-ab-x7k2q", NOW + 0.5) is None
    assert runs.admitted("ci", "build-", NOW + 0.5) is None
    # The API server cuts a long prefix to 58 characters before adding its 5.
    long = "p" * 70
    runs.record("ci", "", long, NOW)
    assert runs.admitted("ci", "p" * 58 + "abcde", NOW) == NOW


def test_a_run_without_name_or_prefix_is_not_kept() -> None:
    runs = YoungRuns()
    runs.record("ci", "", "", NOW)
    assert len(runs) == 0


def test_old_runs_go_with_the_next_record_and_the_count_is_capped() -> None:
    runs = YoungRuns(young=5, limit=3)
    runs.record("ci", "a", "", NOW)
    runs.record("ci", "b", "", NOW + 1)
    runs.record("ci", "c", "", NOW + 6)  # "a" is 6 s old: gone
    assert len(runs) == 2
    assert runs.admitted("ci", "a", NOW + 6) is None
    runs.record("ci", "d", "", NOW + 6)
    runs.record("ci", "e", "", NOW + 6)  # over the cap: the oldest ("b") goes
    assert len(runs) == 3
    assert runs.admitted("ci", "b", NOW + 6) is None
    assert runs.admitted("ci", "e", NOW + 6) == NOW + 6


def test_the_same_run_admitted_again_is_kept_once_from_its_last_admission() -> None:
    runs = YoungRuns(young=5)
    runs.record("ci", "a", "", NOW)
    runs.record("ci", "a", "", NOW + 4)
    assert len(runs) == 1
    assert runs.admitted("ci", "a", NOW + 8) == NOW + 4
