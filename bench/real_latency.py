"""``python -m bench.real_latency [--runs N] [--modes M,...]``: the latency coschedule adds to a
real PipelineRun, end to end, on real kubelets and a real Tekton controller (v1.11.1).

Starts the real-stack tier's stack (tests/real/stack.py: ../shared/realstack, as root), then
runs the same small PipelineRun (two tasks in sequence sharing one volumeClaimTemplate
workspace of the node-local WaitForFirstConsumer class: ``write`` then ``read``) ``N`` times in
each column: a namespace coschedule does not touch (not enabled: the webhook is not even
called) and one namespace per mode (``pipelineruns``, ``workspaces``). One run at a time,
interleaved round by round, and the order of the columns rotates from round to round, so that
the machine's load and whatever a previous run leaves behind hit every column alike. Each run is
deleted, and its pods are gone, before the next one starts.

For each run it records, from the PipelineRun's creation: when the first of its TaskRun pods
was made and bound to a node (a watch of the namespace's pods), when one was Running and
Tekton's verdict Succeeded (the API polled every 0.1 s). Prints the medians, min and max of
each per column, and the medians' differences from the column without coschedule, the load
average before and after, and the commit measured. A benchmark: it prints figures and
asserts nothing but Tekton's verdict.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple

from bench.servers import loadavg, write_results
from bench.suite import source
from tests.e2e.kube import Api, ApiError
from tests.e2e.world import make_namespace, wait_webhook_sees
from tests.real import stack
from tests.real.runs import claim_template, describe, done, pipeline_run, task, verdict

POLL = 0.1
WITHOUT = "without"
MODES = ("pipelineruns", "workspaces")
METRICS = (
    ("first_created", "first pod created"),
    ("first_bound", "first pod bound"),
    ("first_running", "first pod Running"),
    ("succeeded", "Succeeded"),
)


def _run(namespace: str, name: str, storage_class: str) -> dict[str, object]:
    tasks = [
        task("write", "echo hello > $(workspaces.ws.path)/f\n", ["ws"]),
        task("read", "grep -qx hello $(workspaces.ws.path)/f\n", ["ws"], run_after=["write"]),
    ]
    return pipeline_run(
        namespace, name, tasks, {"ws": {"volumeClaimTemplate": claim_template(storage_class)}}
    )


class RunTimes(NamedTuple):
    """One run, in seconds from its creation."""

    first_created: float  # the first TaskRun pod made (its watch event)
    first_bound: float  # the first TaskRun pod bound to a node (its watch event)
    first_running: float  # the first TaskRun pod seen Running (polled)
    succeeded: float  # the PipelineRun seen Succeeded (polled)


class _FirstPod(threading.Thread):
    """When the first of a run's pods is made, and when one is first bound, as a watch of
    the namespace's pods delivers them: the events' arrival, not a poll's period."""

    def __init__(self, api: Api, namespace: str, selector: str) -> None:
        super().__init__(daemon=True)
        self.api, self.namespace, self.selector = api, namespace, selector
        self.started = 0.0  # the run's creation (monotonic), set before it is made
        self.created: float | None = None
        self.bound: float | None = None
        self.opened = threading.Event()

    def run(self) -> None:
        params = {"watch": "1", "labelSelector": self.selector, "timeoutSeconds": "120"}
        path = f"/api/v1/namespaces/{self.namespace}/pods"
        with self.api.http.stream("GET", path, params=params, timeout=None) as response:
            self.opened.set()
            for line in response.iter_lines():
                now = time.monotonic()
                if not line:
                    continue
                event = json.loads(line)
                pod = event.get("object") or {}
                if event.get("type") == "ADDED" and self.created is None:
                    self.created = now - self.started
                if (pod.get("spec") or {}).get("nodeName") and self.bound is None:
                    self.bound = now - self.started
                if self.created is not None and self.bound is not None:
                    return


def measure(api: Api, namespace: str, name: str, storage_class: str) -> RunTimes:
    """When one run's first pod was made, bound and Running, and when the run Succeeded.
    Made and bound come from a watch (Tekton, then the scheduler and coschedule's placement
    before it); Running adds the kubelet, which sees a container start at its relist of the
    node's pods (about once a second), so Running moves in steps that bound does not."""
    # TaskRun pods only: Tekton's own Affinity Assistant pod carries the run's label too.
    selector = f"tekton.dev/pipelineRun={name},tekton.dev/pipelineTask"
    watch = _FirstPod(api, namespace, selector)
    watch.start()
    if not watch.opened.wait(10):
        raise RuntimeError(f"{namespace}: the pods' watch did not open in 10 s")
    started = watch.started = time.monotonic()
    api.create(_run(namespace, name, storage_class))
    first: float | None = None
    while time.monotonic() - started < 300:
        if first is None:
            pods = api.list("Pod", namespace, label_selector=selector)
            if any((p.get("status") or {}).get("phase") in ("Running", "Succeeded") for p in pods):
                first = time.monotonic() - started
        run = api.must_get("PipelineRun", name, namespace)
        if done(run):
            if verdict(run) != ("True", "Succeeded"):
                raise RuntimeError(f"{namespace}/{name}: {verdict(run)}")
            total = time.monotonic() - started
            # A run can finish between two polls of a short first pod's Running phase.
            first = first if first is not None else total
            watch.join(5)
            if watch.created is None or watch.bound is None:
                raise RuntimeError(f"{namespace}/{name}: its pods' watch saw none made and bound")
            return RunTimes(watch.created, watch.bound, first, total)
        time.sleep(POLL)
    raise RuntimeError(f"{namespace}/{name} did not finish in 300 s")


def clean(api: Api, namespace: str, name: str, timeout: float = 120) -> None:
    """Delete the run and wait until its pods and claims are gone, so that the next run (of
    any column) starts on a machine the last one no longer uses."""
    with contextlib.suppress(ApiError):
        api.delete("PipelineRun", name, namespace, propagation="Background")
    deadline = time.monotonic() + timeout
    selector = f"tekton.dev/pipelineRun={name}"
    while time.monotonic() < deadline:
        pods = api.list("Pod", namespace, label_selector=selector)
        claims = api.list("PersistentVolumeClaim", namespace)
        statefulsets = api.list("StatefulSet", namespace)
        if not pods and not claims and not statefulsets:
            return
        time.sleep(0.5)
    raise RuntimeError(
        f"{namespace}/{name}: still not gone {timeout:.0f} s after its delete\n"
        + describe(api, namespace)
    )


def paired_differences(
    figures: dict[str, dict[str, list[float]]], column: str, key: str
) -> list[float]:
    """Round by round: the column's figure minus the one without coschedule."""
    return [on - off for on, off in zip(figures[column][key], figures[WITHOUT][key], strict=True)]


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def report(
    figures: dict[str, dict[str, list[float]]],
    modes: list[str],
    load: list[float],
    code: dict[str, Any],
) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """The table: per column the median (min-max) of each figure and its median's difference
    from the column without coschedule; then the median of the round-by-round differences
    (each round ran every column back to back, under the same load)."""
    columns = [WITHOUT, *modes]
    runs = len(figures[WITHOUT]["succeeded"])
    lines = [
        f"{runs} runs per column, PipelineRun creation -> (median, min-max; "
        f"commit {code['commit']}{' + changes' if code['modified_files'] else ''}, "
        f"1-min load {min(load):.2f}-{max(load):.2f}, median {statistics.median(load):.2f})",
        f"{'':30}" + "".join(f"{c:>26}" for c in columns),
    ]
    summaries = {c: {k: summary(figures[c][k]) for k, _ in METRICS} for c in columns}
    for key, label in METRICS:
        cells = []
        for column in columns:
            s = summaries[column][key]
            added = s["median"] - summaries[WITHOUT][key]["median"]
            extra = "" if column == WITHOUT else f" {added:+5.2f}"
            cells.append(f"{s['median']:6.2f} s ({s['min']:.2f}-{s['max']:.2f}){extra}")
        lines.append(f"{label:30}" + "".join(f"{cell:>26}" for cell in cells))
    paired = {
        c: {k: statistics.median(paired_differences(figures, c, k)) for k, _ in METRICS}
        for c in modes
    }
    for key, label in METRICS:
        cells = [""] + [f"{paired[c][key]:+5.2f} s" for c in modes]
        lines.append(f"{label + ', paired':30}" + "".join(f"{cell:>26}" for cell in cells))
    return "\n".join(lines), summaries, paired


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.real_latency", description=__doc__)
    parser.add_argument("--runs", type=int, default=10, help="runs per column (default 10)")
    parser.add_argument(
        "--modes",
        default=",".join(MODES),
        help=f"coschedule's modes to measure beside {WITHOUT!r} (default {','.join(MODES)})",
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    why = stack.unavailable()
    if why:
        print(f"not measured: {why}")
        return 2
    columns = [WITHOUT, *modes]
    figures: dict[str, dict[str, list[float]]] = {
        c: {key: [] for key, _ in METRICS} for c in columns
    }
    load = [loadavg()]
    code = source()  # before anything runs: the code the processes start from
    started_at = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    workdir = Path(tempfile.mkdtemp(prefix="coschedule-bench-real-"))
    notes: list[str] = []
    cluster = stack.start(workdir, notes)
    try:
        api = cluster.api
        namespaces = {c: f"lat-{c}" for c in columns}
        make_namespace(api, namespaces[WITHOUT], None, enabled=False)
        for mode in modes:
            make_namespace(api, namespaces[mode], mode)
            if mode != stack.CONFIG["coschedule"]:  # until seen, the cluster's mode applies
                wait_webhook_sees(api, namespaces[mode], mode)
        # One warm-up run each (images into the page cache, informers listed).
        for column in columns:
            measure(api, namespaces[column], "warm-up", cluster.local_class)
            clean(api, namespaces[column], "warm-up")
        load.append(loadavg())
        for index in range(args.runs):
            shift = index % len(columns)
            for column in columns[shift:] + columns[:shift]:
                name = f"run-{index}"
                times = measure(api, namespaces[column], name, cluster.local_class)
                clean(api, namespaces[column], name)
                for key, _ in METRICS:
                    figures[column][key].append(getattr(times, key))
                print(
                    f"{column:12} run {index:2}: first pod made {times.first_created:5.2f} s, "
                    f"bound {times.first_bound:5.2f} s, Running {times.first_running:5.2f} s, "
                    f"Succeeded {times.succeeded:5.2f} s (load {loadavg():.2f})",
                    flush=True,
                )
                load.append(loadavg())
    finally:
        stack.stop(cluster)
        shutil.rmtree(workdir, ignore_errors=True)
    text, summaries, paired = report(figures, modes, load, code)
    print(text)
    if args.json:
        write_results(args.json, started_at, code, load, runs=args.runs, summary=summaries,
                      paired_median_added=paired, figures=figures)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
