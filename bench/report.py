"""The results table (Markdown) from the results dict; goals beside each figure.

Run: ``python -m bench.report [bench/results/latest.json]`` prints the table again.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from bench import concurrency as concurrency_bench
from bench import decide as decide_bench

RATIO_GOAL = 0.8
P99_GOAL_MS = 2.0
P99_GOAL_RATE = 1000
LEAK_GOAL_MIB = 2.0  # our own criterion: no growth trend over the second half of the run
RECONCILER_REACTION_GOAL_S = 1.0
RECONCILER_RSS_GOAL_MB = 200.0


@dataclass(frozen=True, slots=True)
class Goal:
    figure: str
    value: str
    goal: str
    met: bool | None  # None: not measured

    @property
    def verdict(self) -> str:
        return "n/a" if self.met is None else ("met" if self.met else "MISSED")


def _num(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "n/a"
    return f"{value:,.{digits}f}"


def _get(row: dict[str, Any] | None, key: str) -> float | None:
    if row is None or row.get(key) is None:
        return None
    return float(row[key])


def _open(results: dict[str, Any], server: str, workers: int, rate: int) -> dict[str, Any] | None:
    for row in results.get("open_loop", []):
        if row["server"] == server and row["workers"] == workers and row["rate"] == rate:
            found: dict[str, Any] = row
            return found
    return None


def _closed(
    results: dict[str, Any], server: str, workers: int, payload: str, connection: str
) -> dict[str, Any] | None:
    for row in results.get("closed_loop", []):
        if (
            row["server"] == server
            and row["workers"] == workers
            and row["payload"] == payload
            and row["connection"] == connection
        ):
            found: dict[str, Any] = row
            return found
    return None


def _decide_row(results: dict[str, Any], payload: str) -> dict[str, Any] | None:
    for row in results.get("decide", []):
        if row["payload"] == payload:
            found: dict[str, Any] = row
            return found
    return None


def _flatten(prefix: str, value: Any) -> Iterable[tuple[str, Any]]:
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from _flatten(f"{prefix}.{key}" if prefix else str(key), inner)
    else:
        yield prefix, value


def _find(figures: dict[str, Any], *words: str) -> tuple[str, float] | None:
    """The first numeric figure whose dotted key holds all ``words``: bench/reconciler.py
    names its own figures, and a renamed one should still be found."""
    for key, value in _flatten("", figures):
        lowered = key.lower()
        if (
            all(w in lowered for w in words)
            and isinstance(value, int | float)
            and not isinstance(value, bool)
        ):
            return key, float(value)
    return None


def reconciler_goals(rec: dict[str, Any]) -> list[Goal]:
    if not rec.get("available") or rec.get("failed"):
        note = rec.get("note", "reconciler benchmark not available")
        return [Goal("reconciler (cordon and first-pod reaction, RSS, API calls)", note, "", None)]
    figures: dict[str, Any] = rec.get("results", {})
    scale = ", ".join(
        f"{figures[k]:,} {k.replace('_', ' ')}"
        for k in ("nodes", "runs", "marked_pods")
        if k in figures
    )
    where = f" ({scale})" if scale else ""
    goals = []
    for label, words in (
        (f"reconciler: node cordon → placeholder pod delete, p99{where}", ("cordon", "p99")),
        ("reconciler: first pod event → StatefulSet create, p99", ("first", "p99")),
    ):
        hit = _find(figures, *words)
        if hit is None:
            goals.append(Goal(label, "not reported", f"≤ {RECONCILER_REACTION_GOAL_S:g} s", None))
            continue
        key, value = hit
        seconds = value / 1000 if "_ms" in key.lower() else value
        goals.append(
            Goal(
                label,
                f"{seconds * 1000:,.1f} ms",
                f"≤ {RECONCILER_REACTION_GOAL_S:g} s",
                seconds <= RECONCILER_REACTION_GOAL_S,
            )
        )
    hit = _find(figures, "rss")
    if hit is None:
        goals.append(Goal("reconciler RSS, caches full", "not reported", "≤ 200 MB", None))
    else:
        key, value = hit
        mb = value / 1e6 if "_mb" not in key.lower() else value
        goals.append(
            Goal(
                "reconciler RSS, caches full",
                f"{mb:,.0f} MB",
                "≤ 200 MB",
                mb <= RECONCILER_RSS_GOAL_MB,
            )
        )
    calls = _find(figures, "calls", "per", "run")
    constant = figures.get("api_calls_constant_per_run")
    if calls is None:
        goals.append(Goal("reconciler API calls per new run", "not reported", "a constant", None))
    else:
        met = bool(constant) if isinstance(constant, bool) else None
        goals.append(
            Goal(
                "reconciler API calls per new run (no periodic relist)",
                f"{calls[1]:g}",
                "a constant",
                met,
            )
        )
    return goals


def goals(results: dict[str, Any]) -> list[Goal]:
    out: list[Goal] = []
    ratio = results.get("ratio", {})
    value = ratio.get("ratio")
    out.append(
        Goal(
            "**webhook ÷ floor**, admissions/s (Tekton review, keep-alive, 1 core, "
            f"median of {len(ratio.get('rounds', []))} A/B rounds)",
            f"**{_num(value, 2)}x** ({_num(ratio.get('webhook_rps'))}/s ÷ "
            f"{_num(ratio.get('floor_rps'))}/s)",
            f"≥ {RATIO_GOAL}x",
            None if value is None else value >= RATIO_GOAL,
        )
    )
    cpu_ratio = ratio.get("cpu_ratio")
    if cpu_ratio is not None:
        out.append(
            Goal(
                "the same ratio by CPU time per admission (floor µs ÷ webhook µs; immune to "
                "other work stealing the core)",
                f"{cpu_ratio:.2f}x ({ratio['floor_cpu_us']:.0f} µs ÷ "
                f"{ratio['webhook_cpu_us']:.0f} µs)",
                f"≥ {RATIO_GOAL}x",
                cpu_ratio >= RATIO_GOAL,
            )
        )
    row = _open(results, "webhook", 1, P99_GOAL_RATE)
    p99 = row["latency_ms"].get("p99") if row else None
    out.append(
        Goal(
            f"open-loop p99 at {P99_GOAL_RATE:,}/s, 1 core",
            f"{_num(p99, 2)} ms",
            f"≤ {P99_GOAL_MS:g} ms",
            None if p99 is None or row is None else p99 <= P99_GOAL_MS and row["errors"] == 0,
        )
    )
    for payload in ("tekton", "fat"):
        decided = _decide_row(results, payload)
        goal_us = decide_bench.GOALS_US[payload]
        us = decided["decide_us"] if decided else None
        out.append(
            Goal(
                f"pure decide, {payload} pod",
                f"{_num(us, 1)} µs",
                f"≤ {goal_us:g} µs",
                None if us is None else us <= goal_us,
            )
        )
    out.extend(reconciler_goals(results.get("reconciler", {})))
    if "concurrency" in results:
        out.extend(concurrency_goals(results["concurrency"]))
    leak = results.get("leak")
    if leak:
        out.append(
            Goal(
                f"leak check: RSS growth over the 2nd half of {leak['requests']:,} requests",
                f"{leak['growth_second_half_mib']:+.2f} MiB",
                f"≤ {LEAK_GOAL_MIB:g} MiB (no trend)",
                leak["growth_second_half_mib"] <= LEAK_GOAL_MIB,
            )
        )
    return out


def _machine_line(results: dict[str, Any]) -> str:
    m = results["machine"]
    return (
        f"{m['cpu_model']}{' (virtual machine)' if m.get('virtual_machine') else ''}, "
        f"{m['cores']} cores ({m['cores_usable']} usable), "
        f"Python {m['python']}, Linux {m['kernel']}, {m['openssl']}; "
        + ", ".join(f"{k} {v}" for k, v in m["packages"].items())
    )


def _lat(row: dict[str, Any] | None, key: str) -> str:
    if row is None or key not in row["latency_ms"]:
        return "n/a"
    return f"{row['latency_ms'][key]:.2f}"


def render(results: dict[str, Any]) -> str:
    plan = results["plan"]
    lines = [
        "## coschedule benchmark results",
        "",
        f"Run {results['date']}{' (QUICK smoke run: not for publishing)' if plan['quick'] else ''}"
        f" on {_machine_line(results)}.",
        f"Load average (1 min) before {results['load_before']:.2f}, after "
        f"{results.get('load_after', float('nan')):.2f}"
        + (
            " — **the machine was not quiet; figures are distorted by other work**."
            if results["load_before"] >= 0.6
            else "."
        ),
        f"Server pinned to core {plan['server_cpus'][0]}, load generator on core "
        f"{plan['client_cpu']}. Closed loop: {results['closed_loop_tool']}, "
        f"{plan['wrk_connections']} connections. Webhook mode: {results['webhook_mode']}."
        + (
            f" Code: commit {results['source']['commit']}"
            f" (+{results['source']['modified_files']} modified files)."
            if "source" in results
            else ""
        ),
        "",
        "| # | figure | value | goal | |",
        "|---|---|---|---|---|",
    ]
    for index, goal in enumerate(goals(results), 1):
        lines.append(f"| {index} | {goal.figure} | {goal.value} | {goal.goal} | {goal.verdict} |")
    lines += _other_figures(results)
    lines += _closed_table(results)
    lines += _open_table(results)
    lines += ["", "### Pure decide cost (bench.decide, in process, no network)", ""]
    lines.append(decide_bench.render(results.get("decide", [])))
    lines += _phases_table(results)
    lines += _reconciler_section(results.get("reconciler", {}))
    lines += _concurrency_section(results.get("concurrency", {}))
    return "\n".join(lines) + "\n"


def _concurrency_section(con: dict[str, Any]) -> list[str]:
    if not con:
        return []
    if con.get("failed") or "results" not in con:
        return ["", "### Run concurrency control (bench/concurrency.py)", "", con.get("note", "")]
    return ["", *concurrency_bench.render(con["results"]).rstrip().splitlines()]


def concurrency_goals(con: dict[str, Any]) -> list[Goal]:
    e2e = (con.get("results") or {}).get("e2e") or {}
    if not e2e.get("ran"):
        note = e2e.get("note") or con.get("note") or "not run"
        return [
            Goal(
                "run concurrency: creation → older cancelled + new started, p99",
                note,
                "≤ 1000 ms",
                None,
            )
        ]
    p99 = float(e2e["p99_ms"])
    return [
        Goal(
            f"run concurrency: creation → older cancelled + new started, p99 ({e2e['runs']} runs,"
            " e2e control plane)",
            f"{p99:.0f} ms",
            "≤ 1000 ms",
            p99 <= 1000,
        )
    ]


def _interp_row(figures: dict[str, Any] | None) -> str:
    if not figures:
        return "n/a"
    return "; ".join(
        f"{name} {row['bytecodes']:,}, {row['python_calls']}, {row['c_calls']}"
        for name, row in figures.items()
    )


def _more(ours: float, theirs: float) -> str:
    """``4 µs more`` / ``0.5 µs less``: a difference in words, never ``-0 µs more``."""
    diff = ours - theirs
    text = f"{abs(diff):.0f}" if abs(diff) >= 1 else f"{abs(diff):.1f}"
    return f"{text} µs {'more' if diff >= 0 else 'less'}"


def _other_figures(results: dict[str, Any]) -> list[str]:
    keep = _closed(results, "webhook", 1, "tekton", "keep-alive")
    close = _closed(results, "webhook", 1, "tekton", "close")
    two = _closed(results, "webhook", 2, "tekton", "keep-alive")
    at_1000 = _open(results, "webhook", 1, 1000)
    leak = results.get("leak", {})
    ratio = results.get("ratio", {})
    decided = _decide_row(results, "tekton")
    extra = ""
    if ratio.get("webhook_cpu_us") is not None and decided is not None:
        extra = (
            f"webhook {ratio['webhook_cpu_us']:.0f} µs, floor {ratio['floor_cpu_us']:.0f} µs: "
            f"{_more(ratio['webhook_cpu_us'], ratio['floor_cpu_us'])}; in process, "
            f"the whole handle costs {_more(decided['handle_us'], decided['parse_us'])} "
            "than the floor's parse"
        )
    app = results.get("app_cost")
    app_row = "n/a"
    if app:
        app_row = (
            f"hot: webhook {app['webhook_us']:.0f} µs, floor {app['floor_us']:.0f} µs, "
            f"{_more(app['webhook_us'], app['floor_us'])}"
        )
        if "webhook_cold_us" in app:
            app_row += (
                f"; cold caches: webhook {app['webhook_cold_us']:.0f} µs, floor "
                f"{app['floor_cold_us']:.0f} µs, "
                f"{_more(app['webhook_cold_us'], app['floor_cold_us'])}"
            )
    rows = [
        ("max throughput, Tekton review, 1 core, keep-alive", f"{_num(_get(keep, 'rps'))}/s"),
        ("max throughput, Tekton review, 2 workers, keep-alive", f"{_num(_get(two, 'rps'))}/s"),
        (
            "max throughput, `Connection: close` (TLS handshake per request), 1 core",
            f"{_num(_get(close, 'rps'))}/s",
        ),
        (
            "CPU-seconds per 1,000 admissions (Tekton, at max throughput / at 1,000/s)",
            f"{_num(_get(keep, 'cpu_s_per_1000'), 3)} / {_num(_get(at_1000, 'cpu_s_per_1000'), 3)}",
        ),
        ("server CPU per Tekton admission at max throughput", extra or "n/a"),
        ("ASGI app alone per Tekton review (in process: no socket, TLS or HTTP)", app_row),
        (
            "Python run per admission, through the ASGI app (`bench.interp`): bytecodes, "
            "Python calls, C calls",
            _interp_row(results.get("interp")),
        ),
        (
            f"server RSS after warm-up / after {leak.get('requests', 0):,} requests",
            f"{_num(leak.get('rss_after_warmup_mib'), 1)} MiB / "
            f"{_num(leak.get('rss_after_mib'), 1)} MiB",
        ),
    ]
    logging_cost = results.get("logging")
    if logging_cost:
        rows.append(
            (
                "logging at INFO (JSON to a file) against logging off: throughput lost, "
                "median of paired A/B rounds (goal: ≤ 5 %)",
                "; ".join(
                    f"{name} review {row['cost_pct']:+.1f} % (medians {_num(row['info_rps'])}/s "
                    f"vs {_num(row['off_rps'])}/s; CPU per admission "
                    f"{row.get('cpu_cost_pct', 0):+.1f} %, {row['info_cpu_us']:.0f} vs "
                    f"{row['off_cpu_us']:.0f} µs)"
                    for name, row in (
                        ("Tekton (allowed, not logged)", logging_cost.get("tekton")),
                        ("denied (one INFO line)", logging_cost.get("denied")),
                    )
                    if row
                ),
            )
        )
    churn = results.get("churn")
    if churn:
        rows.append(
            (
                f"RSS growth per load run ending with {churn['connections']} connections "
                f"aborted mid-request ({churn['runs']} runs)",
                f"webhook {churn['webhook']['mib_per_run']:+.2f} MiB, "
                f"floor {churn['floor']['mib_per_run']:+.2f} MiB",
            )
        )
    out = ["", "Other figures (no goal set):", "", "| figure | value |", "|---|---|"]
    out += [f"| {name} | {value} |" for name, value in rows]
    return out


def _phases_table(results: dict[str, Any]) -> list[str]:
    phases = results.get("phases")
    if not phases:
        return []
    out = [
        "",
        "### One Tekton admission by phase (bench.phases, in process, µs)",
        "",
        "full: as the hot path did it before (orjson parse of the whole review, "
        "prometheus_client instruments); lean: as it does now. Cold: right after 8 MiB "
        "were copied.",
        "",
        "| phase | full, hot | lean, hot | full, cold | lean, cold |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in phases["phases"]:
        out.append(
            f"| {row['phase']} | {row['full_hot_us']:.1f} | {row['lean_hot_us']:.1f} | "
            f"{row['full_cold_us']:.1f} | {row['lean_cold_us']:.1f} |"
        )
    ratio = results.get("ratio", {})
    server_us = ratio.get("webhook_cpu_us")
    line = (
        f"Whole handle (lean): {phases['handle_hot_us']:.1f} µs hot, "
        f"{phases['handle_cold_us']:.1f} µs cold."
    )
    if server_us:
        line += (
            f" The server spends {server_us:.0f} µs of CPU per admission at max throughput: "
            f"{server_us - phases['handle_cold_us']:.0f} µs of it is TLS, HTTP and ASGI "
            f"(the floor's whole cost is {ratio.get('floor_cpu_us', 0):.0f} µs)."
        )
    out += ["", line]
    return out


def _closed_table(results: dict[str, Any]) -> list[str]:
    out = [
        "",
        f"### Max throughput, closed loop ({results['closed_loop_tool']}), admissions/s",
        "",
        "| payload | connection | webhook 1 core | floor 1 core | webhook ÷ floor "
        "| webhook 2 workers | webhook CPU-s / 1,000 | floor CPU-s / 1,000 |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    payloads = []
    for row in results.get("closed_loop", []):
        key = (row["payload"], row["connection"])
        if key not in payloads:
            payloads.append(key)
    for payload, connection in payloads:
        hook = _closed(results, "webhook", 1, payload, connection)
        floor = _closed(results, "floor", 1, payload, connection)
        if floor is None and payload.endswith("dryRun"):
            floor = _closed(results, "floor", 1, payload.split()[0], connection)
        two = _closed(results, "webhook", 2, payload, connection)
        ratio = hook["rps"] / floor["rps"] if hook and floor and floor["rps"] else None
        out.append(
            f"| {payload} | {connection} | {_num(_get(hook, 'rps'))} "
            f"| {_num(_get(floor, 'rps'))} | {_num(ratio, 2)} | {_num(_get(two, 'rps'))} "
            f"| {_num(_get(hook, 'cpu_s_per_1000'), 3)} "
            f"| {_num(_get(floor, 'cpu_s_per_1000'), 3)} |"
        )
    ceiling = results.get("generator_ceiling")
    if ceiling:
        out += [
            "",
            f"bench.openloop's own ceiling (closed loop against the floor, "
            f"{ceiling['requests']:,} requests): {_num(ceiling['rps'])}/s.",
        ]
    shares = [
        row["server_cpu_share"]
        for row in results.get("closed_loop", [])
        if row.get("workers") == 1 and row.get("server_cpu_share") is not None
    ]
    if shares:
        out += [
            "",
            f"Server core busy {min(shares):.0%} to {max(shares):.0%} of the time in the 1-core "
            "runs (CPU time ÷ wall time; under 100 % means other work took the core or the "
            "server waited on the generator).",
        ]
    errors = sum(row["errors"] for row in results.get("closed_loop", []))
    if errors:
        out.append(f"**{errors} request errors in the closed-loop runs.**")
    return out


def _open_table(results: dict[str, Any]) -> list[str]:
    layout = results.get("two_workers_layout", {})
    plan = results["plan"]
    rounds = plan.get("open_rounds", 1)
    out = [
        "",
        "### Latency, open loop (bench.openloop, Tekton review; ms from each request's "
        "scheduled send time)",
        "",
        f"Each rate: {rounds} round{'s' if rounds > 1 else ''} of {plan.get('open_seconds')} s "
        f"after {plan.get('open_warmup')} s of warm-up, rates taken in turn; each percentile is "
        "the median over the rounds, max the largest seen.",
        "",
        "| server | rate/s | p50 | p90 | p99 | p99.9 | max | errors | send lag p99 "
        "| CPU-s / 1,000 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in results.get("open_loop", []):
        name = f"{row['server']} {'1 core' if row['workers'] == 1 else '2 workers'}"
        lag = row["send_lag_ms"].get("p99")
        out.append(
            f"| {name} | {row['rate']:,} | {_lat(row, 'p50')} | {_lat(row, 'p90')} "
            f"| {_lat(row, 'p99')} | {_lat(row, 'p99.9')} | {_lat(row, 'max')} "
            f"| {row['errors']} | {_num(lag, 3)} | {_num(row['cpu_s_per_1000'], 3)} |"
        )
    if layout.get("generator_cpu") is None and layout:
        out += [
            "",
            f"2 workers: pinned to cores {layout.get('worker_cpus')}; with no third core the "
            "generator shares those cores with them, so these rows show spreading, not "
            "capacity.",
        ]
    return out


def _reconciler_section(rec: dict[str, Any]) -> list[str]:
    out = ["", "### Reconciler (bench/reconciler.py)", ""]
    if not rec.get("available") or rec.get("failed"):
        out.append(rec.get("note", "reconciler benchmark not available"))
        return out
    out += ["| figure | value |", "|---|---|"]
    for key, value in _flatten("", rec.get("results", {})):
        if isinstance(value, list | dict):
            continue
        shown = f"{value:,.3f}" if isinstance(value, float) else str(value)
        out.append(f"| {key} | {shown} |")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("results", nargs="?", type=Path, default=Path("bench/results/latest.json"))
    args = parser.parse_args()
    print(render(orjson.loads(args.results.read_bytes())), end="")


if __name__ == "__main__":
    main()
