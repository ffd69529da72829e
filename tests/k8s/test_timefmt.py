"""RFC 3339 times as the API writes them, read and written."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from coschedule.k8s.timefmt import micro_time, parse_time, rfc3339


def test_times_read_and_written() -> None:
    moment = datetime(2026, 11, 24, 21, 0, 5, 250000, tzinfo=UTC)
    assert rfc3339(moment) == "2026-11-24T21:00:05Z"
    assert micro_time(moment.timestamp()) == "2026-11-24T21:00:05.250000Z"
    assert parse_time("2026-11-24T21:00:05Z") == moment.timestamp() - 0.25
    assert parse_time(micro_time(moment.timestamp())) == moment.timestamp()
    assert parse_time("2026-11-24T22:00:05+01:00") == parse_time("2026-11-24T21:00:05Z")


@pytest.mark.parametrize("text", [None, "", "yesterday", 1732482005])
def test_unreadable_times_are_none(text: object) -> None:
    assert parse_time(text) is None
