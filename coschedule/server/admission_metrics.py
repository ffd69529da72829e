"""The admission metrics, kept as plain counts and turned into Prometheus families at scrape.

One admission is one ``record`` call: a dict increment and two bucket increments, no
locks, no label lookups (a prometheus_client Counter and two Histograms cost ~3 µs and
a dozen calls per admission). Admissions and scrapes run on the server's one event loop
thread, so nothing here needs a lock. The exposed names, labels and buckets are those of
prometheus_client's Counter and Histogram (without their ``_created`` samples).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString

# Admission latency in the webhook itself is tens of microseconds; the buckets resolve that
# and the milliseconds a slow apiserver round trip would show.
LATENCY_BUCKETS = (
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
PATCH_OPS_BUCKETS = (0, 1, 2, 3, 4, 5, 6, 8, 10, 15, 20)

Key = tuple[str, str, str]  # (mode, allowed, code) as label values


class _Buckets:
    """A histogram's counts per bucket (the last one is +Inf) and its sum."""

    __slots__ = ("bounds", "counts", "labels", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        # "le" as prometheus_client writes it ("5e-05", "1.0", "+Inf").
        self.labels: list[str] = [
            floatToGoString(b)  # type: ignore[no-untyped-call]
            for b in (*self.bounds, float("inf"))
        ]

    def family(self, name: str, documentation: str) -> HistogramMetricFamily:
        cumulative = 0
        buckets: list[tuple[str, float]] = []
        for label, count in zip(self.labels, self.counts, strict=True):
            cumulative += count
            buckets.append((label, cumulative))
        return HistogramMetricFamily(name, documentation, buckets=buckets, sum_value=self.sum)


class AdmissionMetrics(Collector):
    """``coschedule_admission_requests_total``, ``_duration_seconds`` and ``_patch_ops``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests: dict[Key, int] = {}
        self.duration = _Buckets(LATENCY_BUCKETS)
        self.patch_ops = _Buckets(PATCH_OPS_BUCKETS)
        registry.register(self)

    def record(self, key: Key, seconds: float | None = None, ops: int | None = None) -> None:
        """One answered request; ``seconds`` when it was decided, ``ops`` when admitted."""
        requests = self.requests
        requests[key] = requests.get(key, 0) + 1
        if seconds is not None:
            duration = self.duration
            duration.counts[bisect_left(duration.bounds, seconds)] += 1
            duration.sum += seconds
        if ops is not None:
            patch_ops = self.patch_ops
            patch_ops.counts[bisect_left(patch_ops.bounds, ops)] += 1
            patch_ops.sum += ops

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "coschedule_admission_requests",
            "Admission requests answered, by effective mode, allowed and code: the review's "
            "code for an answered review (200 allowed, 403 denied, both over HTTP 200), else "
            "the HTTP status of the refused request.",
            labels=["mode", "allowed", "code"],
        )
        for key, count in list(self.requests.items()):
            requests.add_metric(key, count)
        yield requests
        yield self.duration.family(
            "coschedule_admission_duration_seconds",
            "Time to decide and encode one admission, from the whole body read to the answer.",
        )
        yield self.patch_ops.family(
            "coschedule_admission_patch_ops", "JSONPatch operations per admitted pod."
        )
