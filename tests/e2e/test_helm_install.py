"""The README's Helm command, run for real by Helm (the library of tests/chart.py) against a
fresh control plane of the suite's binaries: ``helm install coschedule charts/coschedule -n
coschedule-system --create-namespace`` installs, ``helm upgrade`` upgrades (and the CRD, which
Helm never upgrades, is upgraded by the documented ``kubectl apply``), ``helm uninstall``
removes the release and keeps the CRD and every ConcurrencyControl (Helm never deletes
``crds/``).

Fresh, not the session's: the session already holds the cluster-wide objects of its own
installation (the MutatingWebhookConfiguration, the ClusterRoles), which Helm would refuse
to adopt, as on any cluster where coschedule was applied with kubectl first.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.chart import CHART, NAMESPACE, RELEASE, helm
from tests.e2e.cluster import ControlPlane, find_kubectl
from tests.e2e.conftest import BINARIES
from tests.e2e.kube import Api

CRD = "concurrencycontrols.coschedule.dev"


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    assert BINARIES is not None
    plane = ControlPlane(BINARIES, tmp_path_factory.mktemp("helm"))
    try:
        plane.start_apiserver()
        yield plane
    finally:
        plane.stop()


def _secret(api: Api, name: str) -> Any:
    return api.request("GET", f"/api/v1/namespaces/{NAMESPACE}/secrets/{name}", ok_missing=True)


def test_documented_helm_install_upgrade_uninstall(fresh: ControlPlane) -> None:
    module = helm()
    api = fresh.api
    assert api is not None
    assert fresh.admin_kubeconfig is not None
    assert api.get("Namespace", NAMESPACE) is None, "a fresh cluster"
    config = module.Config(kubeconfig_path=Path(fresh.admin_kubeconfig), namespace=NAMESPACE)
    try:
        release = config.install(
            str(CHART), RELEASE, None, namespace=NAMESPACE, create_namespace=True, timeout=120
        )
        assert release["status"] == "deployed", release["status"]
        # The namespace is the release's: Helm made it and keeps the release record there.
        assert api.get("Namespace", NAMESPACE) is not None
        assert _secret(api, f"sh.helm.release.v1.{RELEASE}.v1") is not None
        for name in ("coschedule-webhook", "coschedule-reconciler"):
            deployment = api.must_get("Deployment", name, NAMESPACE)
            labels = deployment["metadata"]["labels"]
            assert labels["app.kubernetes.io/managed-by"] == "Helm", labels
        assert api.get("MutatingWebhookConfiguration", "coschedule") is not None
        assert api.get("CustomResourceDefinition", CRD) is not None
        control = {
            "apiVersion": "coschedule.dev/v1alpha1",
            "kind": "ConcurrencyControl",
            "metadata": {"name": "deploys", "namespace": "default"},
            "spec": {"selector": {}, "strategy": "Queue", "key": "prod"},
        }
        api.create(control)

        # docs/upgrade.md: Helm never upgrades crds/, so the CRD is applied first, by hand.
        kubectl = find_kubectl(BINARIES)
        if kubectl is not None:
            done = subprocess.run(
                [
                    str(kubectl),
                    "--kubeconfig",
                    str(fresh.admin_kubeconfig),
                    "apply",
                    "--server-side",
                    "--force-conflicts",
                    "-f",
                    str(CHART / "crds"),
                ],
                capture_output=True,
                text=True,
                timeout=90,
                check=False,
            )
            assert done.returncode == 0, done.stderr
            assert f"customresourcedefinition.apiextensions.k8s.io/{CRD} serverside-applied" in (
                done.stdout
            )
        upgraded = config.upgrade(
            str(CHART), RELEASE, {"webhook": {"replicas": 3}}, namespace=NAMESPACE, timeout=120
        )
        assert upgraded["revision"] == 2, upgraded["status"]
        webhook = api.must_get("Deployment", "coschedule-webhook", NAMESPACE)
        assert webhook["spec"]["replicas"] == 3

        config.uninstall(RELEASE, timeout=120)
        assert api.get("Deployment", "coschedule-webhook", NAMESPACE) is None
        assert api.get("MutatingWebhookConfiguration", "coschedule") is None
        # Helm never deletes what it installed from crds/: the ConcurrencyControls stay;
        # nor the namespace --create-namespace made.
        assert api.get("Namespace", NAMESPACE) is not None
        assert api.get("CustomResourceDefinition", CRD) is not None
        assert api.get("ConcurrencyControl", "deploys", "default") is not None
    finally:
        config.close()
