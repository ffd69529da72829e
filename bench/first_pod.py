"""``python -m bench.first_pod [--runs N]``: how much later a PipelineRun's first TaskRun pod
runs with coschedule (``pipelineruns`` mode) than with no co-scheduling, on real kubelets and
a real Tekton controller (v1.11.1): the paired difference, round by round.

The run and the method are ``bench.real_latency``'s (two tasks in sequence sharing one
volumeClaimTemplate workspace of the node-local WaitForFirstConsumer class; one run at a
time; the two columns interleaved, the order alternating; each run deleted and gone before
the next; the API polled every 0.1 s from the run's creation). Per coschedule run it also
reads how its first pod was placed: pinned at admission (its placeholder was made from the
run and bound first), or held behind the placeholder's gate and released by the reconciler
(whose patch shows in the pod's managedFields). Prints per round both figures and their
difference, then the median and min-max of the differences. A benchmark: it asserts nothing
but Tekton's verdict.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.real_latency import _run, clean, summary
from bench.servers import loadavg
from bench.suite import source
from tests.e2e.kube import Api
from tests.e2e.world import make_namespace, wait_webhook_sees
from tests.real import stack
from tests.real.runs import done, verdict

POLL = 0.05
OFF, ON = "off", "pipelineruns"
RELEASER = "coschedule-reconciler"


def _placed(pod: dict[str, object]) -> str:
    """ "released" when the reconciler patched the pod (lifted our gate), else "pinned"."""
    meta = pod.get("metadata") or {}
    assert isinstance(meta, dict)
    managers = {str(m.get("manager")) for m in meta.get("managedFields") or []}
    return "released" if RELEASER in managers else "pinned"


def measure(api: Api, namespace: str, name: str, storage_class: str) -> tuple[float, str]:
    """(seconds from creation to the first pod Running, how that pod was placed)."""
    started = time.monotonic()
    api.create(_run(namespace, name, storage_class))
    first: float | None = None
    placed = ""
    selector = f"tekton.dev/pipelineRun={name}"
    while time.monotonic() - started < 300:
        if first is None:
            pods = api.list("Pod", namespace, label_selector=selector)
            running = [
                p for p in pods if (p.get("status") or {}).get("phase") in ("Running", "Succeeded")
            ]
            if running:
                first = time.monotonic() - started
                placed = _placed(running[0])
        run = api.must_get("PipelineRun", name, namespace)
        if done(run):
            if verdict(run) != ("True", "Succeeded"):
                raise RuntimeError(f"{namespace}/{name}: {verdict(run)}")
            return (first if first is not None else time.monotonic() - started), placed
        time.sleep(POLL if first is None else 0.5)
    raise RuntimeError(f"{namespace}/{name} did not finish in 300 s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.first_pod", description=__doc__)
    parser.add_argument("--runs", type=int, default=10, help="paired rounds (default 10)")
    args = parser.parse_args(argv)
    why = stack.unavailable()
    if why:
        print(f"not measured: {why}")
        return 2
    code = source()
    load = [loadavg()]
    workdir = Path(tempfile.mkdtemp(prefix="coschedule-bench-first-pod-"))
    cluster = stack.start(workdir, [])
    off: list[float] = []
    on: list[float] = []
    placements: list[str] = []
    try:
        api = cluster.api
        namespaces = {OFF: "first-off", ON: "first-on"}
        make_namespace(api, namespaces[OFF], None, enabled=False)
        make_namespace(api, namespaces[ON], ON)
        wait_webhook_sees(api, namespaces[ON], ON)
        for column in (OFF, ON):  # warm-up: images in the page cache, informers listed
            measure(api, namespaces[column], "warm-up", cluster.local_class)
            clean(api, namespaces[column], "warm-up")
        for index in range(args.runs):
            order = (OFF, ON) if index % 2 == 0 else (ON, OFF)
            got: dict[str, float] = {}
            for column in order:
                name = f"run-{index}"
                seconds, placed = measure(api, namespaces[column], name, cluster.local_class)
                clean(api, namespaces[column], name)
                got[column] = seconds
                if column == ON:
                    placements.append(placed)
            off.append(got[OFF])
            on.append(got[ON])
            load.append(loadavg())
            print(
                f"round {index:2}: off {got[OFF]:5.2f} s  on {got[ON]:5.2f} s  "
                f"difference {got[ON] - got[OFF]:+5.2f} s  first pod {placements[-1]}  "
                f"(load {load[-1]:.2f})",
                flush=True,
            )
    finally:
        stack.stop(cluster)
        shutil.rmtree(workdir, ignore_errors=True)
    diff = summary([b - a for a, b in zip(off, on, strict=True)])
    s_off, s_on = summary(off), summary(on)
    print(
        f"{len(off)} paired rounds, PipelineRun creation -> first TaskRun pod Running "
        f"(commit {code['commit']}{' + changes' if code['modified_files'] else ''}; "
        f"1-min load {min(load):.2f}-{max(load):.2f}, median {statistics.median(load):.2f})"
    )
    print(
        f"  no co-scheduling     {s_off['median']:5.2f} s ({s_off['min']:.2f}-{s_off['max']:.2f})"
    )
    print(f"  coschedule ({ON}) {s_on['median']:5.2f} s ({s_on['min']:.2f}-{s_on['max']:.2f})")
    print(
        f"  paired difference    {diff['median']:+5.2f} s median "
        f"({diff['min']:+.2f} to {diff['max']:+.2f})"
    )
    print(
        f"  first pod pinned at admission in {placements.count('pinned')} of "
        f"{len(placements)} runs (else gated, then released)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
