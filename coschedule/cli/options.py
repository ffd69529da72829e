"""Checked flag values: argparse refuses a bad one with a usage line and exit 2, never a
traceback and never a silently different value (``--port 99999`` would bind another port)."""

from __future__ import annotations

import argparse
import logging
import sys
from importlib import metadata
from pathlib import Path

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")

DEFAULT_CONFIG_DIR = Path("/etc/coschedule/config")

log = logging.getLogger("coschedule.config")


def port(text: str) -> int:
    value = _whole_number(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (1..65535)")
    return value


def positive_days(text: str) -> int:
    value = _whole_number(text)
    if value < 1:
        # 0 would write a certificate that has already expired.
        raise argparse.ArgumentTypeError(f"{text!r}: a certificate must be valid for 1 day or more")
    return value


def days_or_zero(text: str) -> int:
    value = _whole_number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be 0 or more")
    return value


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


class MissingConfigDir(Exception):
    """An explicitly given ``--config-dir`` that is not a folder."""


def resolve_config_dir(given: str | None) -> tuple[Path | None, str | None]:
    """The config folder to read, and a note when the settings are defaults + environment.

    The default folder missing is normal off-cluster (``make run``): say so and go on. A
    folder the user named that is missing is a mistake: refuse (MissingConfigDir).
    """
    if given is not None:
        path = Path(given)
        if not path.is_dir():
            raise MissingConfigDir(f"--config-dir {given}: no such folder")
        return path, None
    if DEFAULT_CONFIG_DIR.is_dir():
        return DEFAULT_CONFIG_DIR, None
    return None, (
        f"config folder {DEFAULT_CONFIG_DIR} not found: using the built-in defaults and "
        "COSCHEDULE_* environment variables"
    )


def config_dir_or_exit(command: str, given: str | None) -> tuple[Path | None, str | None]:
    """``resolve_config_dir`` for a command: a refusal is a message and exit 2."""
    try:
        path, note = resolve_config_dir(given)
    except MissingConfigDir as exc:
        print(f"coschedule {command}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if note is not None:
        log.warning(note)
    return path, note
