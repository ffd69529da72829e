"""The hot-path comparison alone: webhook against the bare-ASGI TLS floor, interleaved.

``python -m bench.hotpath [--rounds 7] [--connections 16] [--rate 1000] [--baseline DIR]``

What ``make bench``'s ratio and open-loop steps measure, on the Tekton review only, in a few
minutes: each round runs every server in turn (closed loop at max throughput with
``--connections`` kept busy, then the open loop at ``--rate`` reviews/s), so a burst of
other work on the machine spoils one round of each, not one server. Servers, payload,
answer checks, generators and CPU layout are ``make bench``'s own (bench.suite): server on
the first core, generator on the second; wrk when installed, else bench.openloop's closed
loop. Prints the medians and every round, and with ``--json`` writes them.

``--baseline DIR``: a third server, the webhook from another checkout (a tree holding
``coschedule/`` and ``bench/``, e.g. ``git archive`` of an earlier commit), in the same
rounds: before and after a change under the same machine state. It must give the same
answer as this checkout's webhook (the check fails the run otherwise).
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson

from bench.servers import Server, loadavg
from bench.suite import (
    RATIO_PAYLOAD,
    Log,
    Plan,
    _closed_row,
    _open_once,
    _warm,
    cpu_layout,
    source,
    workspace,
)


@dataclass
class Entry:
    name: str  # "webhook", "baseline" or "floor"
    server: Server


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def run(args: argparse.Namespace) -> dict[str, Any]:
    log = Log()
    plan = cpu_layout(
        replace(
            Plan(),
            closed_seconds=args.seconds,
            wrk_connections=args.connections,
            open_seconds=args.open_seconds,
            open_connections=args.open_connections,
        )
    )
    from bench.loadgen import wrk_path

    if wrk_path() is None:
        plan = replace(plan, use_wrk=False)
    tool = "wrk" if plan.use_wrk else "bench.openloop --closed (wrk is not installed)"
    cpu = plan.server_cpus[0]
    log(f"server core {cpu}, generator core {plan.client_cpu}, {tool}, load {loadavg():.2f}")
    results: dict[str, Any] = {
        "source": source(),
        "load_before": loadavg(),
        "closed_loop_tool": tool,
        "connections": args.connections,
        "rounds": [],
    }
    with workspace() as ws:
        entries = [Entry("webhook", Server("webhook", ws.cert_dir, [cpu], log_dir=ws.log_dir))]
        if args.baseline is not None:
            entries.append(
                Entry(
                    "baseline",
                    Server("webhook", ws.cert_dir, [cpu], log_dir=ws.log_dir, root=args.baseline),
                )
            )
        entries.append(Entry("floor", Server("floor", ws.cert_dir, [cpu], log_dir=ws.log_dir)))
        try:
            for entry in entries:
                entry.server.start(ws.body(RATIO_PAYLOAD))
                _warm(entry.server, ws, plan, plan.client_cpu)
            for index in range(args.rounds):
                row: dict[str, Any] = {}
                for entry in entries:
                    closed = _closed_row(entry.server, ws, RATIO_PAYLOAD, plan, plan.client_cpu)
                    opened = _open_once(entry.server, ws, args.rate, plan, plan.client_cpu)
                    row[entry.name] = {
                        "rps": closed["rps"],
                        "cpu_us": round(closed["cpu_s_per_1000"] * 1000, 1),
                        "errors": closed["errors"] + opened["errors"],
                        "p99_ms": opened["latency_ms"].get("p99"),
                        "p50_ms": opened["latency_ms"].get("p50"),
                        "body_ok": opened["body_ok"],
                    }
                    log(
                        f"round {index + 1}/{args.rounds} {entry.name}: "
                        f"{closed['rps']:,.0f}/s, {row[entry.name]['cpu_us']} µs CPU, "
                        f"p99 at {args.rate}/s {row[entry.name]['p99_ms']} ms"
                    )
                results["rounds"].append(row)
        finally:
            for entry in entries:
                entry.server.stop()
    results["load_after"] = loadavg()
    rounds = results["rounds"]
    summary: dict[str, Any] = {}
    for entry in sorted(entries, key=lambda e: e.name != "floor"):  # the floor first
        name = entry.name
        summary[name] = {
            "rps": round(_median([r[name]["rps"] for r in rounds]), 1),
            "cpu_us": round(_median([r[name]["cpu_us"] for r in rounds]), 1),
            "p99_ms": round(_median([r[name]["p99_ms"] for r in rounds]), 3),
            "p50_ms": round(_median([r[name]["p50_ms"] for r in rounds]), 3),
        }
        if name != "floor":
            per_round = [r[name]["rps"] / r["floor"]["rps"] for r in rounds]
            summary[name]["ratio"] = round(summary[name]["rps"] / summary["floor"]["rps"], 3)
            summary[name]["per_round"] = [round(x, 3) for x in per_round]
            summary[name]["cpu_ratio"] = round(
                summary["floor"]["cpu_us"] / summary[name]["cpu_us"], 3
            )
            summary[name]["p99_over_floor_ms"] = round(
                summary[name]["p99_ms"] - summary["floor"]["p99_ms"], 3
            )
    results["summary"] = summary
    return results


def render(results: dict[str, Any], rate: int) -> str:
    summary = results["summary"]
    lines = [
        f"{len(results['rounds'])} interleaved rounds, Tekton review, c={results['connections']}, "
        f"{results['closed_loop_tool']}; load {results['load_before']} -> {results['load_after']}",
        "",
        f"| server | admissions/s (median) | ÷ floor | per round | CPU µs/admission | ÷ floor "
        f"(CPU) | p99 at {rate}/s | p99 minus floor's |",
        "|---|---:|---:|---|---:|---:|---:|---:|",
    ]
    for name, row in summary.items():
        if name == "floor":
            continue
        lines.append(
            f"| {name} | {row['rps']:,.0f} | {row['ratio']:.2f}x | "
            f"{min(row['per_round']):.2f}-{max(row['per_round']):.2f} | {row['cpu_us']} | "
            f"{row['cpu_ratio']:.2f}x | {row['p99_ms']:.2f} ms | "
            f"{row['p99_over_floor_ms']:+.2f} ms |"
        )
    floor = summary["floor"]
    lines.append(
        f"| floor | {floor['rps']:,.0f} | | | {floor['cpu_us']} | | {floor['p99_ms']:.2f} ms | |"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hotpath", description=__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--seconds", type=int, default=10, help="closed loop per server")
    parser.add_argument("--rate", type=int, default=1000, help="open-loop rate, reviews/s")
    parser.add_argument("--open-seconds", type=float, default=10.0)
    parser.add_argument("--open-connections", type=int, default=64)
    parser.add_argument("--baseline", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # so that the servers are stopped on the way out

    signal.signal(signal.SIGTERM, stop)
    results = run(args)
    text = render(results, args.rate)
    print(text)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
