"""Checked flag values: argparse refuses a bad one with a usage line and exit 2, never a
traceback and never a silently different value (``--port 99999`` would bind another port)."""

from __future__ import annotations

import argparse
import datetime as dt
from importlib import metadata

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def port(text: str) -> int:
    value = _whole_number(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (1..65535)")
    return value


# Ten years, kubeadm's CA lifetime (the CA is made for twice --days). A longer-lived key is
# one nobody rotates; 100000 days would outlive the X.509 date format (year 9999).
MAX_CERT_DAYS = 3650


def positive_days(text: str) -> int:
    value = _whole_number(text)
    if value < 1:
        # 0 would write a certificate that has already expired.
        raise argparse.ArgumentTypeError(f"{text!r}: a certificate must be valid for 1 day or more")
    if value > MAX_CERT_DAYS:
        raise argparse.ArgumentTypeError(
            f"{text!r}: at most {MAX_CERT_DAYS} days (10 years); rotate certificates, or let "
            "cert-manager do it (manifests/overlays/cert-manager)"
        )
    return value


def days_or_zero(text: str) -> int:
    value = _whole_number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be 0 or more")
    return value


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration(text: str) -> dt.timedelta:
    """``90d``, ``2160h``, ``10m``, ``45s``: a positive span of time."""
    return _span(text, zero=False)


def duration_or_zero(text: str) -> dt.timedelta:
    """As ``duration``, and ``0`` (or ``0s``) for none."""
    return _span(text, zero=True)


def _span(text: str, *, zero: bool) -> dt.timedelta:
    value = text.strip().lower()
    if zero and value in ("0", *(f"0{unit}" for unit in _UNITS)):
        return dt.timedelta(0)
    unit = _UNITS.get(value[-1:]) if value else None
    try:
        amount = float(value[:-1]) if unit is not None else float("nan")
    except ValueError:
        amount = float("nan")
    if unit is None or not amount > 0 or amount == float("inf"):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration: a positive number and a unit, s, m, h or d (90d, 12h)"
            + (", or 0" if zero else "")
        )
    return dt.timedelta(seconds=amount * unit)


def log_level(text: str) -> str:
    value = text.strip().lower()
    if value not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(LOG_LEVELS)}")
    return value


def _whole_number(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def version() -> str:
    """``coschedule 0.1.0``: the installed distribution's version (pyproject's)."""
    try:
        return f"coschedule {metadata.version('coschedule')}"
    except metadata.PackageNotFoundError:  # run from a source tree that is not installed
        return "coschedule (not installed)"
