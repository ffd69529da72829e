"""``python -m bench.first_pod [--runs N]``: how much later a PipelineRun's first TaskRun pod
runs with coschedule (``pipelineruns`` mode) than with no co-scheduling, on real kubelets and
a real Tekton controller (v1.11.1): the paired difference, round by round.

The run and the method are ``bench.real_latency``'s (two tasks in sequence sharing one
volumeClaimTemplate workspace of the node-local WaitForFirstConsumer class; one run at a
time; the two columns interleaved, the order alternating; each run deleted and gone before
the next; the API polled every 0.1 s from the run's creation). Per coschedule run it also
reads how its first pod was placed: pinned at admission (its placeholder was made from the
run and bound first), or held behind the placeholder's gate and released by the reconciler
(whose patch shows in the pod's managedFields), and, as polled, when the placeholder's pod
was made and bound beside when Tekton made the run's first TaskRun and pod (the seed's
chain, which the webhook's wait for the binding covers). Prints per round both figures and
their difference, then the median and min-max of the differences and of the chain's steps.
A benchmark: it asserts nothing but Tekton's verdict.
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
COMPONENT = "app.kubernetes.io/component"


def _placed(pod: dict[str, object]) -> str:
    """ "released" when the reconciler patched the pod (lifted our gate), else "pinned"."""
    meta = pod.get("metadata") or {}
    assert isinstance(meta, dict)
    managers = {str(m.get("manager")) for m in meta.get("managedFields") or []}
    return "released" if RELEASER in managers else "pinned"


def measure(
    api: Api, namespace: str, name: str, storage_class: str, chain: dict[str, float] | None = None
) -> tuple[float, str]:
    """(seconds from creation to the first pod Running, how that pod was placed). With
    ``chain``, also when (seconds from the run's creation, as polled) the placeholder's pod
    was first seen, first seen bound, and the run's first pod first seen: how long the
    seed's chain takes beside Tekton's first pod."""
    started = time.monotonic()
    api.create(_run(namespace, name, storage_class))
    first: float | None = None
    placed = ""
    trace = chain if chain is not None else {}
    while time.monotonic() - started < 300:
        if first is None:
            # One list for the run's pods and the placeholder's (one run at a time). The
            # TaskRuns are listed in both columns until the first pod is seen, alike.
            pods = api.list("Pod", namespace)
            at = time.monotonic() - started
            ours = [p for p in pods if _labels(p).get("tekton.dev/pipelineRun") == name]
            holders = [p for p in pods if _labels(p).get(COMPONENT) == "affinity-assistant"]
            if holders:
                trace.setdefault("placeholder pod", at)
                if any((p.get("spec") or {}).get("nodeName") for p in holders):
                    trace.setdefault("placeholder bound", at)
            if ours:
                trace.setdefault("first pod", at)
            # Tekton makes the TaskRun, then at once its pod, which a wait at admission
            # keeps from the API until it is decided: the TaskRun says when Tekton asked.
            elif "first taskrun" not in trace and api.list(
                "TaskRun", namespace, label_selector=f"tekton.dev/pipelineRun={name}"
            ):
                trace["first taskrun"] = at
            running = [
                p for p in ours if (p.get("status") or {}).get("phase") in ("Running", "Succeeded")
            ]
            if running:
                first = at
                placed = _placed(running[0])
        run = api.must_get("PipelineRun", name, namespace)
        if done(run):
            if verdict(run) != ("True", "Succeeded"):
                raise RuntimeError(f"{namespace}/{name}: {verdict(run)}")
            return (first if first is not None else time.monotonic() - started), placed
        time.sleep(POLL if first is None else 0.5)
    raise RuntimeError(f"{namespace}/{name} did not finish in 300 s")


def _labels(pod: dict[str, object]) -> dict[str, str]:
    meta = pod.get("metadata") or {}
    assert isinstance(meta, dict)
    labels = meta.get("labels") or {}
    assert isinstance(labels, dict)
    return labels


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
    chains: list[dict[str, float]] = []
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
            chain: dict[str, float] = {}
            for column in order:
                name = f"run-{index}"
                seconds, placed = measure(
                    api,
                    namespaces[column],
                    name,
                    cluster.local_class,
                    chain if column == ON else None,
                )
                clean(api, namespaces[column], name)
                got[column] = seconds
                if column == ON:
                    placements.append(placed)
            off.append(got[OFF])
            on.append(got[ON])
            chains.append(chain)
            load.append(loadavg())
            print(
                f"round {index:2}: off {got[OFF]:5.2f} s  on {got[ON]:5.2f} s  "
                f"difference {got[ON] - got[OFF]:+5.2f} s  first pod {placements[-1]}  "
                f"(load {load[-1]:.2f}); {_chain(chain)}",
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
    for step in ("placeholder pod", "placeholder bound", "first taskrun", "first pod"):
        seen = [c[step] for c in chains if step in c]
        if seen:
            s_step = summary(seen)
            print(
                f"  {step:17} seen {s_step['median']:5.2f} s after the run "
                f"({s_step['min']:.2f}-{s_step['max']:.2f}, {len(seen)} runs)"
            )
    ahead = [
        c["placeholder bound"] - c["first taskrun"]
        for c in chains
        if "placeholder bound" in c and "first taskrun" in c
    ]
    if ahead:
        late = sorted(a for a in ahead if a > 0)
        print(
            f"  placeholder bound after the first TaskRun in {len(late)} of {len(ahead)} runs"
            + (
                f", by {', '.join(f'{a:.2f}' for a in late)} s (the wait each needs)"
                if late
                else ""
            )
        )
    return 0


def _chain(chain: dict[str, float]) -> str:
    """The seed's chain of one run, as polled: when each step was first seen."""
    return ", ".join(f"{step} +{at:.2f} s" for step, at in chain.items()) or "no chain seen"


if __name__ == "__main__":
    sys.exit(main())
