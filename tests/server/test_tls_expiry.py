"""When the webhook warns that its certificate was not renewed: a fifth of its life, at
most 14 days, before it expires."""

from __future__ import annotations

import datetime as dt

import pytest

from coschedule.server.tls import expiry_warning

T0 = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
DAY = dt.timedelta(days=1)


@pytest.mark.parametrize(
    ("lifetime", "left", "warns"),
    [
        (90 * DAY, 30 * DAY, False),  # the renewal point of the defaults: not yet
        (90 * DAY, 15 * DAY, False),
        (90 * DAY, 13 * DAY, True),  # 14 days at most, however long the life
        (365 * DAY, 20 * DAY, False),
        (8 * DAY, 2.5 * DAY, False),
        (8 * DAY, 1.5 * DAY, True),  # a fifth of a short life
        (dt.timedelta(minutes=4), dt.timedelta(seconds=90), False),
        (dt.timedelta(minutes=4), dt.timedelta(seconds=45), True),
    ],
)
def test_warns_past_a_fifth_of_the_life_or_14_days(
    lifetime: dt.timedelta, left: dt.timedelta, warns: bool
) -> None:
    not_after = T0 + lifetime
    message = expiry_warning(T0, not_after, not_after - left)
    assert (message is not None) is warns
    if message is not None:
        assert "has not been renewed" in message


def test_an_expired_certificate_says_so() -> None:
    message = expiry_warning(T0, T0 + DAY, T0 + 2 * DAY)
    assert message is not None
    assert "EXPIRED at 2026-11-02T00:00:00Z" in message
