"""Stuck runs: from a run's pod becoming Unschedulable on its node to every pod of the run
bound on the node the placeholder moved to, measured on the real control plane.

Not a simulation: it runs the e2e relocation scenarios (tests/e2e/test_stuck.py, CPU and
pod-cap cases; kube-apiserver, kube-scheduler and kube-controller-manager 1.36 from
``KUBEBUILDER_ASSETS``, coschedule's webhook and two reconcilers as processes) and reads
the figures they record. The suite's ``stuck-grace-seconds`` is 3; the goal is all pods
bound within grace + 5 s of becoming Unschedulable, i.e. within 5 s of detection.
``lastTransitionTime`` has a resolution of one second, so each figure is ±1 s.
Run: ``python -m bench.stuck [--repeats 2] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
GOAL_AFTER_DETECTION_S = 5.0


def measure(repeats: int) -> dict[str, Any]:
    if not os.environ.get("KUBEBUILDER_ASSETS"):
        return {"available": False, "note": "KUBEBUILDER_ASSETS not set: no control plane"}
    samples: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        figures = Path(tmp) / "stuck.json"
        for _ in range(repeats):
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pytest",
                    "tests/e2e/test_stuck.py",
                    "-k",
                    "no_task_running",
                    "-p",
                    "no:randomly",
                    "-q",
                ],
                cwd=ROOT,
                env={**os.environ, "COSCHEDULE_STUCK_FIGURES": str(figures)},
                capture_output=True,
                text=True,
                timeout=900,
                check=False,
            )
            if done.returncode != 0:
                return {
                    "available": True,
                    "failed": True,
                    "note": done.stdout.strip()[-1500:],
                }
        samples = json.loads(figures.read_text()) if figures.exists() else []
    if not samples:
        return {"available": True, "failed": True, "note": "the scenarios recorded nothing"}
    after = [s["detection_to_all_bound_s"] for s in samples]
    total = [s["unschedulable_to_all_bound_s"] for s in samples]
    return {
        "available": True,
        "failed": False,
        "grace_s": samples[0]["grace_s"],
        "samples": samples,
        "detection_to_all_bound_s": {"median": statistics.median(after), "max": max(after)},
        "unschedulable_to_all_bound_s": {"median": statistics.median(total), "max": max(total)},
        "goal_met": max(after) <= GOAL_AFTER_DETECTION_S,
    }


def render(result: dict[str, Any]) -> str:
    if not result.get("available") or result.get("failed"):
        return f"stuck run relocation (e2e): not measured: {result.get('note')}"
    after = result["detection_to_all_bound_s"]
    total = result["unschedulable_to_all_bound_s"]
    lines = [
        "stuck run relocation, measured on the e2e control plane "
        f"({len(result['samples'])} runs, stuck-grace-seconds {result['grace_s']}):",
        f"  stuck detection -> all pods bound on the new node: median {after['median']:.1f} s, "
        f"max {after['max']:.1f} s (goal <= {GOAL_AFTER_DETECTION_S:.0f} s)"
        f" {'met' if result['goal_met'] else 'NOT met'}",
        f"  Unschedulable -> all pods bound: median {total['median']:.1f} s, "
        f"max {total['max']:.1f} s (goal <= grace + 5 = {result['grace_s'] + 5} s)",
    ]
    for sample in result["samples"]:
        lines.append(
            f"  {sample['cause']}: {sample['from']} -> {sample['to']} in "
            f"{sample['unschedulable_to_all_bound_s']} s"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.stuck", description=__doc__)
    parser.add_argument("--repeats", type=int, default=2, help="e2e sessions (2 runs each)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    result = measure(args.repeats)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(render(result))
    return 0 if not result.get("failed") else 1


if __name__ == "__main__":
    raise SystemExit(main())
