"""The shipped manifests apply to a real API server (server-side dry run: admission,
validation and defaulting run; nothing is stored)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chart import all_options, render_chart_text
from tests.e2e.conftest import E2E
from tests.e2e.install import MANIFESTS

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("overlay", ["self-signed", "cert-manager"])
def test_overlay_applies_with_server_dry_run(e2e: E2E, overlay: str) -> None:
    folder = MANIFESTS / "overlays" / overlay
    if not (folder / "kustomization.yaml").is_file():
        pytest.fail(f"{folder} has no kustomization.yaml")
    # cert-manager's Certificate and Issuer kinds are installed as minimal CRDs by the
    # session (tests/e2e/world.py), as they would be by cert-manager itself.
    done = e2e.kubectl_run("apply", "--dry-run=server", "-k", str(folder))
    assert done.returncode == 0, (
        f"kubectl apply --dry-run=server -k {folder} failed:\n{done.stderr}"
    )
    out = done.stdout
    for kind, name in [
        ("deployment.apps", "coschedule-webhook"),
        ("deployment.apps", "coschedule-reconciler"),
        ("mutatingwebhookconfiguration.admissionregistration.k8s.io", "coschedule"),
        ("clusterrole.rbac.authorization.k8s.io", "coschedule-reconciler"),
        ("configmap", "coschedule-config"),
    ]:
        assert f"{kind}/{name}" in out, f"{kind}/{name} not applied:\n{out}\n{done.stderr}"
    assert "(server dry run)" in out, out
    if overlay == "cert-manager":
        assert "certificate.cert-manager.io/coschedule-webhook" in out, out
    else:
        assert "job.batch/coschedule-certs" in out, out
        assert "secret/coschedule-webhook-ca" in out, out
        assert "role.rbac.authorization.k8s.io/coschedule-reconciler-certs" in out, out
    # Nothing was stored: the dry run did not replace the suite's own registration.
    assert e2e.api.get("Deployment", "coschedule-webhook", "coschedule-system") is None


def test_deleting_an_overlay_keeps_the_crd_and_the_controls(e2e: E2E) -> None:
    """``kubectl delete -k`` of an overlay (server dry run) would delete the objects it renders
    that exist here (the suite's namespace and RBAC, for one), never the CRD, which
    ``manifests/crds`` applies on its own: every ConcurrencyControl stays."""
    crds = MANIFESTS / "crds"
    done = e2e.kubectl_run("apply", "--dry-run=server", "-k", str(crds))
    assert done.returncode == 0, done.stderr
    crd = "customresourcedefinition.apiextensions.k8s.io/concurrencycontrols.coschedule.dev"
    assert crd in done.stdout, done.stdout
    overlay = MANIFESTS / "overlays" / "self-signed"
    done = e2e.kubectl_run(
        "delete", "--dry-run=server", "--ignore-not-found", "--wait=false", "-k", str(overlay)
    )
    assert done.returncode == 0, done.stderr
    assert 'namespace "coschedule-system" deleted (server dry run)' in done.stdout, done.stdout
    assert "customresourcedefinition" not in done.stdout, done.stdout
    assert e2e.api.get("CustomResourceDefinition", "concurrencycontrols.coschedule.dev")


@pytest.mark.parametrize("source", ["self-signed", "cert-manager"])
def test_chart_applies_with_server_dry_run(e2e: E2E, source: str, tmp_path: Path) -> None:
    """charts/coschedule rendered by a real Helm (every option set) applies to the server."""
    values = all_options()
    values["certificates"]["source"] = source
    manifest = tmp_path / "chart.yaml"
    manifest.write_text(render_chart_text(values))
    done = e2e.kubectl_run("apply", "--dry-run=server", "-f", str(manifest))
    assert done.returncode == 0, f"kubectl apply --dry-run=server (chart) failed:\n{done.stderr}"
    out = done.stdout
    for kind, name in [
        ("deployment.apps", "coschedule-webhook"),
        ("deployment.apps", "coschedule-reconciler"),
        ("mutatingwebhookconfiguration.admissionregistration.k8s.io", "coschedule"),
        ("clusterrole.rbac.authorization.k8s.io", "coschedule-reconciler"),
        ("configmap", "coschedule-config"),
        ("certificate.cert-manager.io" if source == "cert-manager" else "job.batch", ""),
        ("servicemonitor.monitoring.coreos.com", "coschedule"),
        ("prometheusrule.monitoring.coreos.com", "coschedule"),
    ]:
        assert f"{kind}/{name}" in out, f"{kind}/{name} not applied:\n{out}\n{done.stderr}"
    assert "(server dry run)" in out, out
    assert e2e.api.get("Deployment", "coschedule-webhook", "coschedule-system") is None


def test_monitoring_component_applies_with_server_dry_run(e2e: E2E, tmp_path: Path) -> None:
    """The self-signed overlay with manifests/components/monitoring: the ServiceMonitor,
    the PrometheusRule and the dashboard ConfigMap apply (the Prometheus Operator's kinds
    installed as minimal CRDs by the session, as the operator would)."""
    import yaml

    from tests.test_monitoring import _build_with_component

    manifest = tmp_path / "with-monitoring.yaml"
    manifest.write_text(yaml.safe_dump_all(_build_with_component(tmp_path)))
    done = e2e.kubectl_run("apply", "--dry-run=server", "-f", str(manifest))
    assert done.returncode == 0, done.stderr
    for applied in (
        "servicemonitor.monitoring.coreos.com/coschedule",
        "prometheusrule.monitoring.coreos.com/coschedule",
        "configmap/coschedule-grafana-dashboard",
        "service/coschedule-webhook-metrics",
        "service/coschedule-reconciler-metrics",
    ):
        assert applied in done.stdout, done.stdout
