"""Prometheus instruments, on a registry per process (no module-level globals)."""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)

from coschedule.config.store import last_reload_gauge, reload_errors_counter
from coschedule.probes import cache_stale_gauge
from coschedule.server.admission_metrics import AdmissionMetrics

BIND_WAIT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0)


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
        # A run's pod held at admission until its placeholder, on its way, was bound.
        self.bind_waits = Counter(
            "coschedule_placeholder_bind_waits_total",
            "Admissions that waited for the pod's placeholder to be bound, by outcome: "
            "pinned (bound in time: pinned at admission) or gated (not: gated as before).",
            ["outcome"],
            registry=self.registry,
        )
        self.bind_wait_seconds = Histogram(
            "coschedule_placeholder_bind_wait_seconds",
            "How long an admission waited for the pod's placeholder to be bound.",
            buckets=BIND_WAIT_BUCKETS,
            registry=self.registry,
        )

    def count_request(self, mode: str, allowed: bool, code: int) -> None:
        """A request answered without a decision timed (refused before or by decoding)."""
        self.admissions.record((mode, "true" if allowed else "false", str(code)))
