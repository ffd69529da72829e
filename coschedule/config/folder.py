"""Which config folder a process reads: the one named on its command line, else the
default folder when it exists, else none (built-in defaults and ``COSCHEDULE_*``).

Both processes resolve it the same way; here, below them both, so that neither imports
the other's command-line module."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

DEFAULT_CONFIG_DIR = Path("/etc/coschedule/config")

log = logging.getLogger("coschedule.config")


class MissingConfigDir(Exception):
    """An explicitly given ``--config-dir`` that is not a folder."""


def resolve_config_dir(given: str | None) -> tuple[Path | None, str | None]:
    """The config folder to read, and a note when the settings are defaults + environment.

    The default folder missing is normal off-cluster (``make run``): say so and go on. A
    folder the user named that is missing is a mistake: refuse (MissingConfigDir).
    """
    if given is not None:
        path = Path(given)
        if path.exists() and not path.is_dir():
            raise MissingConfigDir(
                f"--config-dir {given} is a file, not a folder (the ConfigMap as a folder, "
                "one file per key)"
            )
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
