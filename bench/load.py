"""``python -m bench.load [--runs N] [--minutes M] [--json FILE]`` (``make bench-load``, as
root): sustained load with faults on the real stack, and its figures.

Starts the real-stack tier's stack (tests/real/stack.py: ../shared/realstack, real kubelets,
Tekton v1.11.1), then tests/real/load.py's load: ``N`` PipelineRuns created at a steady rate
over ``M`` minutes into four namespaces (without coschedule; ``pipelineruns``; a ``Queue
maxRunning: 2`` ConcurrencyControl in ``pipelineruns``; a ``Queue maxRunning: 2`` one in
``workspaces``), three tasks each sharing a volumeClaimTemplate workspace (of the class every
node mounts, each task with ``retries: 1``, when a node is to die); five faults, one at a time,
each once the one before recovered (tests/real/load.py's Plan): the reconciler leader
SIGKILLed (a second replica takes over), a node's kubelet and containerd killed (the Node
object left; declared out of service once its placeholders moved; brought back once its pods
are gone), etcd SIGSTOPped for 15 s, the webhook SIGKILLed for 20 s (the shipped admission
policies stand in; back behind its readiness) and kube-apiserver SIGKILLed and started again
14 s later. The fault tier's invariants are checked every second throughout.

Prints: runs per minute sustained (runs created ÷ creation period, and verdicts ÷ first create
to last verdict); PipelineRun creation → first pod Running and → Succeeded, p50/p99, for the
lane without coschedule and the lane with it (same load, interleaved), and for the controlled
lanes (queue wait included); CPU seconds and peak RSS of ``coschedule serve`` and
``coschedule reconcile`` (every replica, from /proc); API requests coschedule made per run
(the API server's ``apiserver_flowcontrol_dispatched_requests_total`` for a FlowSchema that
matches only coschedule's ServiceAccounts, less its idle rate); recovery after each fault;
the runs that were on the dead node and their verdicts; what broke. Exit status 1 when an
invariant broke, a coscheduled run not on the dead node did not succeed, or something was
left.

The stack's logs (the control plane's and coschedule's processes', Tekton's, the kubelets'
and containerds') are copied to ``build/load-logs/COMMIT-TIME/`` (printed) when the run
failed or raised, so that what broke can be read afterwards; on a clean run they go with the
stack, unless ``--keep-logs``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.servers import loadavg, write_results
from bench.suite import source
from tests.real import stack
from tests.real.load import LANES, Outcome, Plan, latency, run_load

ROOT = Path(__file__).resolve().parent.parent
LOGS_DIR = ROOT / "build" / "load-logs"  # gitignored


def problems(outcome: Outcome) -> list[str]:
    """What makes the run a failure (exit status 1), a line each: an invariant that broke,
    a coscheduled run not on the dead node that did not succeed, something left. Pure."""
    lost = set(outcome.node_loss.runs) if outcome.node_loss else set()
    failed = sorted(
        k for k, r in outcome.records.items()
        if r.lane != "off" and k not in lost and r.verdict != ("True", "Succeeded")
    )  # fmt: skip
    left = {k: v for k, v in outcome.left.items() if v}
    found = [f"invariant broke: {why}" for why in outcome.broken]
    if failed:
        found.append(f"coscheduled runs not Succeeded: {', '.join(failed)}")
    if left:
        found.append(f"left behind: {left}")
    return found


def why_keep_logs(found: Sequence[str], *, finished: bool, asked: bool) -> str | None:
    """Why the stack's logs are kept (None: they go with the stack): the run raised before
    its outcome, something in it failed (``problems``), or ``--keep-logs``. Pure."""
    if not finished:
        return "the run did not finish"
    if found:
        return found[0] + (f" (and {len(found) - 1} more)" if len(found) > 1 else "")
    return "--keep-logs" if asked else None


def stack_logs(folder: Path) -> dict[str, Path]:
    """The log folders in a realstack's work ``folder``, by the name they are kept under:
    Tekton's, and each node's kubelet and containerd (``logs.prev`` too: a node brought back
    up moved its logs from before there); not the pods' own (the bulk, and the runs' steps,
    not coschedule's)."""
    found = {"tekton": folder / "tekton" / "logs"}
    for logs in sorted((folder / "nodes").glob("*/logs*")):
        found[f"nodes/{logs.parent.name}/{logs.name}"] = logs
    return found


def save_logs(sources: Mapping[str, Path], dest: Path) -> list[Path]:
    """Copy each folder of ``sources`` that exists to ``dest``/its name; the copies made."""
    made = []
    for name, folder in sources.items():
        if folder.is_dir():
            target = dest / name
            shutil.copytree(folder, target, dirs_exist_ok=True)
            made.append(target)
    return made


def figures(outcome: Outcome, plan: Plan) -> dict[str, Any]:
    records = list(outcome.records.values())
    succeeded = [r for r in records if r.verdict == ("True", "Succeeded")]
    first_create = min(r.created for r in records)
    last_verdict = max(r.finished or 0 for r in records)
    coscheduled = [r for r in records if r.lane != "off"]
    idle = outcome.idle_requests_per_s * (last_verdict - first_create)
    return {
        "runs": len(records),
        "succeeded": len(succeeded),
        "not_succeeded": {
            k: r.verdict for k, r in outcome.records.items() if r.verdict != ("True", "Succeeded")
        },
        "created_per_minute": len(records) / (outcome.create_seconds / 60),
        "done_per_minute": len(records) / ((last_verdict - first_create) / 60),
        "drain_seconds": outcome.drain_seconds,
        "latency": {
            "without coschedule (off)": latency(outcome, ("off",)),
            "with coschedule (on: pipelineruns)": latency(outcome, ("on",)),
            "Queue maxRunning 2 (pipelineruns)": latency(outcome, ("queue",)),
            "Queue maxRunning 2 (workspaces)": latency(outcome, ("wsqueue",)),
        },
        "cpu_seconds": outcome.cpu,
        "rss_max_mib": {k: v / 2**20 for k, v in outcome.rss_max.items()},
        "requests": outcome.requests,
        "idle_requests_per_s": outcome.idle_requests_per_s,
        "requests_per_run": (outcome.requests - idle) / max(1, len(coscheduled)),
        "requests_per_run_raw": outcome.requests / max(1, len(coscheduled)),
        "held_runs": outcome.held,
        "most_running": outcome.most_running_in,
        "leader_takeover_seconds": outcome.takeover.seconds if outcome.takeover else None,
        "leader_kill_to_next_queued_start": outcome.takeover_next_start,
        "api_restart": asdict(outcome.api_restart) if outcome.api_restart else None,
        "api_back_to_next_verdict": outcome.api_first_verdict,
        "etcd_pause_recovery_seconds": outcome.etcd_recovery,
        "webhook_kill": asdict(outcome.webhook_kill) if outcome.webhook_kill else None,
        "node_loss": asdict(outcome.node_loss) if outcome.node_loss else None,
        "node_loss_verdicts": {
            k: outcome.records[k].verdict
            for k in (outcome.node_loss.runs if outcome.node_loss else [])
            if k in outcome.records
        },
        "retried": {k: r.retried for k, r in outcome.records.items() if r.retried},
        "recovery_seconds": outcome.recoveries,
        "broken": outcome.broken,
        "left": {k: v for k, v in outcome.left.items() if v},
        "lease_holders": outcome.lease_holders,
        "looks": outcome.looks,
        "watch_errors": outcome.watch_errors[-5:],
        "plan": asdict(plan),
    }


def render(f: dict[str, Any], load: list[float], code: dict[str, Any]) -> str:
    lines = [
        f"{f['runs']} runs ({f['succeeded']} Succeeded), commit {code['commit']}"
        f"{' + changes' if code['modified_files'] else ''}, 1-min load "
        f"{min(load):.1f}-{max(load):.1f}",
        f"runs per minute: created {f['created_per_minute']:.1f}, verdicts "
        f"{f['done_per_minute']:.1f} (first create to last verdict; drained "
        f"{f['drain_seconds']:.0f} s after the last create)",
    ]
    for lane, figs in f["latency"].items():
        for key, label in (("first_running", "first pod Running"), ("succeeded", "Succeeded")):
            if key in figs:
                s = figs[key]
                lines.append(
                    f"  {lane:36} creation -> {label:18} p50 {s['p50']:6.1f} s  "
                    f"p99 {s['p99']:6.1f} s  max {s['max']:6.1f} s  (n={s['n']:.0f})"
                )
    cpu, rss = f["cpu_seconds"], f["rss_max_mib"]
    lines += [
        f"CPU seconds: webhook {cpu.get('webhook', 0):.1f}, "
        f"reconciler {cpu.get('reconciler', 0):.1f}; "
        f"peak RSS MiB: webhook {rss.get('webhook', 0):.0f}, "
        f"reconciler {rss.get('reconciler', 0):.0f}",
        f"API requests by coschedule: {f['requests']:.0f} ({f['idle_requests_per_s']:.2f}/s "
        f"idle): {f['requests_per_run']:.1f} per coscheduled run above idle "
        f"({f['requests_per_run_raw']:.1f} all told)",
        f"held by a control: {f['held_runs']} runs; most running {f['most_running']}",
        f"leader killed: another led {f['leader_takeover_seconds']} s later; the next queued run "
        f"started {f['leader_kill_to_next_queued_start']} s after the kill",
        f"API server restart: {f['api_restart']}; the next verdict "
        f"{f['api_back_to_next_verdict']} s after it was back",
        f"etcd paused: ready {f['etcd_pause_recovery_seconds']} s after SIGCONT; webhook killed: "
        f"{f['webhook_kill']}",
        f"node down: {f['node_loss']}; its runs' verdicts {f['node_loss_verdicts']}; "
        f"retried {f['retried']}",
        *(f"recovery: {k}: {v:.1f} s" for k, v in f["recovery_seconds"].items()),
        f"broken: {f['broken'] or 'nothing'}; left: {f['left'] or 'nothing'}; "
        f"Lease: {f['lease_holders']}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.load", description=__doc__)
    parser.add_argument("--runs", type=int, default=150, help="runs in all (default 150)")
    parser.add_argument("--minutes", type=float, default=10.0, help="creation period")
    parser.add_argument("--sleep", type=int, default=3, help="the second task's sleep, s")
    parser.add_argument("--no-faults", action="store_true")
    parser.add_argument("--no-node-down", action="store_true", help="the other four faults")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--keep-logs",
        action="store_true",
        help=f"keep the stack's logs (under {LOGS_DIR.relative_to(ROOT)}) after a clean run too",
    )
    args = parser.parse_args(argv)
    why = stack.unavailable()
    if why:
        print(f"not measured: {why}")
        return 2
    plan = Plan(runs=args.runs, minutes=args.minutes, sleep=args.sleep)
    if args.no_faults:
        plan.no_faults()
    if args.no_node_down:
        plan.node_down_at = None
    load = [loadavg()]
    code = source()
    started_at = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    workdir = Path(tempfile.mkdtemp(prefix="coschedule-bench-load-"))
    # The control plane's and coschedule's processes' logs (tests/e2e/cluster.py).
    own_logs = {"processes": workdir / "logs"}
    kept = LOGS_DIR / f"{code['commit']}-{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%SZ}"
    notes: list[str] = []
    try:
        cluster = stack.start(workdir, notes)
    except BaseException:
        if save_logs(own_logs, kept):
            print(f"the stack did not start; its logs are kept in {kept}", flush=True)
        shutil.rmtree(workdir, ignore_errors=True)
        raise

    def log(text: str) -> None:
        load.append(loadavg())
        print(f"{dt.datetime.now(dt.UTC):%H:%M:%S} {text} (load {load[-1]:.1f})", flush=True)

    outcome: Outcome | None = None
    try:
        outcome = run_load(cluster, plan, log=log)
    finally:
        found = problems(outcome) if outcome is not None else []
        why = why_keep_logs(found, finished=outcome is not None, asked=args.keep_logs)
        if why is not None:
            save_logs(stack_logs(cluster.workdir), kept)  # before the stack (and its folder) goes
        stack.stop(cluster)
        if why is not None:
            save_logs(own_logs, kept)  # once the processes stopped: whole
            print(f"kept the stack's logs in {kept}: {why}", flush=True)
        shutil.rmtree(workdir, ignore_errors=True)
    load.append(loadavg())
    result = figures(outcome, plan)
    print(render(result, load, code))
    if args.json:
        lanes = [asdict(lane) for lane in LANES]
        write_results(args.json, started_at, code, load, lanes=lanes, **result)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
