"""The real-stack tier (tests/real) outside `make e2e-real`: one skipped line; asked for where
the stack cannot start, a failure that says why."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_tier(
    tmp_path: Path, *args: str, required: bool = False
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSCHEDULE_REAL")}
    env["COSCHEDULE_REALSTACK"] = str(tmp_path / "no-realstack")
    if required:
        env["COSCHEDULE_REAL_REQUIRED"] = "1"
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "tests/real",
            "-p",
            "no:randomly",
            "-p",
            "no:cacheprovider",
            "-q",
            "-rfs",
            *args,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_not_asked_for_the_tier_is_one_skipped_line(tmp_path: Path) -> None:
    result = run_tier(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 skipped" in result.stdout
    assert result.stdout.count("SKIPPED") == 1
    assert "make e2e-real" in result.stdout


def test_asked_for_without_realstack_it_skips_saying_why(tmp_path: Path) -> None:
    result = run_tier(tmp_path, "-m", "real")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SKIPPED") == 1
    assert f"no realstack at {tmp_path / 'no-realstack'}" in result.stdout


def test_required_without_realstack_it_fails_saying_why(tmp_path: Path) -> None:
    result = run_tier(tmp_path, "-m", "real", required=True)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 failed" in result.stdout
    assert f"no realstack at {tmp_path / 'no-realstack'}" in result.stdout
    assert "COSCHEDULE_REAL_REQUIRED" in result.stdout
