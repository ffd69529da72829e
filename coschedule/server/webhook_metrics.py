"""Prometheus instruments, on a registry per process (no module-level globals)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from coschedule.config.store import last_reload_gauge, reload_errors_counter

# Admission latency in the webhook itself is tens of microseconds; the buckets resolve that
# and the milliseconds a slow apiserver round trip would show.
_LATENCY_BUCKETS = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.5,
    1.0,
)


class WebhookMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.admission_duration = Histogram(
            "coschedule_admission_duration_seconds",
            "Time to decide and encode one admission, from the whole body read to the answer.",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.admission_requests = Counter(
            "coschedule_admission_requests_total",
            "Admission requests answered, by effective mode, allowed and HTTP code.",
            ["mode", "allowed", "code"],
            registry=self.registry,
        )
        self.admission_patch_ops = Histogram(
            "coschedule_admission_patch_ops",
            "JSONPatch operations per admitted pod.",
            buckets=(0, 1, 2, 3, 4, 5, 6, 8, 10, 15, 20),
            registry=self.registry,
        )
        self.config_reload_errors = reload_errors_counter(self.registry)
        self.config_last_reload_success = last_reload_gauge(self.registry)
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
        self._requests_cache: dict[tuple[str, str, str], Counter] = {}

    def count_request(self, mode: str, allowed: bool, code: int) -> None:
        key = (mode, "true" if allowed else "false", str(code))
        child = self._requests_cache.get(key)
        if child is None:
            child = self.admission_requests.labels(*key)
            self._requests_cache[key] = child
        child.inc()
