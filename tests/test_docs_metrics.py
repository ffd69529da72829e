"""The metric table of docs/reference.md is the metrics the code registers: every name, its type
and its labels (read from the instruments' constructors in coschedule/), nothing more, nothing
less."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Counter("name", "help", ["label", ...]), Gauge(...), Histogram(...), the custom collector's
# CounterMetricFamily("name", "help", labels=[...]) and its histograms' .family("name", ...).
_INSTRUMENT = re.compile(
    r"\b(Counter|Gauge|Histogram|CounterMetricFamily|GaugeMetricFamily|family)\(\s*"
    r'"(coschedule_[a-z_]+)"(.*?)(?:registry=|\)\n)',
    re.S,
)
_TYPES = {
    "Counter": "counter",
    "CounterMetricFamily": "counter",
    "Gauge": "gauge",
    "GaugeMetricFamily": "gauge",
    "Histogram": "histogram",
    "family": "histogram",
}


def registered() -> dict[str, tuple[str, tuple[str, ...]]]:
    """{exposed name: (type, labels)} from the source of coschedule/."""
    found: dict[str, tuple[str, tuple[str, ...]]] = {}
    for path in sorted((ROOT / "coschedule").rglob("*.py")):
        for kind, name, rest in _INSTRUMENT.findall(path.read_text("utf-8")):
            kind_name = _TYPES[kind]
            labels = re.search(r"\[([^\]]*)\]", rest)
            names = tuple(re.findall(r'"([a-z_]+)"', labels.group(1))) if labels else ()
            if kind_name == "counter" and not name.endswith("_total"):
                name += "_total"  # a counter family is exposed with _total
            found[name] = (kind_name, names)
    return found


def documented() -> dict[str, tuple[str, tuple[str, ...]]]:
    reference = (ROOT / "docs" / "reference.md").read_text("utf-8")
    rows = re.findall(r"^\| `(coschedule_[a-z_]+)(?:\{([a-z_,]+)\})?` \| (\w+) \|", reference, re.M)
    return {name: (kind, tuple(labels.split(",")) if labels else ()) for name, labels, kind in rows}


def test_the_reference_metric_table_is_what_the_code_registers() -> None:
    code, docs = registered(), documented()
    assert len(code) >= 20, sorted(code)
    assert sorted(set(code) - set(docs)) == [], "registered but not in the reference's table"
    assert sorted(set(docs) - set(code)) == [], "in the reference's table but not registered"
    for name, (kind, labels) in code.items():
        assert docs[name] == (kind, labels), name


def test_admission_requests_help_says_what_code_means() -> None:
    from prometheus_client import generate_latest

    from coschedule.server.webhook_metrics import WebhookMetrics

    exposed = generate_latest(WebhookMetrics().registry).decode()
    (help_line,) = [
        line for line in exposed.splitlines() if line.startswith("# HELP coschedule_admission_req")
    ]
    assert "403 denied" in help_line
    assert "HTTP code" not in help_line


def test_the_readme_speaks_of_what_changed_not_of_issue_numbers() -> None:
    readme = (ROOT / "README.md").read_text("utf-8")
    assert re.findall(r"\bissues? \d+", readme) == []


def test_certs_readme_names_the_service_the_manifests_define() -> None:
    import yaml

    services = [
        doc["metadata"]["name"]
        for doc in yaml.safe_load_all((ROOT / "manifests/base/webhook.yaml").read_text("utf-8"))
        if doc and doc.get("kind") == "Service"
    ]
    # The one the API server calls (the other is the metrics Service).
    assert services == ["coschedule-webhook", "coschedule-webhook-metrics"]
    named = re.findall(r"--service (\S+)", (ROOT / "certs/README.md").read_text("utf-8"))
    assert named
    assert set(named) == {"coschedule-webhook"}, named


def test_the_readme_states_what_an_operator_needs_with_the_codes_figures() -> None:
    from coschedule.kube.leader import LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD

    readme = " ".join((ROOT / "README.md").read_text("utf-8").split())
    # The reload delay is the kubelet's ConfigMap sync, not the processes' poll.
    assert "kubelet syncs the ConfigMap volume (about a minute" in readme
    operating = readme.split("## Operating it", 1)[1].split(" ## ", 1)[0]
    assert f"Lease lasts {LEASE_DURATION:g} s, renewed every {RETRY_PERIOD:g} s" in operating
    assert f"after {RENEW_DEADLINE:g} s without renewal" in operating
    assert "While the reconciler is down" in operating
    assert "**Sizing**" in operating
    assert "PersistentVolumeClaims" in operating


def test_no_created_series_is_exported_by_either_process() -> None:
    """prometheus_client writes a ``<name>_created`` sample beside every counter and
    histogram unless told not to; neither process's registry has one."""
    from prometheus_client import generate_latest
    from prometheus_client.metrics import enable_created_metrics

    from coschedule.reconcile.reconciler_metrics import ReconcileMetrics
    from coschedule.server.webhook_metrics import WebhookMetrics

    # prometheus_client's default, as a process starts.
    enable_created_metrics()  # type: ignore[no-untyped-call]
    webhook = WebhookMetrics()
    webhook.cert_reloads.labels("ok").inc()
    webhook.config_reload_errors.inc()
    reconciler = ReconcileMetrics()
    reconciler.reconciles.labels("placeholder").inc()
    reconciler.concurrency.start_delay.observe(1.0)
    for registry in (webhook.registry, reconciler.registry):
        exposed = generate_latest(registry).decode()
        assert "_total" in exposed
        assert [line for line in exposed.splitlines() if "_created" in line] == []
