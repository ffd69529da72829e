"""Prometheus instruments, on a registry per process (no module-level globals)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, disable_created_metrics

from coschedule.config.store import last_reload_gauge, reload_errors_counter
from coschedule.probes import cache_stale_gauge
from coschedule.server.admission_metrics import AdmissionMetrics


class WebhookMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        # No ``<name>_created`` series beside each counter and histogram: a sample per label
        # set that only says when the process started. prometheus_client's switch is
        # process-wide; every registry of the process is built here.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = registry if registry is not None else CollectorRegistry()
        # The admission counter and histograms: plain counts, rendered at scrape time.
        self.admissions = AdmissionMetrics(self.registry)
        self.config_reload_errors = reload_errors_counter(self.registry)
        self.config_last_reload_success = last_reload_gauge(self.registry)
        self.cache_stale = cache_stale_gauge(self.registry)
        self.cert_reloads = Counter(
            "coschedule_certificate_reloads_total",
            "Serving certificate reloads, by result.",
            ["result"],
            registry=self.registry,
        )
        self.cert_not_after = Gauge(
            "coschedule_certificate_expiry_timestamp_seconds",
            "notAfter of the serving certificate in use, as a Unix time.",
            registry=self.registry,
        )

    def count_request(self, mode: str, allowed: bool, code: int) -> None:
        """A request answered without a decision timed (refused before or by decoding)."""
        self.admissions.record((mode, "true" if allowed else "false", str(code)))
