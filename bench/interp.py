"""The interpreter's work per admission: bytecodes run, calls made, and in-process CPU µs,
for one review through the webhook's real ASGI app (``bench.target.webhook_app``: the app
``coschedule serve --no-cluster`` serves), with no network, TLS, HTTP or event loop.

Where the webhook's CPU beyond the bare-ASGI floor goes is the Python it runs per admission
(``perf`` puts the eval loop at twice the floor's share), which a throughput run on this VM
cannot resolve below a few per cent; these counts are exact and load does not change them:

- ``bytecodes``: opcodes executed (``sys.settrace`` with ``f_trace_opcodes``), in every
  Python frame and in ``coschedule/`` frames alone;
- ``calls``: Python function calls (coroutine resumes included) and C calls (builtins and
  methods), by ``sys.setprofile``;
- ``cpu_us``: CPU time (``thread_time``) per admission, a loop of ``--loop`` admissions
  timed ``--rounds`` times: min and median. Load inflates it (cache contention), so compare
  only figures taken side by side.

Payloads: the Tekton TaskRun review (the one ``bench.hotpath`` sends), an Argo Workflow pod,
a Job pod grouped by ``coschedule.dev/group``, and a plain pod in no run.

Run: ``python -m bench.interp [--json FILE]``. ``--baseline DIR`` (a tree holding
``coschedule/``, ``bench/`` and ``tests/fixtures/``, e.g. ``git archive`` of an earlier
commit) measures that tree too, in fresh processes alternating with this checkout's
(``--pairs`` of them), and prints both side by side: the same measuring code, each tree's own
webhook.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from types import FrameType
from typing import Any, Final

ROOT: Final[Path] = Path(__file__).resolve().parent.parent

# payload name -> pod fixture (tests/fixtures/pods)
PAYLOADS: Final[dict[str, str]] = {
    "tekton": "tekton-taskrun",
    "argo": "argo-workflow-pod",
    "job": "job-pod",
    "plain": "bare-pod-no-labels",
}
LOOP: Final[int] = 2000
ROUNDS: Final[int] = 9


def _review(fixture: str) -> bytes:
    from bench.payloads import BENCH_UID, compact
    from tests.fixtures import admission_review, load_pod

    return compact(admission_review(load_pod(fixture), uid=BENCH_UID))


def _scope(body: bytes) -> dict[str, Any]:
    """What uvicorn hands the app for kube-apiserver's POST."""
    from bench.payloads import asgi_post_scope

    return asgi_post_scope(
        [  # kube-apiserver's webhook client's
            (b"host", b"coschedule-webhook.coschedule.svc:443"),
            (b"user-agent", b"kube-apiserver-admission"),
            (b"content-length", b"%d" % len(body)),
            (b"accept", b"application/json, */*"),
            (b"content-type", b"application/json"),
            (b"accept-encoding", b"gzip"),
        ]
    )


def admission(app: Any, body: bytes) -> tuple[Callable[[], None], list[Any]]:
    """One admission as a call, and what the app sent for it (reset by each call). The
    coroutine is run to its end by ``send(None)``: receive and send never suspend, and an
    admission that waits (not one of these payloads, offline) is an error."""
    sent: list[Any] = []
    message = {"type": "http.request", "body": body, "more_body": False}

    async def receive() -> dict[str, Any]:
        return message

    async def send(msg: Any) -> None:
        sent.append(msg)

    scope = _scope(body)

    def run() -> None:
        sent.clear()
        coro: Coroutine[Any, Any, None] = app(dict(scope), receive, send)
        try:
            coro.send(None)
        except StopIteration:
            return
        coro.close()
        raise RuntimeError("the admission waited: not a hot-path payload")

    return run, sent


def _harness() -> str:
    """This file as its frames name it: the stand-in receive and send are not the app's."""
    return admission.__code__.co_filename


def count_bytecodes(run: Callable[[], object], ours: str) -> tuple[int, int]:
    """(opcodes executed in every Python frame but the harness's, of which in files under
    ``ours``)."""
    counts = [0, 0]
    harness = _harness()

    def ours_local(frame: FrameType, event: str, arg: object) -> Any:
        if event == "opcode":
            counts[0] += 1
            counts[1] += 1
        return ours_local

    def other_local(frame: FrameType, event: str, arg: object) -> Any:
        if event == "opcode":
            counts[0] += 1
        return other_local

    def on_call(frame: FrameType, event: str, arg: object) -> Any:
        filename = frame.f_code.co_filename
        if filename == harness:
            return None
        frame.f_trace_opcodes = True
        return ours_local if filename.startswith(ours) else other_local

    sys.settrace(on_call)
    try:
        run()
    finally:
        sys.settrace(None)
    return counts[0], counts[1]


def bytecodes_by_function(run: Callable[[], None]) -> dict[str, int]:
    """Opcodes executed per function (``file:qualified name``), the harness's left out."""
    counts: dict[str, int] = {}
    harness = _harness()

    def local(frame: FrameType, event: str, arg: object) -> Any:
        if event == "opcode":
            code = frame.f_code
            key = f"{Path(code.co_filename).name}:{code.co_qualname}"
            counts[key] = counts.get(key, 0) + 1
        return local

    def on_call(frame: FrameType, event: str, arg: object) -> Any:
        if frame.f_code.co_filename == harness:
            return None
        frame.f_trace_opcodes = True
        return local

    sys.settrace(on_call)
    try:
        run()
    finally:
        sys.settrace(None)
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def count_calls(run: Callable[[], object], ours: str) -> tuple[int, int, int]:
    """(Python calls, of which to functions under ``ours``, C calls), those made by the
    harness left out."""
    counts = [0, 0, 0]
    harness = _harness()

    def on_event(frame: FrameType, event: str, arg: object) -> None:
        filename = frame.f_code.co_filename
        if filename == harness:
            return
        if event == "call":
            counts[0] += 1
            if filename.startswith(ours):
                counts[1] += 1
        elif event == "c_call":
            counts[2] += 1

    sys.setprofile(on_event)
    try:
        run()
    finally:
        sys.setprofile(None)
    return counts[0], counts[1], counts[2]


def cpu_us(run: Callable[[], None], loop: int, rounds: int) -> list[float]:
    """CPU µs per admission of each of ``rounds`` loops of ``loop`` admissions."""
    samples = []
    for _ in range(rounds):
        start = time.thread_time()
        for _ in range(loop):
            run()
        samples.append((time.thread_time() - start) / loop * 1e6)
    return samples


def _admissions() -> dict[str, tuple[Callable[[], None], list[Any]]]:
    """Per payload, one admission through a webhook built as ``bench.target`` builds it."""
    from bench.target import webhook_app
    from coschedule import certs

    with tempfile.TemporaryDirectory() as cert_dir:
        certs.write_bundle(certs.generate(["127.0.0.1"]), Path(cert_dir))
        app, _, _ = webhook_app(Path(cert_dir))
    return {name: admission(app, _review(fixture)) for name, fixture in PAYLOADS.items()}


def measure(
    loop: int = LOOP, rounds: int = ROUNDS, settle: bool = True
) -> dict[str, dict[str, Any]]:
    """The figures of every payload, through this process's ``coschedule`` webhook
    (``settle``: the heap frozen before the timed loops, as a served webhook's is)."""
    import coschedule
    from coschedule import heap

    ours = str(Path(coschedule.__file__).resolve().parent) + os.sep
    runs = _admissions()
    figures: dict[str, dict[str, Any]] = {}
    for name, (run, sent) in runs.items():
        run()  # warm: first-call caches (the namespace's context) filled
        status = sent[0]["status"]
        answer = json.loads(sent[1]["body"])["response"]
        if status != 200 or not answer["allowed"]:
            raise RuntimeError(f"{name}: the webhook answered {status} {answer}")
        all_codes, our_codes = count_bytecodes(run, ours)
        py_calls, our_calls, c_calls = count_calls(run, ours)
        figures[name] = {
            "patched": "patch" in answer,
            "bytecodes": all_codes,
            "bytecodes_ours": our_codes,
            "python_calls": py_calls,
            "python_calls_ours": our_calls,
            "c_calls": c_calls,
        }
    if settle:
        heap.settle()  # as bench.target's webhook before it serves
    for name, (run, _) in runs.items():
        samples = cpu_us(run, loop, rounds)
        figures[name]["cpu_us_min"] = round(min(samples), 2)
        figures[name]["cpu_us_median"] = round(statistics.median(samples), 2)
    return figures


def top_functions() -> dict[str, dict[str, int]]:
    """Per payload, the bytecodes each function ran (most first), through this checkout."""
    runs = _admissions()
    result = {}
    for name, (run, _) in runs.items():
        run()
        result[name] = bytecodes_by_function(run)
    return result


def _in_process(root: Path, loop: int, rounds: int) -> dict[str, dict[str, Any]]:
    """``measure`` in a fresh process whose ``coschedule`` (and bench, fixtures) is
    ``root``'s; this file's measuring code either way (``-P``: not its folder first)."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    command = [sys.executable, "-P", str(Path(__file__).resolve()), "--worker", "--loop", str(loop)]
    command += ["--rounds", str(rounds)]
    done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"bench.interp in {root} failed: {done.stderr[-3000:]}")
    result: dict[str, dict[str, Any]] = json.loads(done.stdout)
    return result


def compare(
    baseline: Path | None, pairs: int, loop: int, rounds: int
) -> dict[str, list[dict[str, dict[str, Any]]]]:
    """Per tree ("now", and "baseline" with ``baseline``), the figures of each fresh process,
    the trees alternating (baseline first in odd pairs) so that load drifts hit both."""
    trees = {"now": ROOT} if baseline is None else {"now": ROOT, "baseline": baseline}
    runs: dict[str, list[dict[str, dict[str, Any]]]] = {name: [] for name in trees}
    for index in range(pairs):
        order = list(trees) if index % 2 == 0 else list(reversed(trees))
        for name in order:
            runs[name].append(_in_process(trees[name], loop, rounds))
    return runs


def summary(runs: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """One tree's figures: the counts (the same in every process) and the medians over its
    processes of each one's min and median µs."""
    first = runs[0]
    result: dict[str, dict[str, Any]] = {}
    for name, figures in first.items():
        row = {k: v for k, v in figures.items() if not k.startswith("cpu_us")}
        for key in ("cpu_us_min", "cpu_us_median"):
            row[key] = round(statistics.median(r[name][key] for r in runs), 2)
        row["cpu_us_per_process"] = [r[name]["cpu_us_median"] for r in runs]
        row["cpu_us_min_per_process"] = [r[name]["cpu_us_min"] for r in runs]
        result[name] = row
    return result


def render(results: dict[str, dict[str, dict[str, Any]]]) -> str:
    """The table; beside a baseline, in how many pairs of processes "now" was cheaper (its
    min, then its median, below the baseline's in the same pair)."""
    columns = list(results)
    paired = "baseline" in results
    lines = [
        "| payload | tree | bytecodes (all / coschedule/) | Python calls (all / ours) "
        "| C calls | CPU µs min / median |"
        + (" now cheaper, pairs (min / median) |" if paired else ""),
        "|---|---|---:|---:|---:|---:|" + ("---:|" if paired else ""),
    ]
    for name in PAYLOADS:
        for tree in columns:
            row = results[tree][name]
            line = (
                f"| {name} | {tree} | {row['bytecodes']:,} / {row['bytecodes_ours']:,} "
                f"| {row['python_calls']} / {row['python_calls_ours']} | {row['c_calls']} "
                f"| {row['cpu_us_min']:.1f} / {row['cpu_us_median']:.1f} |"
            )
            if paired:
                line += f" {_cheaper(results, name)} |" if tree == "now" else " |"
            lines.append(line)
    return "\n".join(lines)


def _cheaper(results: dict[str, dict[str, dict[str, Any]]], name: str) -> str:
    now, base = results["now"][name], results["baseline"][name]
    counts = []
    for key in ("cpu_us_min_per_process", "cpu_us_per_process"):
        counts.append(sum(a < b for a, b in zip(now[key], base[key], strict=True)))
    return f"{counts[0]} / {counts[1]} of {len(now['cpu_us_per_process'])}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--loop", type=int, default=LOOP, help="admissions per timed loop")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="timed loops per process")
    parser.add_argument("--pairs", type=int, default=3, help="processes per tree")
    parser.add_argument("--baseline", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--top",
        type=int,
        default=0,
        help="instead: the N functions running the most bytecodes, per payload (this checkout)",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(measure(args.loop, args.rounds)))
        return 0
    if args.top:
        for name, counts in top_functions().items():
            print(f"{name}: {sum(counts.values()):,} bytecodes")
            for function, count in list(counts.items())[: args.top]:
                print(f"  {count:5}  {function}")
        return 0
    runs = compare(args.baseline, args.pairs, args.loop, args.rounds)
    results = {tree: summary(per_process) for tree, per_process in runs.items()}
    print(render(results))
    print(f"(1-minute load average at the end: {os.getloadavg()[0]:.2f})")
    if args.json is not None:
        doc = {"load_end": os.getloadavg(), "results": results, "processes": runs}
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
