"""``python -m bench`` (``make bench``): every benchmark, then the table.

Loopback only; every run is bounded in requests and time and stops by itself. Writes
bench/results/latest.json and bench/results/latest.md. ``--quick`` is a smoke run (about a
minute, figures not worth publishing).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import orjson

from bench.payloads import ROOT
from bench.report import render
from bench.servers import loadavg
from bench.suite import QUICK, Plan, run

QUIET_LOAD = 0.6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument(
        "--leak-requests",
        type=int,
        default=None,
        help="requests for the leak check (default 1,000,000; 20,000 with --quick)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument(
        "--no-wrk", action="store_true", help="closed loop with bench.openloop even if wrk exists"
    )
    parser.add_argument("--no-reconciler", action="store_true")
    parser.add_argument(
        "--no-stuck", action="store_true", help="skip the stuck-run relocation timing (e2e)"
    )
    parser.add_argument(
        "--no-scheduler",
        action="store_true",
        help="skip the kube-scheduler cost of co-scheduled pods (bench.scheduler)",
    )
    parser.add_argument(
        "--scheduler-nodes",
        type=int,
        action="append",
        help="cluster sizes for bench.scheduler (default 500; 50 with --quick)",
    )
    parser.add_argument("--server-cpu", type=int, default=None)
    parser.add_argument("--client-cpu", type=int, default=None)
    args = parser.parse_args(argv)

    plan = QUICK if args.quick else Plan()
    if args.leak_requests is not None:
        plan = replace(plan, leak_requests=args.leak_requests)
    if args.no_wrk:
        plan = replace(plan, use_wrk=False)
    if args.no_reconciler:
        plan = replace(plan, reconciler=False)
    if args.server_cpu is not None:
        plan = replace(plan, server_cpus=(args.server_cpu,), client_cpu=args.client_cpu)
    elif args.client_cpu is not None:
        plan = replace(plan, client_cpu=args.client_cpu)

    load = loadavg()
    if load >= QUIET_LOAD:
        print(
            f"warning: 1-minute load average is {load:.2f}; other work on this machine will "
            "distort the figures (the results say so)",
            file=sys.stderr,
        )
    results = run(plan, args.out)
    stuck_text = ""
    if not args.no_stuck:
        from bench import stuck  # runs the e2e relocation scenarios

        results["stuck"] = stuck.measure(1 if args.quick else 2)
        stuck_text = "\n" + stuck.render(results["stuck"]) + "\n"
    scheduler_text = ""
    if not args.no_scheduler:
        from bench import scheduler  # the real kube-scheduler at 1,000 and 5,000 nodes

        scheduler_plan = scheduler.QUICK if args.quick else scheduler.Plan()
        if args.scheduler_nodes:
            scheduler_plan = replace(scheduler_plan, nodes=tuple(args.scheduler_nodes))
        results["scheduler"] = scheduler.measure(scheduler_plan)
        scheduler_text = "\n" + scheduler.render(results["scheduler"]) + "\n"
    table = render(results) + stuck_text + scheduler_text
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "latest.json").write_bytes(
        orjson.dumps(results, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"
    )
    (args.out / "latest.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
