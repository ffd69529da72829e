"""Monitoring as shipped: the metrics Services, the ServiceMonitor (kustomize component and
chart value), the PrometheusRule and the Grafana dashboard. Every PromQL expression is parsed
(PyPI promql-parser) and may name only metrics the two processes register, as their
prometheus_client registries expose them."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from coschedule.reconcile.cert_plan import RotationPolicy
from coschedule.reconcile.certificates import CertificateMetrics
from coschedule.reconcile.reconciler_metrics import ReconcileMetrics
from coschedule.server.webhook_metrics import WebhookMetrics
from tests.chart import CHART, render_chart
from tests.test_manifests import NAMESPACE, Obj, objects, one, render

ROOT = Path(__file__).resolve().parent.parent
COMPONENT = ROOT / "manifests" / "components" / "monitoring"
promql = pytest.importorskip("promql_parser", reason="promql-parser (dev dependency) is missing")

# PromQL's own functions' arguments that are not metrics: none here; ``time()`` and
# ``vector(0)`` name no series.
SUFFIXES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}


def exposed(registry: CollectorRegistry) -> dict[str, set[str]]:
    """{series name: label names} as the registry exposes them (a counter's ``_total``,
    a histogram's ``_bucket``/``_sum``/``_count``)."""
    found: dict[str, set[str]] = {}
    for family in registry.collect():
        labels: set[str] = set()
        for sample in family.samples:
            labels |= set(sample.labels) - {"le"}
        for suffix in SUFFIXES.get(family.type, ("",)):
            found[family.name + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
    return found


def registered() -> dict[str, set[str]]:
    """Both processes: the webhook's registry, and the reconciler's with every controller's
    instruments (concurrency, the certificate keeper) on it."""
    webhook = WebhookMetrics()
    webhook.admissions.record(("workspaces", "true", "200"))  # a sample shows the labels
    reconciler = ReconcileMetrics()
    CertificateMetrics(reconciler.registry)
    reconciler.errors.labels("placeholder", "409")
    names = exposed(webhook.registry)
    for name, labels in exposed(reconciler.registry).items():
        names.setdefault(name, set()).update(labels)
    return names


def selectors(expr: str) -> list[Any]:
    found: list[Any] = []

    def visit(node: Any) -> None:
        if isinstance(node, promql.VectorSelector):
            found.append(node)

    promql.walk(promql.parse(expr), visit)
    return found


def _check_expr(expr: str, names: dict[str, set[str]], where: str) -> None:
    picked = selectors(expr)
    assert picked, f"{where}: {expr!r} selects no metric"
    for selector in picked:
        assert selector.name in names, f"{where}: {selector.name} is not registered"
        for matcher in selector.matchers.matchers:
            if matcher.name != "__name__":
                assert matcher.name in names[selector.name], (
                    f"{where}: {selector.name} has no label {matcher.name}"
                )


def component_rules() -> Obj:
    docs = list(yaml.safe_load_all((COMPONENT / "prometheusrule.yaml").read_text("utf-8")))
    (rule,) = docs
    assert isinstance(rule, dict)
    return rule


def alerts() -> list[Obj]:
    return [r for g in component_rules()["spec"]["groups"] for r in g["rules"]]


def test_the_registries_hold_what_the_alerts_need() -> None:
    names = registered()
    for needed in (
        "coschedule_certificate_expiry_timestamp_seconds",
        "coschedule_reconciler_leader",
        "coschedule_gated_pods",
        "coschedule_gated_pod_oldest_seconds",
        "coschedule_stuck_groups",
        "coschedule_tekton_assistant_conflicts_total",
        "coschedule_reconcile_errors_total",
        "coschedule_admission_requests_total",
    ):
        assert needed in names
    assert {"controller", "code"} <= names["coschedule_reconcile_errors_total"]


def test_every_alert_names_only_registered_metrics_and_labels() -> None:
    names = registered()
    for rule in alerts():
        _check_expr(rule["expr"], names, rule["alert"])


def test_a_wrong_metric_name_would_be_caught() -> None:
    with pytest.raises(AssertionError, match="coschedule_gated_pod_oldest is not registered"):
        _check_expr("max(coschedule_gated_pod_oldest) > 600", registered(), "typo")
    with pytest.raises(AssertionError, match="has no label reason"):
        _check_expr('rate(coschedule_reconcile_errors_total{reason="x"}[5m])', registered(), "l")


def test_the_alerts_a_person_should_get_are_there() -> None:
    by_name = {rule["alert"]: rule for rule in alerts()}
    wanted = {
        "CoscheduleCertificateExpiresSoon": "coschedule_certificate_expiry_timestamp_seconds",
        "CoscheduleReconcilerWithoutLeader": "coschedule_reconciler_leader",
        "CoscheduleGatedPodsWaiting": "coschedule_gated_pod_oldest_seconds",
        "CoscheduleStuckGroups": "coschedule_stuck_groups",
        "CoscheduleTektonAssistantConflict": "coschedule_tekton_assistant_conflicts_total",
        "CoscheduleReconcileErrors": "coschedule_reconcile_errors_total",
        "CoscheduleWebhookRefusals": "coschedule_admission_requests_total",
    }
    for alert, metric in wanted.items():
        assert alert in by_name
        assert metric in [s.name for s in selectors(by_name[alert]["expr"])]
    for rule in by_name.values():
        assert rule["labels"]["severity"] in ("info", "warning", "critical")
        assert rule["annotations"]["summary"]
        assert rule["annotations"]["description"]


def test_the_certificate_alert_fires_days_before_expiry_and_after_the_renewal_point() -> None:
    """It fires well ahead (days), but not while a renewal is merely due: the default
    install renews 30 days ahead."""
    rule = next(r for r in alerts() if r["alert"] == "CoscheduleCertificateExpiresSoon")
    (threshold,) = [n for n in _numbers(rule["expr"]) if n > 3600]
    assert dt.timedelta(days=3) < dt.timedelta(seconds=threshold) < RotationPolicy(()).renew_before


def _numbers(expr: str) -> list[float]:
    found: list[float] = []

    def visit(node: Any) -> None:
        if isinstance(node, promql.BinaryExpr):
            left, right = node.lhs, node.rhs
            if isinstance(left, promql.NumberLiteral) and isinstance(right, promql.NumberLiteral):
                found.append(eval(f"{left.val} {node.op} {right.val}"))

    promql.walk(promql.parse(expr), visit)
    return found


def test_the_dashboard_queries_registered_metrics() -> None:
    names = registered()
    dashboard = json.loads((COMPONENT / "grafana-dashboard.json").read_text("utf-8"))
    targets = [
        (panel["title"], target["expr"])
        for panel in dashboard["panels"]
        for target in panel.get("targets") or []
    ]
    assert len(targets) >= 15
    for title, expr in targets:
        _check_expr(expr, names, f"panel {title!r}")
    # A panel for each alert's subject, at least.
    shown = {s.name for _, expr in targets for s in selectors(expr)}
    assert {s.name for rule in alerts() for s in selectors(rule["expr"])} <= shown


def test_the_chart_ships_the_same_rules_and_dashboard() -> None:
    chart_rules = yaml.safe_load((CHART / "files" / "alerts.yaml").read_text("utf-8"))
    assert chart_rules == {"groups": component_rules()["spec"]["groups"]}
    dashboard = "grafana-dashboard.json"
    assert (CHART / "files" / dashboard).read_bytes() == (COMPONENT / dashboard).read_bytes()


def test_metrics_services_reach_both_processes_health_ports() -> None:
    docs = render("overlays/self-signed")
    for component, port in (("webhook", 8080), ("reconciler", 8081)):
        service = one(docs, "Service", f"coschedule-{component}-metrics")
        assert service["metadata"]["labels"]["coschedule.dev/metrics"] == "true"
        (entry,) = service["spec"]["ports"]
        assert entry["name"] == "http-metrics"
        assert entry["port"] == port
        deployment = one(docs, "Deployment", f"coschedule-{component}")
        assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports[entry["targetPort"]] == port
        args = " ".join(container["args"])
        assert f"--health-port={port}" in args
    # The API server's Service is not scraped.
    assert (
        "coschedule.dev/metrics"
        not in one(docs, "Service", "coschedule-webhook")["metadata"]["labels"]
    )


def _build_with_component(tmp_path: Path) -> list[Obj]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("no kubectl to render the component with")
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(ROOT / "manifests/overlays/self-signed", overlay)],
                "components": [os.path.relpath(COMPONENT, overlay)],
            }
        )
    )
    done = subprocess.run(
        [kubectl, "kustomize", "--load-restrictor=LoadRestrictionsNone", str(overlay)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if isinstance(d, dict)]


def test_the_component_scrapes_both_metrics_services(tmp_path: Path) -> None:
    docs = _build_with_component(tmp_path)
    (monitor,) = objects(docs, "ServiceMonitor")
    assert monitor["metadata"]["namespace"] == NAMESPACE
    wanted = monitor["spec"]["selector"]["matchLabels"]
    scraped = [
        s
        for s in objects(docs, "Service")
        if all(s["metadata"]["labels"].get(k) == v for k, v in wanted.items())
    ]
    assert sorted(s["metadata"]["name"] for s in scraped) == [
        "coschedule-reconciler-metrics",
        "coschedule-webhook-metrics",
    ]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert all(endpoint["port"] == s["spec"]["ports"][0]["name"] for s in scraped)
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [NAMESPACE]
    (dashboard,) = [
        c for c in objects(docs, "ConfigMap") if c["metadata"]["name"].endswith("dashboard")
    ]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    json.loads(dashboard["data"]["coschedule.json"])


def test_the_chart_renders_monitoring_only_when_asked() -> None:
    assert not objects(render_chart({}), "ServiceMonitor")
    assert not objects(render_chart({}), "PrometheusRule")
    docs = render_chart(
        {
            "metrics": {
                "serviceMonitor": {"enabled": True, "labels": {"release": "prom"}},
                "prometheusRule": {"enabled": True},
                "dashboard": {"enabled": True},
            }
        }
    )
    (monitor,) = objects(docs, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    (rule,) = objects(docs, "PrometheusRule")
    assert rule["spec"] == component_rules()["spec"]
    (dashboard,) = [c for c in objects(docs, "ConfigMap") if "dashboard" in c["metadata"]["name"]]
    assert json.loads(dashboard["data"]["coschedule.json"])["uid"] == "coschedule"
