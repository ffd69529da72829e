"""The Executor dispatches exhaustively: every action type a planner may return has its case
(mypy fails on one it does not handle), and an object of any other type is an error, never an
action skipped in silence."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast, get_args

import pytest
from prometheus_client import CollectorRegistry

from coschedule.kube.client import KubeClient
from coschedule.reconcile import executor as executor_module
from coschedule.reconcile.executor import Executor, UnknownAction
from coschedule.reconcile.model import Action, ClearStuck, RecordEvent
from coschedule.reconcile.reconciler_metrics import ReconcileMetrics
from coschedule.reconcile.stuck_facts import StuckMemory
from tests.reconcile.apiserver import MiniApi

ROOT = Path(__file__).resolve().parent.parent.parent


def _executor(client: KubeClient) -> Executor:
    metrics = ReconcileMetrics(CollectorRegistry())
    return Executor(
        client,
        metrics,
        leading=lambda: True,
        run_of=lambda key: "run",
        pod_version=lambda key: "",
        torn_down=lambda key: None,
        stuck=StuckMemory(metrics.stuck_groups),
    )


@dataclass(frozen=True)
class NewAction:
    """What a planner might return once someone adds an action and forgets the executor."""

    namespace: str
    name: str


async def test_an_action_without_a_case_is_an_error_and_nothing_after_it_runs(
    api: MiniApi, client: KubeClient
) -> None:
    executor = _executor(client)
    told = RecordEvent("ci", "aa", "Told", "after the unknown action")
    with pytest.raises(UnknownAction, match="no case in the executor for action NewAction"):
        await executor.execute("ci/aa", [cast(Any, NewAction("ci", "aa")), told], None)
    assert api.requests == []  # the Event after it was not recorded either


async def test_the_known_actions_still_run(api: MiniApi, client: KubeClient) -> None:
    executor = _executor(client)
    await executor.execute(
        "ci/aa", [RecordEvent("ci", "aa", "Told", "x"), ClearStuck("ci", "aa")], None
    )
    assert api.count("POST", "events") == 1


def test_every_action_type_has_its_case() -> None:
    """The match in ``Executor._one`` names each member of the ``Action`` union."""
    source = Path(executor_module.__file__).read_text()
    body = source.split("async def _one(", 1)[1].split("\n    async def ", 1)[0]
    cases = {line.strip()[5:-3] for line in body.splitlines() if line.strip().startswith("case ")}
    assert cases - {""} == {t.__name__ for t in get_args(Action)}


def test_mypy_fails_on_a_match_that_misses_an_action(tmp_path: Path) -> None:
    """``unknown(action)`` type-checks only where every action type was handled before it:
    the static half of the exhaustive dispatch. One mypy run checks two matches, one
    complete, one that forgets the last action type."""
    members = [t.__name__ for t in get_args(Action)]

    def program(handled: list[str]) -> str:
        return (
            "from coschedule.reconcile.executor import unknown\n"
            "from coschedule.reconcile.model import Action, " + ", ".join(members) + "\n\n\n"
            "def dispatch(action: Action) -> None:\n"
            "    match action:\n"
            + "".join(f"        case {name}():\n            pass\n" for name in handled)
            + "        case _:\n            unknown(action)\n"
        )

    (tmp_path / "complete.py").write_text(program(members))
    (tmp_path / "missing.py").write_text(program(members[:-1]))
    checked = subprocess.run(
        [
            sys.executable, "-m", "mypy", "--strict", "--no-error-summary",
            "--cache-dir", str(tmp_path / "cache"),
            str(tmp_path / "complete.py"), str(tmp_path / "missing.py"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
        timeout=600,
        check=False,
    )  # fmt: skip
    errors = [line for line in checked.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 1, checked.stdout + checked.stderr
    assert errors[0].startswith(str(tmp_path / "missing.py"))
    assert f'incompatible type "{members[-1]}"; expected "Never"' in errors[0]
