"""The house rules in pyproject.toml ([tool.importlinter]) hold, and they would catch a break.

`make lint` runs lint-imports on the tree; these tests show the contracts are not vacuous: each
one fails on a copy of the package with one forbidden import added.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
_VERDICT = re.compile(r"(.*) (KEPT|BROKEN)(?: \(\d+ ignored imports?\))?$")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.skipif(
    not LINT_IMPORTS.exists(), reason="lint-imports is not installed (pip install -e '.[dev]')"
)


def _lint(tree: Path) -> subprocess.CompletedProcess[str]:
    # wide enough that each contract's verdict is one line
    env = {**os.environ, "PYTHONPATH": str(tree), "COLUMNS": "400"}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--config", str(REPO / "pyproject.toml")],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _copy_with(tmp_path: Path, module: str, line: str) -> Path:
    tree = tmp_path / "tree"
    shutil.copytree(
        REPO / "coschedule", tree / "coschedule", ignore=shutil.ignore_patterns("__pycache__")
    )
    target = tree / "coschedule" / module
    target.write_text(target.read_text() + f"\n{line}\n")
    return tree


def test_the_tree_keeps_every_contract(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    shutil.copytree(
        REPO / "coschedule", tree / "coschedule", ignore=shutil.ignore_patterns("__pycache__")
    )
    result = _lint(tree)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        # a pure decision that reaches up to an entry point
        ("mutate/decision.py", "import coschedule.cli.main", "Floors"),
        # one process's code in the other's
        ("server/tls.py", "import coschedule.reconcile.workqueue", "separate processes"),
        # the webhook importing the Kubernetes client layer is fine; a pure floor doing so is not
        ("wire/review.py", "import coschedule.kube.client", "talk to no cluster"),
        # a pure floor that talks to the cluster
        ("concurrency/plan.py", "import httpx", "talk to no cluster"),
        # a reconciler planner that reaches for the API client, or for HTTP itself
        ("reconcile/stuck_runs.py", "import coschedule.kube.client", "planners talk to no"),
        ("reconcile/plan.py", "import httpx", "planners talk to no"),
        # the reconciler taking protocol from the webhook's decisions, not from placement
        ("reconcile/node_pins.py", "import coschedule.mutate.isolation", "no protocol from"),
        # decide, reached through a planner other than the two that call it on purpose
        ("reconcile/stuck.py", "import coschedule.mutate.decision", "no protocol from"),
        # placement, on the protocol floor, reaching up to a decision
        ("placement/node_pin.py", "import coschedule.mutate.decision", "Floors"),
    ],
)
def test_each_contract_catches_its_break(
    tmp_path: Path, module: str, line: str, contract: str
) -> None:
    result = _lint(_copy_with(tmp_path, module, line))
    assert result.returncode != 0
    # a verdict ends KEPT or BROKEN, then "(N ignored imports)" for a contract with exceptions
    verdicts = [m for v in result.stdout.splitlines() if (m := _VERDICT.match(v))]
    broken = [m.group(1) for m in verdicts if m.group(2) == "BROKEN"]
    assert any(contract in v for v in broken), result.stdout
