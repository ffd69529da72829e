"""µs per phase of one Tekton admission, in process: parse, decide, encode, metrics, log.

Each phase is timed hot (in a loop) and cold (one call right after 8 MiB were copied, as
in bench.appcost: a server does TLS and HTTP work between two admissions). Two columns
per phase: ``full``, the way the hot path did it before the lean decoder (orjson parse of
the whole review with ``decode_review``, ``encode_response``, a prometheus_client Counter and
two Histograms), and ``lean``, the way it does now (``wire.lean``, ``encode_allowed``, one
``AdmissionMetrics.record``, one level check). ``decide`` is the same code in both; it gets
the full pod and writes the reasons ``explain`` prints, or gets the lean view and writes
none, as the server calls it. What the server spends beyond these (TLS, HTTP, ASGI) is
its CPU per admission minus the whole handle: ``bench.report`` prints that split.

Run: ``python -m bench.phases``.
"""

from __future__ import annotations

import functools
import logging
import statistics
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from bench.decide import per_call_us
from bench.payloads import review_bytes, tekton_pod
from coschedule.config.store import SettingsStore
from coschedule.mutate.decision import AdmissionContext, decide
from coschedule.server.admission_metrics import (
    LATENCY_BUCKETS,
    PATCH_OPS_BUCKETS,
    AdmissionMetrics,
)
from coschedule.server.pod_endpoint import PodEndpoint
from coschedule.server.webhook_metrics import WebhookMetrics
from coschedule.wire import lean
from coschedule.wire.review import decode_review, encode_allowed, encode_response

PHASES = ("parse", "decide", "encode", "metrics", "log")


def _cold_us(fn: Callable[[], object], calls: int) -> float:
    thrash = bytearray(8 * 1024 * 1024)
    samples = []
    for _ in range(calls):
        bytes(thrash)
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e6


def _prometheus_metrics() -> Callable[[int], None]:
    """The three instruments the hot path used to update, as it updated them."""
    registry = CollectorRegistry()
    requests = Counter("r", "r", ["mode", "allowed", "code"], registry=registry)
    duration = Histogram("d", "d", buckets=LATENCY_BUCKETS, registry=registry)
    patch_ops = Histogram("p", "p", buckets=PATCH_OPS_BUCKETS, registry=registry)
    child = requests.labels("pipelineruns", "true", "200")

    def update(ops: int) -> None:
        patch_ops.observe(ops)
        child.inc()
        duration.observe(0.00004)

    return update


def measure(budget: float = 0.2, cold_calls: int = 1000) -> dict[str, Any]:
    body = review_bytes(tekton_pod())
    store = SettingsStore(None, {"COSCHEDULE_COSCHEDULE": "pipelineruns"})
    full_review = decode_review(body)
    lean_review = lean.decode(body)
    # Before, every admission wrote the reasons explain prints; the server no longer does.
    traced = AdmissionContext(store.current, full_review.namespace)
    ctx = AdmissionContext(store.current, full_review.namespace, explain=False)
    decision = decide(lean_review.object, ctx)
    if not (decision.allowed and decision.ops):
        raise RuntimeError("the Tekton review must be admitted with a patch")
    uid, ops, warnings = lean_review.uid, decision.ops, decision.warnings
    old_metrics = _prometheus_metrics()
    new_metrics = AdmissionMetrics(CollectorRegistry())
    key = ("pipelineruns", "true", "200")
    log = logging.getLogger("coschedule.admission")
    handler = PodEndpoint(store, WebhookMetrics())

    calls: dict[str, tuple[Callable[[], object], Callable[[], object]]] = {
        "parse": (
            functools.partial(decode_review, body),
            functools.partial(lean.decode, body),
        ),
        "decide": (
            functools.partial(decide, full_review.object, traced),
            functools.partial(decide, lean_review.object, ctx),
        ),
        "encode": (
            lambda: encode_response(uid, allowed=True, patch=ops, warnings=warnings),
            functools.partial(encode_allowed, uid, ops, warnings),
        ),
        "metrics": (
            functools.partial(old_metrics, len(ops)),
            functools.partial(new_metrics.record, key, 0.00004, len(ops)),
        ),
        "log": (lambda: None, functools.partial(log.isEnabledFor, logging.DEBUG)),
    }
    rows = []
    for phase in PHASES:
        full, new = calls[phase]
        rows.append(
            {
                "phase": phase,
                "full_hot_us": round(per_call_us(full, budget=budget), 2),
                "lean_hot_us": round(per_call_us(new, budget=budget), 2),
                "full_cold_us": round(_cold_us(full, cold_calls), 2),
                "lean_cold_us": round(_cold_us(new, cold_calls), 2),
            }
        )
    whole = functools.partial(handler.handle, body)
    return {
        "payload": "tekton",
        "phases": rows,
        "handle_hot_us": round(per_call_us(whole, budget=budget), 2),
        "handle_cold_us": round(_cold_us(whole, cold_calls), 2),
    }


def main() -> None:
    result = measure()
    print(f"{'phase':10} {'full hot':>9} {'lean hot':>9} {'full cold':>10} {'lean cold':>10}")
    for row in result["phases"]:
        print(
            f"{row['phase']:10} {row['full_hot_us']:9.2f} {row['lean_hot_us']:9.2f} "
            f"{row['full_cold_us']:10.2f} {row['lean_cold_us']:10.2f}"
        )
    print(
        f"whole handle (lean): hot {result['handle_hot_us']} µs, cold {result['handle_cold_us']} µs"
    )


if __name__ == "__main__":
    main()
