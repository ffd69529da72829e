"""The real-stack tier: real PipelineRuns on a real Tekton controller and real kubelets.

It runs when asked for: ``make e2e-real`` (``pytest tests/real -m real``, with
``COSCHEDULE_REAL_REQUIRED=1``). Otherwise, or where the stack cannot start here (no
../shared/realstack, not root, no control-plane binaries), the tier is one skipped item with
one reason line; asked for with ``COSCHEDULE_REAL_REQUIRED=1``, a stack that cannot start
fails the run with the reason. One stack per session, shared by every scenario; each scenario
has its own namespace(s), and one that cordons or taints a node restores it.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.e2e.kube import ApiError
from tests.e2e.world import make_namespace, unique, wait_webhook_sees
from tests.real import stack
from tests.real.stack import REQUIRED_ENV, RealCluster
from tests.tiers import Tier, tier_hooks

HINT = "see tests/real/README.md"
_SESSION: RealCluster | None = None
_NOTES: list[str] = []


def _asked_for(config: pytest.Config) -> bool:
    if os.environ.get(REQUIRED_ENV):
        return True
    markexpr = str(config.getoption("markexpr", "") or "")
    return re.search(r"(?<!not )\breal\b", markexpr) is not None


def skip_reason(config: pytest.Config) -> str | None:
    if not _asked_for(config):
        return "real: the real-stack tier runs when asked for: make e2e-real (pytest -m real)"
    why = stack.unavailable()
    return f"real: {why}; {HINT}" if why else None


_HOOKS = tier_hooks(
    Tier(
        marker="real",
        what="the real-stack tier",
        item="real-tier",
        conftest=Path(__file__).resolve(),
        required_env=REQUIRED_ENV,
        logs_title="real-stack component logs (tails)",
        unavailable=skip_reason,
        logs=lambda: _SESSION.logs() if _SESSION is not None else None,
        notes=_NOTES,
    )
)
pytest_ignore_collect = _HOOKS.ignore_collect
pytest_collect_file = _HOOKS.collect_file
pytest_collection_modifyitems = _HOOKS.collection_modifyitems
pytest_runtest_makereport = _HOOKS.runtest_makereport
pytest_terminal_summary = _HOOKS.terminal_summary


@pytest.fixture(scope="session")
def real(request: pytest.FixtureRequest) -> Iterator[RealCluster]:
    """The stack, once per session. Its folder (control plane data, logs, kubeconfigs) is its
    own, not pytest's numbered tmp folders (which other pytest runs prune); it is removed
    afterwards unless a test failed or REAL_KEEP is set."""
    global _SESSION
    workdir = Path(tempfile.mkdtemp(prefix="coschedule-real-"))
    cluster = stack.start(workdir, _NOTES)
    _SESSION = cluster
    try:
        yield cluster
    finally:
        _SESSION = None
        stack.stop(cluster)
        if request.session.testsfailed or os.environ.get("REAL_KEEP"):
            _NOTES.append(f"kept {workdir} (logs, control-plane data)")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def namespace(real: RealCluster, request: pytest.FixtureRequest) -> Iterator[Callable[..., str]]:
    """``namespace(mode=None, prefix=...)``: an enabled namespace (with the mode label when
    given) that the webhook has seen; deleted after the test."""
    made: list[str] = []

    def make(mode: str | None = None, prefix: str | None = None) -> str:
        base = prefix or request.node.name.removeprefix("test_")
        base = re.sub(r"[^a-z0-9]+", "-", base.lower())[:30].strip("-")
        name = unique(f"real-{base}")
        make_namespace(real.api, name, mode)
        made.append(name)
        if mode not in (None, stack.CONFIG["coschedule"]):
            wait_webhook_sees(real.api, name, mode)
        return name

    yield make
    if os.environ.get("REAL_KEEP"):
        return
    for name in made:
        with contextlib.suppress(ApiError):
            real.api.delete("Namespace", name)
