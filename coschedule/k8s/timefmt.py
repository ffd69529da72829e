"""RFC 3339 times as the API writes them (``metav1.Time``, ``metav1.MicroTime``)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any


def parse_time(text: Any) -> float | None:
    """Seconds since the epoch of an RFC 3339 time; None when absent or unreadable."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def rfc3339(moment: datetime) -> str:
    """A ``metav1.Time`` of a UTC moment, whole seconds (``2026-11-24T21:00:00Z``)."""
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_time(seconds: float | None = None) -> str:
    """A ``metav1.MicroTime`` (Lease times) of ``seconds`` since the epoch (default: now)."""
    return datetime.fromtimestamp(time.time() if seconds is None else seconds, UTC).strftime(
        "%Y-%m-%dT%H:%M:%S.%fZ"
    )
