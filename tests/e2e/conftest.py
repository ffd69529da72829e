"""The end-to-end suite's control plane: one per session, shared by every scenario.

Skipped, with one reason line, where no kube-apiserver/etcd binaries are found (see
``cluster.find_binaries``). Each scenario gets its own namespace; nodes are shared, so a
scenario that cordons or taints one restores it when it ends.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.e2e.cluster import ControlPlane, find_binaries, find_kubectl
from tests.e2e.install import SYSTEM_NAMESPACE, Coschedule
from tests.e2e.kube import Api, ApiError, wait_for
from tests.e2e.world import (
    NODES,
    FakeNodeAgents,
    install_crds,
    make_namespace,
    make_nodes,
    make_wffc_class,
    pool_pods,
    reset_node,
    unique,
    wait_webhook_sees,
)
from tests.tiers import Tier, tier_hooks

README_HINT = "see tests/e2e/README.md"
# Two replicas, as the Deployment runs them.
RECONCILER_REPLICAS = ("reconciler-a", "reconciler-b")
# A short stuck grace so that the stuck-run scenarios (test_stuck.py) finish quickly.
STUCK_GRACE = 3
# The namespace label naming a tenant (isolation scope tenant, tests/e2e/test_isolation.py):
# no other scenario's namespace has it, so their placeholders are as without it.
TENANT_LABEL = "e2e.coschedule.dev/tenant"
CLUSTER_CONFIG = {
    "coschedule": "workspaces",
    "stuck-grace-seconds": str(STUCK_GRACE),
    "isolation-tenant-label": TENANT_LABEL,
}


@dataclass
class E2E:
    plane: ControlPlane
    product: Coschedule
    agents: FakeNodeAgents
    kubectl: Path | None
    source: str
    started_in: float = 0.0
    notes: list[str] = field(default_factory=list)
    _openapi_v2_broken: bool | None = None

    @property
    def api(self) -> Api:
        assert self.plane.api is not None
        return self.plane.api

    def require(self, *needs: str) -> None:
        """Skip the scenario, saying why, when a part it needs is not here."""
        for need in needs:
            if need == "scheduler" and not self.plane.has_scheduler:
                pytest.skip(f"e2e: no kube-scheduler next to kube-apiserver ({self.source})")
            if need == "controller-manager" and not self.plane.has_controller_manager:
                pytest.skip(
                    f"e2e: no kube-controller-manager next to kube-apiserver ({self.source})"
                )
            if need == "reconciler" and self.product.reconciler_missing:
                pytest.skip(f"e2e: {self.product.reconciler_missing}")
            if need == "kubectl" and self.kubectl is None:
                pytest.skip("e2e: no kubectl binary (binaries folder or PATH)")

    def kubectl_run(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run kubectl against the test apiserver as the admin. Where the apiserver cannot
        serve its OpenAPI v2 document as protobuf (kubectl's client-side validation needs it),
        ``--validate=false`` is added: the request itself is unchanged."""
        self.require("kubectl")
        assert self.kubectl is not None
        assert self.plane.admin_kubeconfig is not None
        extra = ["--validate=false"] if self.openapi_v2_broken else []
        return subprocess.run(
            [str(self.kubectl), "--kubeconfig", str(self.plane.admin_kubeconfig), *args, *extra],
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
        )

    @property
    def openapi_v2_broken(self) -> bool:
        if self._openapi_v2_broken is None:
            response = self.api.http.get(
                "/openapi/v2",
                headers={"Accept": "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"},
            )
            self._openapi_v2_broken = response.status_code != 200
            if self._openapi_v2_broken:
                self.notes.append(
                    f"kube-apiserver answers /openapi/v2 (protobuf) with HTTP "
                    f"{response.status_code}: kubectl runs with --validate=false"
                )
        return self._openapi_v2_broken

    def logs(self, lines: int = 30) -> str:
        agent_errors = "\n".join(self.agents.errors[-5:])
        extra = f"\n----- fake kubelet errors\n{agent_errors}" if agent_errors else ""
        return self.plane.tails(lines) + extra


_SESSION: E2E | None = None
_NOTES: list[str] = []  # printed in the terminal summary

BINARIES, SOURCE = find_binaries()
SKIP_REASON = f"e2e: {SOURCE}; {README_HINT}"


# Without binaries the scenarios are not collected; one stand-in item is, and skips with the
# reason: one line in the summary, whatever the number of scenarios.
# `make e2e` and CI set COSCHEDULE_E2E_REQUIRED: asked to run the suite, a missing control
# plane is a failure, not a skip.
REQUIRED_ENV = "COSCHEDULE_E2E_REQUIRED"


_HOOKS = tier_hooks(
    Tier(
        marker="e2e",
        what="the e2e suite",
        item="e2e-suite",
        conftest=Path(__file__).resolve(),
        required_env=REQUIRED_ENV,
        logs_title="e2e component logs (tails)",
        unavailable=lambda config: SKIP_REASON if BINARIES is None else None,
        logs=lambda: _SESSION.logs() if _SESSION is not None else None,
        notes=_NOTES,
        fix="; export KUBEBUILDER_ASSETS=$(../shared/k8s/envtest-assets.sh)",
    )
)
pytest_ignore_collect = _HOOKS.ignore_collect
pytest_collect_file = _HOOKS.collect_file
pytest_collection_modifyitems = _HOOKS.collection_modifyitems
pytest_runtest_makereport = _HOOKS.runtest_makereport
pytest_terminal_summary = _HOOKS.terminal_summary


@pytest.fixture(scope="session")
def e2e(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2E]:
    global _SESSION
    binaries, source = BINARIES, SOURCE
    assert binaries is not None
    started = time.monotonic()
    workdir = tmp_path_factory.mktemp("e2e")
    plane = ControlPlane(binaries, workdir)
    kubectl = find_kubectl(binaries)
    product = Coschedule(plane, workdir)
    agents: FakeNodeAgents | None = None
    try:
        api = plane.start_apiserver()
        install_crds(api)  # before the garbage collector starts: it watches owner kinds
        make_nodes(api)
        make_wffc_class(api)
        plane.start_controllers()
        product.deploy(kubectl, CLUSTER_CONFIG, RECONCILER_REPLICAS)
        agents = FakeNodeAgents(api)
        agents.start()
        session = E2E(
            plane, product, agents, kubectl, source, time.monotonic() - started, notes=_NOTES
        )
        _NOTES.append(
            f"control plane from {source}; set up in {session.started_in:.1f}s; "
            f"logs in {workdir / 'logs'}"
        )
        if product.reconciler_missing:
            _NOTES.append(product.reconciler_missing)
        _SESSION = session
        atexit.register(plane.stop)  # if the session is torn down the hard way
        yield session
    except BaseException:
        print(f"\ne2e setup or session failed; component logs:\n{plane.tails(60)}")
        raise
    finally:
        _SESSION = None
        if agents is not None:
            agents.stop()
        plane.stop()


@pytest.fixture
def namespace(e2e: E2E, request: pytest.FixtureRequest) -> Iterator[Callable[..., str]]:
    """``namespace(mode=None, prefix=..., labels=...)`` makes an enabled namespace (with the
    mode label when given, and ``labels``) and waits until the webhook's namespace cache has
    it; all are deleted after the test."""
    made: list[str] = []

    def make(
        mode: str | None = None, prefix: str | None = None, labels: dict[str, str] | None = None
    ) -> str:
        base = prefix or request.node.name.removeprefix("test_")
        base = re.sub(r"[^a-z0-9]+", "-", base.lower())[:30].strip("-")
        name = unique(f"e2e-{base}")
        make_namespace(e2e.api, name, mode, extra_labels=labels)
        made.append(name)
        # A namespace the webhook has not seen yet gets the cluster mode: the same, unless
        # the label says otherwise.
        if mode not in (None, CLUSTER_CONFIG["coschedule"]):
            wait_webhook_sees(e2e.api, name, mode)
        return name

    yield make
    if os.environ.get("E2E_KEEP_NAMESPACES"):
        return
    for name in made:
        with contextlib.suppress(ApiError):
            e2e.api.delete("Namespace", name)


@pytest.fixture
def restore_nodes(e2e: E2E) -> Iterator[None]:
    """Scenarios that cordon or taint nodes get them back schedulable and untainted."""
    yield
    for name in NODES:
        with contextlib.suppress(ApiError):
            reset_node(e2e.api, name)


@pytest.fixture
def pool(e2e: E2E) -> Iterator[None]:
    """The pool nodes empty before, and emptied after (other scenarios' namespaces may still
    be going away: wait; ours: delete at once, as a kubelet would confirm)."""
    wait_for(
        "the pool nodes to be empty",
        lambda: not pool_pods(e2e.api),
        timeout=60,
        describe=lambda: "\n".join(
            f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in pool_pods(e2e.api)
        ),
    )
    yield
    for pod in pool_pods(e2e.api):
        with contextlib.suppress(ApiError):
            e2e.api.delete(
                "Pod", pod["metadata"]["name"], pod["metadata"]["namespace"], grace_period=0
            )


__all__ = ["E2E", "SYSTEM_NAMESPACE"]
