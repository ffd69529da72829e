"""Pure decide cost per pod (µs): the admission hot path without the network.

Two figures per payload: ``decide`` alone (the pod already parsed), and ``handle``, the
whole body-to-body path the server runs (orjson parse, decide, encode, metrics).
Run: ``python -m bench.decide``. Prints a table; ``--json FILE`` writes the figures.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from bench.payloads import fat_pod, not_selected_pod, review_bytes, small_pod, tekton_pod
from coschedule.config.settings import Settings
from coschedule.config.store import SettingsStore
from coschedule.marks import Mode
from coschedule.mutate.decision import AdmissionContext, decide
from coschedule.server.mutate_endpoint import AdmissionHandler
from coschedule.server.webhook_metrics import WebhookMetrics

GOALS_US = {"tekton": 30.0, "fat": 150.0}
PAYLOADS: dict[str, Callable[[], dict[str, Any]]] = {
    "small": small_pod,
    "tekton": tekton_pod,
    "fat": fat_pod,
    "not-selected": not_selected_pod,
}


def per_call_us(fn: Callable[[], object], rounds: int = 7, budget: float = 0.3) -> float:
    """Median over rounds of the mean time per call, in µs."""
    calls = 1
    while True:  # calibrate so that one round takes about `budget` seconds
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        elapsed = time.perf_counter() - start
        if elapsed > budget / 4:
            break
        calls *= 2
    calls = max(1, int(calls * budget / max(elapsed, 1e-9)))
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


def measure(mode: Mode = Mode.PIPELINERUNS) -> list[dict[str, Any]]:
    ctx = AdmissionContext(Settings(mode=mode), "ci", explain=False)  # as the server calls it
    store = SettingsStore(None, {"COSCHEDULE_COSCHEDULE": mode.value})
    handler = AdmissionHandler(store, WebhookMetrics())
    rows = []
    for name, make in PAYLOADS.items():
        pod = make()
        body = review_bytes(pod)
        status, _ = handler.handle(body)
        assert status == 200
        rows.append(
            {
                "payload": name,
                "bytes": len(body),
                "parse_us": per_call_us(functools.partial(orjson.loads, body)),
                "decide_us": per_call_us(functools.partial(decide, pod, ctx)),
                "handle_us": per_call_us(functools.partial(handler.handle, body)),
                "goal_us": GOALS_US.get(name),
                "mode": mode.value,
            }
        )
    return rows


def render(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| payload | bytes | orjson parse µs | decide µs | whole handle µs | goal (decide) |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        goal = row["goal_us"]
        verdict = (
            ""
            if goal is None
            else (f"≤ {goal:.0f} µs {'met' if row['decide_us'] <= goal else 'MISSED'}")
        )
        lines.append(
            f"| {row['payload']} | {row['bytes']} | {row['parse_us']:.1f} | "
            f"{row['decide_us']:.1f} | {row['handle_us']:.1f} | {verdict} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    rows = measure()
    print(render(rows))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_bytes(orjson.dumps(rows, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()
