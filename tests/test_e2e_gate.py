"""The e2e suite without control-plane binaries: one skipped line under `make test`, a failure
with the reason when it was asked for (`make e2e`, CI)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_suite(tmp_path: Path, *, required: bool) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "COSCHEDULE_E2E_REQUIRED"}
    empty = tmp_path / "no-binaries"
    empty.mkdir(exist_ok=True)
    env["KUBEBUILDER_ASSETS"] = str(empty)
    env["HOME"] = str(tmp_path)  # no setup-envtest folder to fall back on
    if required:
        env["COSCHEDULE_E2E_REQUIRED"] = "1"
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "tests/e2e",
            "-p",
            "no:randomly",
            "-p",
            "no:cacheprovider",
            "-q",
            "-rfs",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


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
