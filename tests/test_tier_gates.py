"""The two tiers that need more than this machine's Python, outside their own targets:

- the e2e suite (tests/e2e) without control-plane binaries: one skipped line under `make
  test`, a failure with the reason when it was asked for (`make e2e`, CI);
- the real-stack tier (tests/real) outside `make e2e-real`: one skipped line; asked for where
  the stack cannot start, a failure that says why.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_pytest(folder: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """pytest on one tier's folder in a child process, as the Makefile runs it."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            folder,
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


# ---- the e2e suite ---------------------------------------------------------------------


def run_suite(tmp_path: Path, *, required: bool) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "COSCHEDULE_E2E_REQUIRED"}
    empty = tmp_path / "no-binaries"
    empty.mkdir(exist_ok=True)
    env["KUBEBUILDER_ASSETS"] = str(empty)
    env["HOME"] = str(tmp_path)  # no setup-envtest folder to fall back on
    if required:
        env["COSCHEDULE_E2E_REQUIRED"] = "1"
    return run_pytest("tests/e2e", env)


def test_without_binaries_the_suite_is_one_skipped_line(tmp_path: Path) -> None:
    result = run_suite(tmp_path, required=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 skipped" in result.stdout
    assert result.stdout.count("SKIPPED") == 1
    assert "lacks kube-apiserver, etcd" in result.stdout


def test_asked_for_without_binaries_the_suite_fails_saying_why(tmp_path: Path) -> None:
    result = run_suite(tmp_path, required=True)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 failed" in result.stdout
    assert "lacks kube-apiserver, etcd" in result.stdout
    assert "envtest-assets.sh" in result.stdout


# ---- the real-stack tier ---------------------------------------------------------------


def run_tier(
    tmp_path: Path, *args: str, required: bool = False
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSCHEDULE_REAL")}
    env["COSCHEDULE_REALSTACK"] = str(tmp_path / "no-realstack")
    if required:
        env["COSCHEDULE_REAL_REQUIRED"] = "1"
    return run_pytest("tests/real", env, *args)


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
