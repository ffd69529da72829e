"""``python -m bench.tekton [--rounds N] [--wait S] [--json FILE]`` (``make bench-tekton``, as
root): coschedule side by side with Tekton v1.11.1's own Affinity Assistant, on one real stack.

Starts the real-stack tier's stack (tests/real/stack.py: ../shared/realstack, real kubelets,
Tekton's controller, the suite's hostPath provisioner, coschedule deployed), then:

1. **Latency**, three columns, interleaved: ``N`` rounds after one warm-up round; in each round
   one run per column, the order of the columns rotated from round to round; each run deleted
   and its pods, claims and StatefulSets gone before the next (``bench.real_latency.clean``);
   the API polled every 0.1 s (``bench.real_latency.measure``). The run is
   ``bench.real_latency``'s: two tasks in sequence sharing one volumeClaimTemplate workspace of
   the node-local WaitForFirstConsumer class. Columns: no co-scheduling (a namespace coschedule
   does not enable, Tekton's assistant off); Tekton's assistant in its ``pipelineruns`` mode
   (feature-flags ``coschedule: pipelineruns``; a namespace coschedule does not enable);
   coschedule ``pipelineruns`` (Tekton's assistant off). Rows: creation -> first TaskRun pod
   made, bound to a node (both from a watch of the pods) and Running (median, min-max), each
   with its paired (round by round) difference over no co-scheduling; creation -> PipelineRun
   Succeeded; then in how many rounds coschedule's first pod was bound, and Running, no
   later than Tekton's assistant's.
2. **Behaviours**, one run each with Tekton's assistant (``pipelineruns``) and with coschedule
   (``pipelineruns``): the first task's node cordoned mid-run (network volume class); a node too
   small for the second task (the small pool nodes, another workload's pod taking the CPU, a
   network volume); the run's podTemplate with a required node affinity over two of the three
   general nodes (node-local volume); the same with the two allowed nodes busier than the third.
   Every wait is bounded (``--wait``, default 120 s): a run with no verdict by then is reported
   stuck (the cordoned node is then uncordoned, as a person would, and the run followed for
   another ``--wait``; any other stuck run is cancelled).

Switching Tekton's assistant: its ``feature-flags`` ConfigMap key ``coschedule`` is
cluster-wide, so it is patched (in tekton-pipelines) before each column that needs another
value than the current one, then a settle of ``SETTLE`` s lets the controller's ConfigMap
watch deliver it (a watch event: milliseconds on an idle machine). It is then proven per run,
not assumed: Tekton records the flags it reconciled a run with in the run's
``status.provenance.featureFlags``, and every run whose ``coschedule`` there is not the
column's value fails the benchmark. Cost: two patches per round (the Tekton column is
switched on and off again), each a PATCH and the settle, outside every measured interval.

Writes the figures as JSON (``--json``) and prints both tables as markdown, headed by the
commit, the rounds and the machine's 1-minute load average. A benchmark: it asserts nothing
but the flag each run saw and, in the latency columns, Tekton's verdict.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

from bench.real_latency import (
    METRICS,
    WITHOUT,
    RunTimes,
    clean,
    measure,
    paired_differences,
    summary,
)
from bench.servers import loadavg, write_results
from bench.suite import source
from tests.e2e.kube import Api, ApiError, Obj, wait_for
from tests.e2e.world import make_namespace, unique, wait_webhook_sees
from tests.real import stack
from tests.real.nodes import cordon, restore
from tests.real.runs import (
    COMPONENT,
    claim_template,
    describe,
    done,
    pipeline_run,
    task,
    task_pods,
    verdict,
)
from tests.real.stack import GENERAL_NODES, POOL_NODES, RealCluster
from tests.real.test_node_constraints import _run as _affine_run
from tests.real.test_node_constraints import make_busy
from tests.real.test_stuck import BIG, IN_POOL, _filler, _pool_pods
from tests.real.volumes import NETWORK_CLASS

POLL = 0.5  # behaviours: the verdict and where the placeholders are, every half second
SETTLE = 2.0  # after a feature-flags patch, before the next run is created
WAIT = 120.0
MODE = "pipelineruns"
TEKTON = "tekton"
COSCHEDULE = "coschedule"
COLUMNS = (WITHOUT, TEKTON, COSCHEDULE)
HEADINGS = {
    WITHOUT: "no co-scheduling",
    TEKTON: f"Tekton's assistant `{MODE}`",
    COSCHEDULE: f"coschedule `{MODE}`",
}
# Tekton's feature-flags `coschedule` during each column and side.
TEKTON_FLAG = {WITHOUT: "disabled", TEKTON: MODE, COSCHEDULE: "disabled"}
FLAGS_NAMESPACE = "tekton-pipelines"
ASSISTANT = "affinity-assistant"  # app.kubernetes.io/component of both placeholders
BEHAVIOURS = {
    "cordon": "the first task's node cordoned mid-run (network volume)",
    "small": "a node too small for the second task (network volume)",
    "affinity": "the run's podTemplate has a required nodeAffinity (two of three nodes)",
    "busy": "the same, with the two allowed nodes busier than the third",
}
SIDES = (TEKTON, COSCHEDULE)


# ---- Tekton's feature flag ------------------------------------------------------------------


@dataclass
class Flag:
    """Tekton's ``coschedule`` flag as last set, and what setting it cost."""

    api: Api
    value: str = "disabled"  # tekton-install.yaml's
    switches: int = 0
    seconds: float = 0.0

    def set(self, value: str) -> None:
        if value == self.value:
            return
        started = time.monotonic()
        self.api.patch(
            "ConfigMap", "feature-flags", {"data": {"coschedule": value}}, FLAGS_NAMESPACE
        )
        time.sleep(SETTLE)
        self.value = value
        self.switches += 1
        self.seconds += time.monotonic() - started


def seen_flag(run: Obj) -> str | None:
    """The ``coschedule`` flag Tekton's controller reconciled the run with."""
    provenance = (run.get("status") or {}).get("provenance") or {}
    value = (provenance.get("featureFlags") or {}).get("coschedule")
    return None if value is None else str(value)


def check_flag(api: Api, namespace: str, name: str, expected: str) -> None:
    got = seen_flag(api.must_get("PipelineRun", name, namespace))
    if got != expected:
        raise RuntimeError(
            f"{namespace}/{name}: Tekton reconciled it with coschedule={got!r}, not {expected!r} "
            f"(the feature-flags patch had not reached the controller in {SETTLE} s)"
        )


# ---- latency --------------------------------------------------------------------------------


def latency(
    cluster: RealCluster, flag: Flag, rounds: int, log: Callable[[str], None]
) -> dict[str, dict[str, list[float]]]:
    api = cluster.api
    namespaces = {c: f"tk-lat-{c}" for c in COLUMNS}
    make_namespace(api, namespaces[WITHOUT], None, enabled=False)
    make_namespace(api, namespaces[TEKTON], None, enabled=False)
    make_namespace(api, namespaces[COSCHEDULE], MODE)
    if stack.CONFIG["coschedule"] != MODE:  # until seen, the cluster's mode applies
        wait_webhook_sees(api, namespaces[COSCHEDULE], MODE)
    figures: dict[str, dict[str, list[float]]] = {c: {k: [] for k, _ in METRICS} for c in COLUMNS}

    def one(column: str, name: str) -> RunTimes:
        flag.set(TEKTON_FLAG[column])
        times = measure(api, namespaces[column], name, cluster.local_class)
        check_flag(api, namespaces[column], name, TEKTON_FLAG[column])
        clean(api, namespaces[column], name)
        return times

    for column in COLUMNS:  # warm-up: images in the page cache, informers listed
        one(column, "warm-up")
    for index in range(rounds):
        shift = index % len(COLUMNS)
        for column in COLUMNS[shift:] + COLUMNS[:shift]:
            times = one(column, f"run-{index}")
            for key, _ in METRICS:
                figures[column][key].append(getattr(times, key))
            log(
                f"{column:10} round {index:2}: first pod made {times.first_created:5.2f} s, "
                f"bound {times.first_bound:5.2f} s, Running {times.first_running:5.2f} s, "
                f"Succeeded {times.succeeded:5.2f} s"
            )
    return figures


def latency_table(figures: dict[str, dict[str, list[float]]]) -> tuple[str, dict[str, Any]]:
    """The markdown table, and its figures (summaries, paired differences, and the rounds in
    which coschedule's first pod was no later than Tekton's assistant's)."""
    summaries = {c: {k: summary(v) for k, v in figures[c].items()} for c in COLUMNS}
    paired = {
        key: {c: summary(paired_differences(figures, c, key)) for c in COLUMNS[1:]}
        for key in ("first_created", "first_bound", "first_running")
    }
    rounds = len(figures[COSCHEDULE]["first_running"])
    not_behind = {
        key: sum(
            ours <= theirs
            for ours, theirs in zip(figures[COSCHEDULE][key], figures[TEKTON][key], strict=True)
        )
        for key in ("first_bound", "first_running")
    }

    def cell(s: dict[str, float]) -> str:
        return f"{s['median']:.2f} s ({s['min']:.2f}-{s['max']:.2f})"

    def diff(s: dict[str, float]) -> str:
        return f"{s['median']:+.2f} s ({s['min']:+.2f} to {s['max']:+.2f})"

    def figure_rows(key: str, what: str) -> list[str]:
        return [
            f"| first TaskRun pod {what}, median (min-max) | "
            + " | ".join(cell(summaries[c][key]) for c in COLUMNS)
            + " |",
            "| paired difference over none, median (min to max) | - | "
            + " | ".join(diff(paired[key][c]) for c in COLUMNS[1:])
            + " |",
        ]

    rows = [
        "| creation → | " + " | ".join(HEADINGS[c] for c in COLUMNS) + " |",
        "|---" * (len(COLUMNS) + 1) + "|",
        *figure_rows("first_created", "made"),
        *figure_rows("first_bound", "bound to a node"),
        *figure_rows("first_running", "Running"),
        "| PipelineRun Succeeded, median (min-max) | "
        + " | ".join(cell(summaries[c]["succeeded"]) for c in COLUMNS)
        + " |",
        "| rounds with coschedule's first pod no later than Tekton's assistant's "
        f"(bound / Running) | - | - | {not_behind['first_bound']} / "
        f"{not_behind['first_running']} of {rounds} |",
    ]
    return "\n".join(rows), {
        "summary": summaries,
        "paired_first_created": paired["first_created"],
        "paired_first_bound": paired["first_bound"],
        "paired_first_running": paired["first_running"],
        "coschedule_not_behind_tekton": {**not_behind, "rounds": rounds},
    }


# ---- behaviours -----------------------------------------------------------------------------


@dataclass
class Outcome:
    """One behaviour's run: Tekton's verdict (or ``stuck``) and when, from the run's creation."""

    verdict: str  # "Succeeded", "Failed: <reason>", "stuck", "error" (the harness's)
    seconds: float  # to the verdict, or to giving up
    detail: str = ""
    after: str = ""  # what happened once a stuck run was helped (uncordoned) or cancelled

    def cell(self) -> str:
        if self.verdict == "stuck":
            head = f"stuck {self.seconds:.0f} s"
        elif self.verdict == "error":
            head = f"not measured (the harness failed at {self.seconds:.0f} s)"
        else:
            head = f"{self.verdict} at {self.seconds:.1f} s"
        return "; ".join(part for part in (self.detail, head, self.after) if part)


def assistant_nodes(api: Api, namespace: str) -> set[str]:
    """Nodes the namespace's placeholder pods (Tekton's or coschedule's) are bound to."""
    return {
        str(pod["spec"]["nodeName"])
        for pod in api.list("Pod", namespace, label_selector=f"{COMPONENT}={ASSISTANT}")
        if pod["spec"].get("nodeName")
    }


# Not about placement: the scheduler's retries, and the real stack's lack of cluster DNS (the
# kubelet warns so for every pod).
NOISE = frozenset({"FailedScheduling", "MissingClusterDNS"})


def warnings(api: Api, namespace: str) -> dict[str, int]:
    """Warning Events of the namespace by reason (``NOISE`` left out)."""
    out: dict[str, int] = {}
    for event in api.list("Event", namespace):
        reason = str(event.get("reason"))
        if event.get("type") == "Warning" and reason not in NOISE:
            out[reason] = out.get(reason, 0) + 1
    return out


def follow(
    api: Api,
    namespace: str,
    name: str,
    until: float,
    tick: Callable[[], None] | None = None,
) -> Obj | None:
    """Poll until the run has Tekton's verdict (returned) or the monotonic ``until``
    passes (None)."""
    while time.monotonic() < until:
        if tick is not None:
            tick()
        run = api.must_get("PipelineRun", name, namespace)
        if done(run):
            return run
        time.sleep(POLL)
    return None


def finished(run: Obj) -> str:
    status, reason = verdict(run)
    return "Succeeded" if status == "True" else f"Failed: {reason}"


def cancel(api: Api, namespace: str, name: str) -> None:
    with contextlib.suppress(ApiError):
        api.patch("PipelineRun", name, {"spec": {"status": "Cancelled"}}, namespace)


def _running_node(api: Api, namespace: str, name: str, task_name: str) -> str | None:
    pod = task_pods(api, namespace, name).get(task_name) or {}
    if (pod.get("status") or {}).get("phase") == "Running":
        return str(pod["spec"]["nodeName"])
    return None


def cordoned(cluster: RealCluster, namespace: str, wait: float) -> Outcome:
    """tests/real/test_nodes.py's run: the first task's node cordoned while it runs."""
    api = cluster.api
    name = "moved"
    tasks = [
        task("first", "echo kept > $(workspaces.ws.path)/f\nsleep 12\n", ["ws"]),
        task("second", "grep -qx kept $(workspaces.ws.path)/f\n", ["ws"], run_after=["first"]),
    ]
    workspace = {"ws": {"volumeClaimTemplate": claim_template(NETWORK_CLASS)}}
    started = time.monotonic()
    api.create(pipeline_run(namespace, name, tasks, workspace))
    node = wait_for(
        "the first task to run",
        lambda: _running_node(api, namespace, name, "first"),
        timeout=wait,
    )
    cordon(api, node)
    at = time.monotonic()
    moved: list[float] = []

    def tick() -> None:
        if not moved and assistant_nodes(api, namespace) - {node}:
            moved.append(time.monotonic() - at)

    try:
        run = follow(api, namespace, name, at + wait, tick)
        detail = f"placeholder moved {moved[0]:.1f} s after the cordon" if moved else ""
        if run is not None:
            return Outcome(finished(run), time.monotonic() - started, detail)
        stuck = time.monotonic() - started
        second = task_pods(api, namespace, name).get("second") or {}
        pending = (second.get("status") or {}).get("phase") == "Pending"
        detail = detail or ("the next task Pending" if pending else "no verdict")
        restore(api, node)  # a person uncordons
        helped = time.monotonic() - started
        run = follow(api, namespace, name, time.monotonic() + wait)
        if run is None:
            cancel(api, namespace, name)
            after = f"uncordoned at {helped:.0f} s, still no verdict: cancelled"
        else:
            after = (
                f"uncordoned at {helped:.0f} s; {finished(run)} at "
                f"{time.monotonic() - started:.1f} s"
            )
        return Outcome("stuck", stuck, detail, after)
    finally:
        with contextlib.suppress(ApiError):
            restore(api, node)


def too_small(cluster: RealCluster, namespace: str, wait: float) -> Outcome:
    """The small pool nodes (allocatable 0.5 CPU): another workload's pod takes 0.4 CPU on the
    first; the run's placeholder goes there (the other node cordoned until it has), its first
    task fits and runs, its second (0.3 CPU) does not fit beside the other pod."""
    api = cluster.api
    name = "small"
    wait_for("the pool nodes to be empty", lambda: not _pool_pods(api), timeout=wait)
    busy, free = POOL_NODES
    cordon(api, free)
    try:
        _filler(api, namespace, busy)
        tasks = [
            task("first", "echo moved > $(workspaces.ws.path)/f\n", ["ws"]),
            task(
                "second",
                "grep -qx moved $(workspaces.ws.path)/f\n",
                ["ws"],
                run_after=["first"],
                cpu=BIG,
            ),
        ]
        workspace = {"ws": {"volumeClaimTemplate": claim_template(NETWORK_CLASS)}}
        started = time.monotonic()
        api.create(pipeline_run(namespace, name, tasks, workspace, pod_template=IN_POOL))
        wait_for(
            f"the placeholder on {busy}",
            lambda: assistant_nodes(api, namespace) == {busy},
            timeout=wait,
        )
        cordon(api, free, False)  # the room the second task needs, on the other node
        moved: list[float] = []

        def tick() -> None:
            if not moved and free in assistant_nodes(api, namespace):
                moved.append(time.monotonic() - started)

        run = follow(api, namespace, name, started + wait, tick)
        nodes = {t: p["spec"].get("nodeName") for t, p in task_pods(api, namespace, name).items()}
        if run is not None:
            where = f"second task on {'the other node' if nodes.get('second') == free else busy}"
            if moved:
                where = f"placeholder moved at {moved[0]:.1f} s, {where}"
            return Outcome(finished(run), time.monotonic() - started, where)
        cancel(api, namespace, name)
        return Outcome("stuck", time.monotonic() - started, "the second task Pending", "cancelled")
    finally:
        with contextlib.suppress(ApiError):
            api.delete("Pod", "filler", namespace, grace_period=0)
        for node in POOL_NODES:
            with contextlib.suppress(ApiError):
                cordon(api, node, False)


def affine(cluster: RealCluster, namespace: str, wait: float, *, busy: bool) -> Outcome:
    """tests/real/test_node_constraints.py's run (node-local volume, a required node affinity
    allowing two of the three general nodes), with or without the allowed nodes busy."""
    api = cluster.api
    allowed = GENERAL_NODES[:2]
    if busy:
        make_busy(api, namespace, allowed, wait)
    name = "affine"
    placed: set[str] = set()
    started = time.monotonic()
    api.create(_affine_run(namespace, cluster.local_class, allowed))
    try:
        run = follow(
            api,
            namespace,
            name,
            started + wait,
            lambda: placed.update(assistant_nodes(api, namespace)),
        )
        seconds = time.monotonic() - started
        where = ", ".join(
            f"{n} ({'allowed' if n in allowed else 'excluded'})" for n in sorted(placed)
        )
        parts = [f"placeholder on {where or 'no node'}"]
        noted = warnings(api, namespace)
        if noted:
            parts.append("Warnings " + ", ".join(f"{r} x{c}" for r, c in sorted(noted.items())))
        detail = "; ".join(parts)
        if run is not None:
            return Outcome(finished(run), seconds, detail)
        cancel(api, namespace, name)
        return Outcome("stuck", seconds, detail, "cancelled")
    finally:
        for node in allowed if busy else ():
            with contextlib.suppress(ApiError):
                api.delete("Pod", f"busy-{node}", namespace, grace_period=0)


def _no_pods(api: Api, namespace: str) -> bool:
    return not api.list("Pod", namespace)


RUNS = {"cordon": "moved", "small": "small", "affinity": "affine", "busy": "affine"}


def behaviours(
    cluster: RealCluster, flag: Flag, wait: float, log: Callable[[str], None]
) -> dict[str, dict[str, Outcome]]:
    """Each behaviour once per side, Tekton's side first (one flag switch each way)."""
    api = cluster.api
    out: dict[str, dict[str, Outcome]] = {key: {} for key in BEHAVIOURS}
    scenarios: dict[str, Callable[[RealCluster, str, float], Outcome]] = {
        "cordon": cordoned,
        "small": too_small,
        "affinity": lambda c, ns, w: affine(c, ns, w, busy=False),
        "busy": lambda c, ns, w: affine(c, ns, w, busy=True),
    }
    for side in SIDES:
        flag.set(TEKTON_FLAG[side])
        for key, scenario in scenarios.items():
            namespace = unique(f"tk-{key}-{side[:5]}")
            if side == COSCHEDULE:
                make_namespace(api, namespace, MODE)
                if stack.CONFIG["coschedule"] != MODE:
                    wait_webhook_sees(api, namespace, MODE)
            else:
                make_namespace(api, namespace, None, enabled=False)
            started = time.monotonic()
            try:
                outcome = scenario(cluster, namespace, wait)
                check_flag(api, namespace, RUNS[key], TEKTON_FLAG[side])
            except Exception as exc:  # reported in its cell; the other scenarios still run
                print(describe(api, namespace), flush=True)
                first_line = str(exc).splitlines()[0] if str(exc) else repr(exc)
                outcome = Outcome("error", time.monotonic() - started, first_line[:200])
            out[key][side] = outcome
            log(f"{side:10} {key:8}: {outcome.cell()}")
            try:
                clean(api, namespace, RUNS[key], timeout=wait)
                # The other workload's pods too: the next scenario starts on idle nodes.
                wait_for(
                    "the namespace's pods gone", partial(_no_pods, api, namespace), timeout=wait
                )
            except Exception as exc:  # noted; the next scenario's own waits still hold
                log(f"{side} {key}: not all gone: {str(exc).splitlines()[0]}")
            with contextlib.suppress(ApiError):
                api.delete("Namespace", namespace)
    return out


def behaviour_table(outcomes: dict[str, dict[str, Outcome]]) -> str:
    rows = [
        "| behaviour, one run each | Tekton's assistant | coschedule |",
        "|---|---|---|",
    ]
    for key, label in BEHAVIOURS.items():
        if key in outcomes:
            cells = [outcomes[key][s].cell() if s in outcomes[key] else "-" for s in SIDES]
            rows.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


# ---- report and entry point ----------------------------------------------------------------


def heading(
    code: dict[str, Any],
    load: list[float],
    rounds: int,
    wait: float,
    *,
    latency: bool = True,
    behaviours: bool = True,
) -> str:
    """What was measured (only the parts that ran), on what code, at what load."""
    commit = f"{code['commit']}{' + changes' if code['modified_files'] else ''}"
    shared = "measured on a shared, loaded machine; " if max(load) > 2 else ""
    ran = [f"{rounds} interleaved rounds after one warm-up"] if latency else []
    if behaviours:
        ran.append(f"behaviours one run each, waits bounded at {wait:.0f} s")
    return (
        f"{shared}commit {commit}; {'; '.join(ran)}; 1-minute load average "
        f"{min(load):.2f}-{max(load):.2f} (median {statistics.median(load):.2f})"
    )


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.tekton", description=__doc__)
    parser.add_argument("--rounds", type=int, default=10, help="latency rounds (default 10)")
    parser.add_argument(
        "--wait", type=float, default=WAIT, help=f"a behaviour's bound, s (default {WAIT:.0f})"
    )
    parser.add_argument("--no-latency", action="store_true", help="the behaviours only")
    parser.add_argument("--no-behaviours", action="store_true", help="the latency table only")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds: at least 1")
    if args.wait <= 0:
        parser.error("--wait: a positive number of seconds")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    why = stack.unavailable()
    if why:
        print(f"not measured: {why}")
        return 2
    if stack.EXTERNAL:
        print("not measured: needs the suite's own stack (it switches Tekton's feature flags)")
        return 2
    load = [loadavg()]
    code = source()  # before anything runs: the code the processes start from
    started_at = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    workdir = Path(tempfile.mkdtemp(prefix="coschedule-bench-tekton-"))

    def log(text: str) -> None:
        load.append(loadavg())
        print(f"{dt.datetime.now(dt.UTC):%H:%M:%S} {text} (load {load[-1]:.1f})", flush=True)

    figures: dict[str, dict[str, list[float]]] = {}
    outcomes: dict[str, dict[str, Outcome]] = {}
    cluster = stack.start(workdir, [])
    flag = Flag(cluster.api)
    try:
        if not args.no_latency:
            figures = latency(cluster, flag, args.rounds, log)
            print(latency_table(figures)[0], flush=True)  # kept in the log whatever follows
        if not args.no_behaviours:
            outcomes = behaviours(cluster, flag, args.wait, log)
    finally:
        stack.stop(cluster)
        shutil.rmtree(workdir, ignore_errors=True)
    load.append(loadavg())
    text = [
        heading(
            code,
            load,
            args.rounds,
            args.wait,
            latency=not args.no_latency,
            behaviours=not args.no_behaviours,
        ),
        "",
    ]
    result: dict[str, Any] = {}
    if figures:
        table, result = latency_table(figures)
        text += [table, ""]
    if outcomes:
        text += [behaviour_table(outcomes), ""]
    text.append(
        f"Tekton's flag switched {flag.switches} times, {flag.seconds:.1f} s in all "
        f"(a patch and a {SETTLE:.0f} s settle each, outside the measured intervals)"
    )
    print("\n".join(text))
    if args.json:
        seen = {
            key: {side: asdict(o) for side, o in sides.items()} for key, sides in outcomes.items()
        }
        flag_switches = {"count": flag.switches, "seconds": flag.seconds}
        write_results(args.json, started_at, code, load, rounds=args.rounds,
                      wait_seconds=args.wait, flag_switches=flag_switches, **result,
                      figures=figures, behaviours=seen)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
