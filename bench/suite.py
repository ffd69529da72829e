"""The whole benchmark, in order: decide cost, floor ratio, max throughput, open-loop latency
(1 core and 2 workers), CPU and memory, the leak check, the reconciler. Returns one dict
(written as bench/results/latest.json); ``bench.report`` turns it into the table."""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Final

import orjson

from bench import appcost, interp, phases
from bench import decide as decide_bench
from bench.loadgen import ClosedResult, run_closed, run_openloop, wrk_path, wrk_version
from bench.payloads import (
    ROOT,
    denied_pod,
    fat_pod,
    not_selected_pod,
    review_bytes,
    small_pod,
    tekton_pod,
)
from bench.servers import Server, expected_answer, loadavg, machine
from coschedule import certs

MIB: Final[float] = 1024.0 * 1024.0

# (name, payload, dryRun): the review bodies of the closed-loop table.
VARIANTS: Final[list[tuple[str, Callable[[], dict[str, Any]], bool]]] = [
    ("small", small_pod, False),
    ("tekton", tekton_pod, False),
    ("fat", fat_pod, False),
    ("tekton dryRun", tekton_pod, True),
    ("not-selected", not_selected_pod, False),
]
RATIO_PAYLOAD: Final[str] = "tekton"


@dataclass(frozen=True, slots=True)
class Plan:
    quick: bool = False
    ratio_rounds: int = 3
    closed_seconds: int = 10
    warmup_seconds: int = 3
    wrk_connections: int = 32
    open_rates: tuple[int, ...] = (100, 500, 1000, 2000)
    open_seconds: float = 10.0
    open_warmup: float = 1.0
    open_rounds: int = 3
    open_connections: int = 64
    leak_requests: int = 1_000_000
    churn_runs: int = 10
    use_wrk: bool = True
    reconciler: bool = True
    server_cpus: tuple[int, ...] = ()  # filled from the affinity mask when empty
    client_cpu: int | None = None


QUICK: Final[Plan] = Plan(
    quick=True,
    ratio_rounds=1,
    closed_seconds=1,
    warmup_seconds=1,
    open_seconds=1.0,
    open_warmup=0.2,
    open_rounds=1,
    open_connections=16,
    leak_requests=20_000,
    churn_runs=3,
)


def cpu_layout(plan: Plan) -> Plan:
    """Server on the first core, load generator on the second; 2 workers take both cores
    when there is no third, and then the generator floats (said in the results)."""
    if plan.server_cpus:
        return plan
    cores = sorted(os.sched_getaffinity(0))
    client = (
        plan.client_cpu if plan.client_cpu is not None else (cores[1] if len(cores) > 1 else None)
    )
    return replace(plan, server_cpus=(cores[0],), client_cpu=client)


def two_worker_layout(plan: Plan) -> tuple[list[int | None], int | None]:
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) >= 3:
        return [cores[0], cores[1]], cores[2]
    if len(cores) == 2:
        return [cores[0], cores[1]], None
    return [None, None], None


class Log:
    def __init__(self) -> None:
        self.start = time.monotonic()

    def __call__(self, message: str) -> None:
        print(f"[{time.monotonic() - self.start:6.1f}s] {message}", file=sys.stderr, flush=True)


@dataclass
class Workspace:
    root: Path
    cert_dir: Path
    bodies: dict[str, Path]
    log_dir: Path

    def body(self, name: str) -> bytes:
        return self.bodies[name].read_bytes()


@contextlib.contextmanager
def workspace() -> Iterator[Workspace]:
    with tempfile.TemporaryDirectory(prefix="coschedule-bench-") as tmp:
        root = Path(tmp)
        cert_dir = root / "tls"
        certs.write_bundle(certs.generate(["localhost", "127.0.0.1"]), cert_dir)
        bodies = {}
        for name, make, dry_run in VARIANTS:
            path = root / f"{name.replace(' ', '-')}.json"
            path.write_bytes(review_bytes(make(), dry_run=dry_run))
            bodies[name] = path
        log_dir = root / "logs"
        log_dir.mkdir()
        yield Workspace(root, cert_dir, bodies, log_dir)


def _closed_row(
    server: Server,
    ws: Workspace,
    payload: str,
    plan: Plan,
    client_cpu: int | None,
    *,
    connection_close: bool = False,
    seconds: int | None = None,
) -> dict[str, Any]:
    server.check(ws.body(payload))  # a fast wrong answer is worth nothing
    before = server.cpu_seconds()
    result = run_closed(
        server.port,
        ws.bodies[payload],
        seconds or plan.closed_seconds,
        plan.wrk_connections,
        client_cpu,
        use_wrk=plan.use_wrk,
        connection_close=connection_close,
    )
    spent = server.cpu_seconds() - before
    return {
        "server": server.app,
        "workers": len(server.cpus),
        "payload": payload,
        "connection": "close" if connection_close else "keep-alive",
        "connections": plan.wrk_connections,
        **result.to_json(),
        "cpu_s_per_1000": _per_1000(spent, result.requests),
        # Below 1.0 at max throughput, something else ran on the server's core(s).
        "server_cpu_share": round(spent / (result.seconds * len(server.cpus)), 3)
        if result.seconds
        else None,
    }


def _per_1000(cpu_s: float, requests: int) -> float | None:
    return round(cpu_s / requests * 1000, 4) if requests else None


def _warm(server: Server, ws: Workspace, plan: Plan, client_cpu: int | None) -> None:
    # Every code path once, then the ratio payload: imports, caches and the allocator settle.
    for payload in ("fat", "small", "not-selected", "tekton"):
        run_closed(
            server.port,
            ws.bodies[payload],
            plan.warmup_seconds if payload == RATIO_PAYLOAD else 1,
            plan.wrk_connections,
            client_cpu,
            use_wrk=plan.use_wrk,
        )


def _open_rows(
    server: Server, ws: Workspace, plan: Plan, client_cpu: int | None, log: Log
) -> list[dict[str, Any]]:
    """Every rate, round-robin for ``open_rounds`` rounds (so a burst of other work on the
    machine spoils one round of one rate, not a whole rate); per rate, the median of each
    percentile over the rounds and the true max."""
    runs: dict[int, list[dict[str, Any]]] = {rate: [] for rate in plan.open_rates}
    for index in range(plan.open_rounds):
        for rate in plan.open_rates:
            row = _open_once(server, ws, rate, plan, client_cpu)
            runs[rate].append(row)
            log(
                f"open loop {server.app} x{len(server.cpus)} {rate}/s round {index + 1}: "
                f"p99 {row['latency_ms'].get('p99')} ms, errors {row['errors']}"
            )
    return [_merge_rounds(rounds) for rounds in runs.values()]


def _merge_rounds(runs: list[dict[str, Any]]) -> dict[str, Any]:
    def median_of(key: str) -> dict[str, float]:
        names = {name for run in runs for name in run[key]}
        merged = {
            name: round(statistics.median(run[key][name] for run in runs if name in run[key]), 3)
            for name in sorted(names)
        }
        if "max" in names:
            merged["max"] = max(run[key]["max"] for run in runs if "max" in run[key])
        return merged

    return {
        **runs[0],
        "rounds": len(runs),
        "measured": sum(run["measured"] for run in runs),
        "ok": sum(run["ok"] for run in runs),
        "errors": sum(run["errors"] for run in runs),
        "achieved_rps": statistics.median(run["achieved_rps"] for run in runs),
        "latency_ms": median_of("latency_ms"),
        "send_lag_ms": median_of("send_lag_ms"),
        "queued": sum(run["queued"] for run in runs),
        "max_in_flight": max(run["max_in_flight"] for run in runs),
        "body_ok": all(run["body_ok"] for run in runs),
        "cpu_s_per_1000": statistics.median(
            run["cpu_s_per_1000"] for run in runs if run["cpu_s_per_1000"] is not None
        ),
        "per_round": [
            {"latency_ms": run["latency_ms"], "send_lag_ms": run["send_lag_ms"]} for run in runs
        ],
    }


def _open_once(
    server: Server, ws: Workspace, rate: int, plan: Plan, client_cpu: int | None
) -> dict[str, Any]:
    payload = RATIO_PAYLOAD
    expected = expected_answer(server.app, ws.body(payload)).decode()
    before = server.cpu_seconds()
    data = run_openloop(
        server.port,
        ws.bodies[payload],
        cpu=client_cpu,
        rate=rate,
        seconds=plan.open_seconds,
        warmup=plan.open_warmup,
        connections=plan.open_connections,
        ca_file=ws.cert_dir / "ca.crt",
    )
    spent = server.cpu_seconds() - before
    sent = int(plan.open_warmup * rate) + int(plan.open_seconds * rate)
    return {
        "server": server.app,
        "workers": len(server.cpus),
        "payload": payload,
        "rate": rate,
        "measured": data["measured"],
        "ok": data["ok"],
        "errors": data["errors"],
        "achieved_rps": round(data["achieved_rps"], 1),
        "latency_ms": {k: round(v, 3) for k, v in data["latency_ms"].items()},
        "send_lag_ms": {k: round(v, 3) for k, v in data["send_lag_ms"].items()},
        "queued": data["queued"],
        "max_in_flight": data["max_in_flight"],
        "connections": plan.open_connections,
        "generator_cpu": client_cpu,
        "body_ok": data["sample_body"] == expected,
        "cpu_s_per_1000": _per_1000(spent, sent),
    }


def bench_decide(quick: bool) -> list[dict[str, Any]]:
    if not quick:
        return decide_bench.measure()
    # A smoke run only checks that the figures come out: a far smaller timing budget.
    short = functools.partial(decide_bench.per_call_us, rounds=3, budget=0.02)
    with _patched(decide_bench, "per_call_us", short):
        return decide_bench.measure()


@contextlib.contextmanager
def _pinned(cpu: int | None) -> Iterator[None]:
    """This process on the server's core for in-process timings (servers are not running
    then), back to where it was after."""
    before = os.sched_getaffinity(0)
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


@contextlib.contextmanager
def _patched(module: Any, name: str, value: object) -> Iterator[None]:
    old = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, old)


def bench_ratio(
    webhook: Server, floor: Server, ws: Workspace, plan: Plan, log: Log
) -> dict[str, Any]:
    """A/B/A/B on the same payload, same core, same generator; medians."""
    rounds = []
    for index in range(plan.ratio_rounds):
        pair = {}
        for server in (webhook, floor):
            row = _closed_row(server, ws, RATIO_PAYLOAD, plan, plan.client_cpu)
            pair[server.app] = row
            log(f"ratio round {index + 1}/{plan.ratio_rounds}: {server.app} {row['rps']:,.0f}/s")
        rounds.append(pair)
    webhook_rps = statistics.median(r["webhook"]["rps"] for r in rounds)
    floor_rps = statistics.median(r["floor"]["rps"] for r in rounds)
    # CPU per admission does not care how much of its core the server was given, so it
    # stays honest on a busy machine where throughput does not.
    webhook_cpu = statistics.median(r["webhook"]["cpu_s_per_1000"] for r in rounds)
    floor_cpu = statistics.median(r["floor"]["cpu_s_per_1000"] for r in rounds)
    return {
        "webhook_cpu_us": round(webhook_cpu * 1000, 1),
        "floor_cpu_us": round(floor_cpu * 1000, 1),
        "cpu_ratio": round(floor_cpu / webhook_cpu, 3) if webhook_cpu else None,
        "payload": RATIO_PAYLOAD,
        "rounds": rounds,
        "webhook_rps": round(webhook_rps, 1),
        "floor_rps": round(floor_rps, 1),
        "ratio": round(webhook_rps / floor_rps, 3) if floor_rps else None,
        "per_round": [
            round(r["webhook"]["rps"] / r["floor"]["rps"], 3) if r["floor"]["rps"] else None
            for r in rounds
        ],
    }


def bench_logging(ws: Workspace, plan: Plan, log: Log) -> dict[str, Any]:
    """What logging costs: the webhook at INFO (the default; JSON lines to a file) against
    the webhook with logging disabled, A/B interleaved on one core, on the Tekton review
    (allowed: nothing is logged, one level check) and on a denied one (one INFO line each)."""
    path = ws.root / "denied.json"
    path.write_bytes(review_bytes(denied_pod()))
    ws.bodies["denied"] = path
    cpu: list[int | None] = [plan.server_cpus[0]]
    out: dict[str, Any] = {}
    with (
        Server("webhook", ws.cert_dir, cpu, log_dir=ws.log_dir, log_level="info") as info,
        Server("webhook", ws.cert_dir, cpu, log_dir=ws.log_dir, log_level="off") as off,
    ):
        for server in (info, off):
            server.start(ws.body(RATIO_PAYLOAD))
            _warm(server, ws, plan, plan.client_cpu)
        for payload in (RATIO_PAYLOAD, "denied"):
            rounds = []
            for index in range(plan.ratio_rounds):
                pair = {}
                for server in (info, off):
                    row = _closed_row(server, ws, payload, plan, plan.client_cpu)
                    pair[server.log_level] = row
                    log(
                        f"logging {payload} round {index + 1}/{plan.ratio_rounds}: "
                        f"{server.log_level} {row['rps']:,.0f}/s"
                    )
                rounds.append(pair)
            info_rps = statistics.median(r["info"]["rps"] for r in rounds)
            off_rps = statistics.median(r["off"]["rps"] for r in rounds)
            info_cpu = statistics.median(r["info"]["cpu_s_per_1000"] for r in rounds)
            off_cpu = statistics.median(r["off"]["cpu_s_per_1000"] for r in rounds)
            # Each round's pair ran back to back: the median of the paired ratios is less
            # at the mercy of other work on the machine than a ratio of two medians.
            per_round = [r["off"]["rps"] / r["info"]["rps"] for r in rounds if r["info"]["rps"]]
            cpu_per_round = [
                r["info"]["cpu_s_per_1000"] / r["off"]["cpu_s_per_1000"]
                for r in rounds
                if r["off"]["cpu_s_per_1000"]
            ]
            out[payload] = {
                "info_rps": round(info_rps, 1),
                "off_rps": round(off_rps, 1),
                # > 0: logging at INFO is slower by this much (median of the paired rounds).
                "cost_pct": round((statistics.median(per_round) - 1) * 100, 1)
                if per_round
                else None,
                "info_cpu_us": round(info_cpu * 1000, 1),
                "off_cpu_us": round(off_cpu * 1000, 1),
                "cpu_cost_pct": round((statistics.median(cpu_per_round) - 1) * 100, 1)
                if cpu_per_round
                else None,
                "per_round_cost_pct": [round((x - 1) * 100, 1) for x in per_round],
            }
    return out


def _sample_rss(
    server: Server, every: float, stop: threading.Event, into: list[tuple[float, float, float]]
) -> None:
    """(seconds, server CPU seconds, RSS MiB) every ``every`` seconds until ``stop``."""
    start = time.monotonic()
    while not stop.wait(every):
        into.append((time.monotonic() - start, server.cpu_seconds(), server.rss_bytes() / MIB))


def bench_leak(ws: Workspace, plan: Plan, log: Log) -> dict[str, Any]:
    """A fresh webhook, warmed up; then N requests over one set of keep-alive connections
    (kube-apiserver's pattern) with RSS sampled as they go. Requests at each sample are
    prorated by server CPU time, which grows with the requests served."""
    payload = RATIO_PAYLOAD
    with Server("webhook", ws.cert_dir, list(plan.server_cpus), log_dir=ws.log_dir) as server:
        server.start(ws.body(payload))
        _warm(server, ws, plan, plan.client_cpu)
        rate = run_closed(
            server.port,
            ws.bodies[payload],
            plan.warmup_seconds,
            plan.wrk_connections,
            plan.client_cpu,
            use_wrk=plan.use_wrk,
        ).rps
        rss_warm = server.rss_bytes() / MIB
        cpu_before = server.cpu_seconds()
        total = 0
        samples: list[tuple[float, float, float]] = [(0.0, cpu_before, rss_warm)]
        while total < plan.leak_requests:
            # 20 % over the estimate: one run, one connection set, even if the rate dips.
            seconds = max(1, math.ceil((plan.leak_requests - total) / max(rate, 1) * 1.2))
            log(f"leak check: {plan.leak_requests - total:,} more requests, ~{seconds} s")
            stop = threading.Event()
            sampler = threading.Thread(
                target=_sample_rss, args=(server, max(0.5, seconds / 20), stop, samples)
            )
            sampler.start()
            try:
                result: ClosedResult = run_closed(
                    server.port,
                    ws.bodies[payload],
                    seconds,
                    plan.wrk_connections,
                    plan.client_cpu,
                    use_wrk=plan.use_wrk,
                )
            finally:
                stop.set()
                sampler.join()
            if result.errors:
                raise RuntimeError(f"leak run: {result.errors} errors")
            total += result.requests
            rate = result.rps
        server.check(ws.body(payload))  # still right after all of it
        cpu_spent = server.cpu_seconds() - cpu_before
        rss_end = server.rss_bytes() / MIB
    per_request_cpu = cpu_spent / total if total else 0.0
    checkpoints: list[dict[str, Any]] = [
        {
            "seconds": round(t, 1),
            "requests": min(total, round((cpu - cpu_before) / per_request_cpu))
            if per_request_cpu
            else 0,
            "rss_mib": round(rss, 2),
        }
        for t, cpu, rss in samples
    ]
    checkpoints.append({"seconds": None, "requests": total, "rss_mib": round(rss_end, 2)})
    half = min(checkpoints, key=lambda c: abs(c["requests"] - total / 2))
    log(f"leak check: {total:,} requests, RSS {rss_warm:.1f} -> {rss_end:.1f} MiB")
    return {
        "payload": payload,
        "requests": total,
        "connections": plan.wrk_connections,
        "rss_after_warmup_mib": round(rss_warm, 2),
        "rss_after_mib": round(rss_end, 2),
        "growth_mib": round(rss_end - rss_warm, 2),
        "growth_second_half_mib": round(rss_end - half["rss_mib"], 2),
        "checkpoints": checkpoints,
        "cpu_s_per_1000": _per_1000(cpu_spent, total),
    }


def bench_churn(ws: Workspace, plan: Plan, log: Log) -> dict[str, Any]:
    """RSS growth per load run that ends with every connection aborted mid-request (how a
    load tool stops; kube-apiserver does it on a webhook timeout), webhook beside floor:
    growth both show comes from the server stack, not from our code."""
    out: dict[str, Any] = {"runs": plan.churn_runs, "connections": plan.wrk_connections}
    for app in ("webhook", "floor"):
        with Server(app, ws.cert_dir, list(plan.server_cpus), log_dir=ws.log_dir) as server:
            server.start(ws.body(RATIO_PAYLOAD))
            _warm(server, ws, plan, plan.client_cpu)
            before = server.rss_bytes() / MIB
            for _ in range(plan.churn_runs):
                run_closed(
                    server.port,
                    ws.bodies[RATIO_PAYLOAD],
                    1,
                    plan.wrk_connections,
                    plan.client_cpu,
                    use_wrk=plan.use_wrk,
                )
            after = server.rss_bytes() / MIB
        out[app] = {
            "rss_before_mib": round(before, 2),
            "rss_after_mib": round(after, 2),
            "mib_per_run": round((after - before) / plan.churn_runs, 3),
        }
        log(f"churn: {app} {out[app]['mib_per_run']} MiB per run")
    return out


def _bench_module(module: str, quick: bool, out_dir: Path, log: Log) -> dict[str, Any]:
    """Run ``python -m bench.<module> --json FILE [--quick]`` in its own process (a clean
    RSS, its own event loop) and take its figures as they are."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", f"bench.{module}"]
    usage = subprocess.run(
        [*command, "--help"], capture_output=True, text=True, env=env, cwd=ROOT, check=False
    ).stdout
    json_file = out_dir / f"{module}.json"
    json_file.unlink(missing_ok=True)
    command += ["--json", str(json_file)]
    if quick and "--quick" in usage:
        command.append("--quick")
    log(f"{module} benchmark: {' '.join(command[1:])}")
    done = subprocess.run(
        command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=1800, check=False
    )
    if done.returncode != 0 or not json_file.exists():
        return {
            "available": True,
            "failed": True,
            "note": f"bench.{module} exited {done.returncode}: {done.stderr.strip()[-1500:]}",
        }
    figures: dict[str, Any] = orjson.loads(json_file.read_bytes())
    return {"available": True, "failed": False, "command": command[1:], "results": figures}


def bench_reconciler(quick: bool, out_dir: Path, log: Log) -> dict[str, Any]:
    """The other half of the benchmarks lives in bench/reconciler.py; run it when present."""
    if not (ROOT / "bench" / "reconciler.py").exists():
        log("reconciler benchmark not available")
        return {"available": False, "note": "reconciler benchmark not available"}
    return _bench_module("reconciler", quick, out_dir, log)


def bench_concurrency(quick: bool, out_dir: Path, log: Log) -> dict[str, Any]:
    """Run concurrency control (bench/concurrency.py); its e2e latency part runs when
    KUBEBUILDER_ASSETS names a control plane."""
    return _bench_module("concurrency", quick, out_dir, log)


def source() -> dict[str, Any]:
    """Which code was measured: the commit, and how many files differ from it (read only)."""

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", *args], capture_output=True, text=True, cwd=ROOT, check=False, timeout=30
        )
        return done.stdout.strip() if done.returncode == 0 else ""

    status = git("status", "--porcelain", "--untracked-files=no")
    return {
        "commit": git("rev-parse", "--short", "HEAD") or "unknown",
        "modified_files": len(status.splitlines()) if status else 0,
    }


def run(plan: Plan, out_dir: Path) -> dict[str, Any]:
    log = Log()
    plan = cpu_layout(plan)
    tool = f"wrk ({wrk_version()})" if plan.use_wrk else "bench.openloop (--no-wrk)"
    if plan.use_wrk and wrk_path() is None:
        log("wrk is not installed (apt-get install wrk): closed-loop runs use bench.openloop")
        plan = replace(plan, use_wrk=False)
        tool = "bench.openloop (wrk is not installed)"
    out_dir.mkdir(parents=True, exist_ok=True)
    started = dt.datetime.now(dt.UTC)
    results: dict[str, Any] = {
        "date": started.isoformat(timespec="seconds"),
        "machine": machine(),
        "load_before": loadavg(),
        "plan": asdict(plan),
        "closed_loop_tool": tool,
        "webhook_mode": "pipelineruns (no cluster: claims not rewritten)",
        "source": source(),
    }
    server_cpu = plan.server_cpus[0]
    log(f"server core {server_cpu}, generator core {plan.client_cpu}, load {loadavg():.2f}")

    log("pure decide cost")
    with _pinned(server_cpu):
        results["decide"] = bench_decide(plan.quick)
        log("µs per phase of one admission")
        results["phases"] = (
            phases.measure(budget=0.02, cold_calls=50) if plan.quick else phases.measure()
        )

    with workspace() as ws:
        log("ASGI app cost in process")
        with _pinned(server_cpu):
            results["app_cost"] = (
                appcost.measure(ws.cert_dir, rounds=3, budget=0.02, cold_calls=100)
                if plan.quick
                else appcost.measure(ws.cert_dir)
            )
        log("Python run per admission (bench.interp, a fresh process)")
        with _pinned(server_cpu):
            loop, rounds = (200, 3) if plan.quick else (interp.LOOP, interp.ROUNDS)
            results["interp"] = interp.summary(interp.compare(None, 1, loop, rounds)["now"])
        with (
            Server("webhook", ws.cert_dir, [server_cpu], log_dir=ws.log_dir) as webhook,
            Server("floor", ws.cert_dir, [server_cpu], log_dir=ws.log_dir) as floor,
        ):
            webhook.start(ws.body(RATIO_PAYLOAD))
            floor.start(ws.body(RATIO_PAYLOAD))
            for server in (webhook, floor):
                _warm(server, ws, plan, plan.client_cpu)
            results["rss_after_warmup_mib"] = round(webhook.rss_bytes() / MIB, 2)
            results["floor_rss_after_warmup_mib"] = round(floor.rss_bytes() / MIB, 2)

            results["ratio"] = bench_ratio(webhook, floor, ws, plan, log)

            closed: list[dict[str, Any]] = []
            for name, _, _ in VARIANTS:
                for server in (webhook, floor):
                    if server is floor and name == "tekton dryRun":
                        continue  # the floor does not read dryRun: same as tekton
                    if name == RATIO_PAYLOAD:
                        rows = [r[server.app] for r in results["ratio"]["rounds"]]
                        row = sorted(rows, key=lambda r: r["rps"])[len(rows) // 2]
                    else:
                        row = _closed_row(server, ws, name, plan, plan.client_cpu)
                    closed.append(row)
                    log(f"closed loop {server.app} {name}: {row['rps']:,.0f}/s")
            for server in (webhook, floor):
                row = _closed_row(
                    server, ws, RATIO_PAYLOAD, plan, plan.client_cpu, connection_close=True
                )
                closed.append(row)
                log(f"closed loop {server.app} Connection: close: {row['rps']:,.0f}/s")

            opened: list[dict[str, Any]] = []
            for server in (webhook, floor):
                opened += _open_rows(server, ws, plan, plan.client_cpu, log)
            # How much the project's generator itself can push (against the floor), to
            # show it is not what limits the open-loop figures.
            ceiling = run_closed(
                floor.port,
                ws.bodies[RATIO_PAYLOAD],
                plan.closed_seconds,
                plan.open_connections,
                plan.client_cpu,
                use_wrk=False,
            )
            results["generator_ceiling"] = ceiling.to_json()
            log(f"bench.openloop closed loop against the floor: {ceiling.rps:,.0f}/s")

        workers, client = two_worker_layout(plan)
        with Server("webhook", ws.cert_dir, workers, log_dir=ws.log_dir) as webhook2:
            webhook2.start(ws.body(RATIO_PAYLOAD))
            _warm(webhook2, ws, plan, client)
            for close in (False, True):
                row = _closed_row(webhook2, ws, RATIO_PAYLOAD, plan, client, connection_close=close)
                row["generator_cpu"] = client
                closed.append(row)
                log(f"closed loop webhook 2 workers close={close}: {row['rps']:,.0f}/s")
            opened += _open_rows(webhook2, ws, plan, client, log)
        results["two_workers_layout"] = {"worker_cpus": workers, "generator_cpu": client}
        results["closed_loop"] = closed
        results["open_loop"] = opened

        log("logging cost: INFO against logging off")
        results["logging"] = bench_logging(ws, plan, log)

        log(f"leak check: {plan.leak_requests:,} requests")
        results["leak"] = bench_leak(ws, plan, log)
        results["churn"] = bench_churn(ws, plan, log)

    results["reconciler"] = (
        bench_reconciler(plan.quick, out_dir, log)
        if plan.reconciler
        else {
            "available": False,
            "note": "reconciler benchmark skipped",
        }
    )
    results["concurrency"] = bench_concurrency(plan.quick, out_dir, log)
    results["load_after"] = loadavg()
    results["elapsed_s"] = round(time.monotonic() - log.start, 1)
    return results
