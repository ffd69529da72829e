"""``python -m bench.real_latency [--runs N]``: the latency coschedule adds to a real
PipelineRun, end to end, on real kubelets and a real Tekton controller (v1.11.1).

Starts the real-stack tier's stack (tests/real/stack.py: ../shared/realstack, as root), then
runs the same small PipelineRun (two tasks in sequence sharing one volumeClaimTemplate
workspace of the node-local WaitForFirstConsumer class: ``write`` then ``read``) ``N`` times in
a namespace coschedule does not touch and ``N`` times in one in ``pipelineruns`` mode,
alternating, one run at a time. For each run it polls the API every 0.1 s and records, from
the PipelineRun's creation: the first pod Running, and Tekton's verdict Succeeded. Prints the
medians (and p90s) of both, with and without coschedule, and their differences.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tests.e2e.kube import Api
from tests.e2e.world import make_namespace, wait_webhook_sees
from tests.real import stack
from tests.real.runs import claim_template, done, pipeline_run, task, verdict

POLL = 0.1


def _run(namespace: str, name: str, storage_class: str) -> dict[str, object]:
    tasks = [
        task("write", "echo hello > $(workspaces.ws.path)/f\n", ["ws"]),
        task("read", "grep -qx hello $(workspaces.ws.path)/f\n", ["ws"], run_after=["write"]),
    ]
    return pipeline_run(
        namespace, name, tasks, {"ws": {"volumeClaimTemplate": claim_template(storage_class)}}
    )


def measure(api: Api, namespace: str, name: str, storage_class: str) -> tuple[float, float]:
    """(seconds to the first pod Running, seconds to Succeeded) for one run."""
    started = time.monotonic()
    api.create(_run(namespace, name, storage_class))
    first: float | None = None
    while time.monotonic() - started < 300:
        if first is None:
            pods = api.list("Pod", namespace, label_selector=f"tekton.dev/pipelineRun={name}")
            if any((p.get("status") or {}).get("phase") == "Running" for p in pods):
                first = time.monotonic() - started
        run = api.must_get("PipelineRun", name, namespace)
        if done(run):
            if verdict(run) != ("True", "Succeeded"):
                raise RuntimeError(f"{namespace}/{name}: {verdict(run)}")
            total = time.monotonic() - started
            # A run can finish between two polls of a short first pod's Running phase.
            return (first if first is not None else total), total
        time.sleep(POLL)
    raise RuntimeError(f"{namespace}/{name} did not finish in 300 s")


def p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.real_latency", description=__doc__)
    parser.add_argument("--runs", type=int, default=10, help="runs per column (default 10)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    why = stack.unavailable()
    if why:
        print(f"not measured: {why}")
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="coschedule-bench-real-"))
    notes: list[str] = []
    cluster = stack.start(workdir, notes)
    try:
        api = cluster.api
        make_namespace(api, "lat-off", None, enabled=False)
        make_namespace(api, "lat-on", "pipelineruns")
        wait_webhook_sees(api, "lat-on", "pipelineruns")
        # One warm-up run each (images into the page cache, informers listed).
        for namespace in ("lat-off", "lat-on"):
            measure(api, namespace, "warm-up", cluster.local_class)
        figures: dict[str, dict[str, list[float]]] = {
            "without": {"first_running": [], "succeeded": []},
            "with": {"first_running": [], "succeeded": []},
        }
        for index in range(args.runs):
            for column, namespace in (("without", "lat-off"), ("with", "lat-on")):
                first, total = measure(api, namespace, f"run-{index}", cluster.local_class)
                figures[column]["first_running"].append(first)
                figures[column]["succeeded"].append(total)
                print(
                    f"{column:8} run {index:2}: first pod Running {first:5.2f} s, "
                    f"Succeeded {total:5.2f} s",
                    flush=True,
                )
    finally:
        stack.stop(cluster)
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"\n{args.runs} runs each, PipelineRun creation ->")
    print(f"{'':20} {'without':>16} {'with coschedule':>16} {'added':>8}")
    for key, label in (("first_running", "first pod Running"), ("succeeded", "Succeeded")):
        off, on = figures["without"][key], figures["with"][key]
        print(
            f"{label:20} {statistics.median(off):7.2f} s (p90 {p90(off):5.2f}) "
            f"{statistics.median(on):7.2f} s (p90 {p90(on):5.2f}) "
            f"{statistics.median(on) - statistics.median(off):+7.2f} s"
        )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
