"""Real PipelineRuns: builders for pipelines whose tasks write and read files in their
workspaces, and a watcher that waits for Tekton's verdict while recording what ran where."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

from tests.e2e.kube import Api, ApiError, Obj
from tests.e2e.world import Ticker
from tests.real.stack import STEP_IMAGE
from tests.real.volumes import volume_node

PLACEHOLDER_PREFIX = "affinity-assistant-"
COMPONENT = "app.kubernetes.io/component"
SERVICE_ACCOUNT = "ci-builder"  # made with every namespace (tests/e2e/world.make_namespace)


def placeholder_name(namespace: str, run: str) -> str:
    """DESIGN.md: the run's placeholder, computed as users can."""
    digest = hashlib.sha256(f"{namespace}/{run}".encode()).hexdigest()[:10]
    return PLACEHOLDER_PREFIX + digest


def claim_placeholder_name(namespace: str, claim: str) -> str:
    digest = hashlib.sha256(f"{namespace}/pvc/{claim}".encode()).hexdigest()[:10]
    return PLACEHOLDER_PREFIX + digest


def step(name: str, script: str, cpu: str = "10m") -> Obj:
    return {
        "name": name,
        "image": STEP_IMAGE,
        "computeResources": {"requests": {"cpu": cpu, "memory": "16Mi"}},
        "script": "#!/bin/sh\nset -eu\n" + script,
    }


def task(
    name: str,
    script: str,
    workspaces: list[str],
    *,
    run_after: list[str] | None = None,
    cpu: str = "10m",
) -> Obj:
    entry: Obj = {
        "name": name,
        "workspaces": [{"name": w, "workspace": w} for w in workspaces],
        "taskSpec": {
            "workspaces": [{"name": w} for w in workspaces],
            "steps": [step(name, script, cpu)],
        },
    }
    if run_after:
        entry["runAfter"] = run_after
    return entry


def claim_template(storage_class: str) -> Obj:
    """A small claim of ``storage_class`` ("": the cluster's default class)."""
    spec: Obj = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "16Mi"}}}
    if storage_class:
        spec["storageClassName"] = storage_class
    return {"spec": spec}


def pipeline_run(
    namespace: str,
    name: str,
    tasks: list[Obj],
    workspaces: dict[str, Obj],
    *,
    finally_: list[Obj] | None = None,
    labels: dict[str, str] | None = None,
    status: str | None = None,
    pod_template: Obj | None = None,
) -> Obj:
    """An embedded pipeline; ``workspaces`` maps each workspace name to its binding
    (``{"volumeClaimTemplate": ...}`` or ``{"persistentVolumeClaim": {"claimName": ...}}``)."""
    pipeline: Obj = {"workspaces": [{"name": w} for w in workspaces], "tasks": tasks}
    if finally_:
        pipeline["finally"] = finally_
    template: Obj = {"serviceAccountName": SERVICE_ACCOUNT}
    if pod_template:
        template["podTemplate"] = pod_template
    spec: Obj = {
        "pipelineSpec": pipeline,
        "taskRunTemplate": template,
        "workspaces": [{"name": w, **binding} for w, binding in workspaces.items()],
        "timeouts": {"pipeline": "10m"},
    }
    if status:
        spec["status"] = status
    return {
        "apiVersion": "tekton.dev/v1",
        "kind": "PipelineRun",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": spec,
    }


def write_read_pipeline() -> tuple[list[Obj], list[Obj]]:
    """Two workspaces: ``write`` puts a file in ``src``; ``build`` (src -> cache) and
    ``lint`` (src) run in parallel after it; ``check`` reads what build wrote; the finally
    task ``report`` prints both files. Every task fails if what it reads is not there."""
    tasks = [
        task(
            "write",
            'echo "data of $(context.pipelineRun.name)" > $(workspaces.src.path)/a\n',
            ["src"],
        ),
        task(
            "build",
            "cat $(workspaces.src.path)/a > $(workspaces.cache.path)/b\n"
            "echo built >> $(workspaces.cache.path)/b\n",
            ["src", "cache"],
            run_after=["write"],
        ),
        task("lint", "grep -q 'data of' $(workspaces.src.path)/a\n", ["src"], run_after=["write"]),
        task(
            "check",
            "grep -q built $(workspaces.cache.path)/b\n",
            ["cache"],
            run_after=["build", "lint"],
        ),
    ]
    finally_ = [
        task(
            "report", "cat $(workspaces.src.path)/a $(workspaces.cache.path)/b\n", ["src", "cache"]
        )
    ]
    return tasks, finally_


# Verdicts -----------------------------------------------------------------------------


def succeeded(run: Obj) -> Obj | None:
    for cond in (run.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Succeeded":
            return dict(cond)
    return None


def done(run: Obj | None) -> bool:
    cond = succeeded(run or {})
    return cond is not None and cond.get("status") in ("True", "False")


@dataclass
class Seen:
    """What a namespace showed while a scenario waited: every pod's node (the placeholder's
    too, which goes when the run does), the StatefulSets and the claims."""

    # pod name -> every node a pod of that name was bound to (a StatefulSet's pod keeps its
    # name when it is recreated elsewhere)
    pods: dict[str, set[str]] = field(default_factory=dict)
    statefulsets: set[str] = field(default_factory=set)
    claims: set[str] = field(default_factory=set)

    def record(self, api: Api, namespace: str) -> None:
        for pod in api.list("Pod", namespace):
            node = (pod.get("spec") or {}).get("nodeName")
            if node:
                self.pods.setdefault(pod["metadata"]["name"], set()).add(node)
        self.statefulsets |= {s["metadata"]["name"] for s in api.list("StatefulSet", namespace)}
        self.claims |= {c["metadata"]["name"] for c in api.list("PersistentVolumeClaim", namespace)}

    def placeholder_nodes(self, placeholder: str) -> set[str]:
        return {
            node
            for pod, nodes in self.pods.items()
            if pod.startswith(f"{placeholder}-")
            for node in nodes
        }


@dataclass
class Recorder(Ticker):
    """Records what namespaces show (``Seen``) in a thread, from start to stop, so that what
    goes away with the run (the placeholder) is known after it."""

    thread_name: ClassVar[str] = "recorder"
    keep_errors: ClassVar[int] = 5
    api: Api
    seen: dict[str, Seen] = field(default_factory=dict)
    interval: float = field(default=0.5, kw_only=True)

    def watch(self, namespace: str) -> Seen:
        return self.seen.setdefault(namespace, Seen())

    def step(self) -> None:
        for namespace, seen in list(self.seen.items()):
            try:
                seen.record(self.api, namespace)
            except Exception as exc:  # keep recording the others; shown with a failure
                self.note(exc)


def describe(api: Api, namespace: str) -> str:
    """PipelineRun and TaskRun conditions, pod placement and phases, claims, StatefulSets,
    the namespace's volumes and Events: what a failed scenario prints."""
    lines: list[str] = [f"=== namespace {namespace}"]
    try:
        for run in api.list("PipelineRun", namespace):
            cond = succeeded(run) or {}
            lines.append(
                f"PipelineRun {run['metadata']['name']}: spec.status={run['spec'].get('status')} "
                f"{cond.get('status')} {cond.get('reason')}: {cond.get('message')}"
            )
        for tr in api.list("TaskRun", namespace):
            cond = succeeded(tr) or {}
            lines.append(
                f"  TaskRun {tr['metadata']['name']}: {cond.get('status')} {cond.get('reason')}: "
                f"{cond.get('message')} pod={(tr.get('status') or {}).get('podName')}"
            )
        for pod in api.list("Pod", namespace):
            status = pod.get("status") or {}
            waiting = [
                f"{c['name']}:{state}:{detail.get('reason')} {detail.get('message') or ''}"
                for c in status.get("containerStatuses") or []
                for state, detail in (c.get("state") or {}).items()
                if state != "running" and isinstance(detail, dict)
            ]
            if status.get("reason"):
                waiting.append(f"{status['reason']}: {status.get('message')}")
            unsched = [
                c.get("message")
                for c in status.get("conditions") or []
                if c.get("type") == "PodScheduled" and c.get("status") == "False"
            ]
            lines.append(
                f"  Pod {pod['metadata']['name']}: node={pod['spec'].get('nodeName')} "
                f"phase={status.get('phase')} {waiting or ''} {unsched or ''}"
                f"{' deleting' if pod['metadata'].get('deletionTimestamp') else ''}"
            )
        for claim in api.list("PersistentVolumeClaim", namespace):
            lines.append(
                f"  PVC {claim['metadata']['name']}: {(claim.get('status') or {}).get('phase')} "
                f"volume={claim['spec'].get('volumeName')}"
                f"{' deleting' if claim['metadata'].get('deletionTimestamp') else ''}"
            )
        for sts in api.list("StatefulSet", namespace):
            lines.append(f"  StatefulSet {sts['metadata']['name']}")
        for volume in api.list("PersistentVolume"):
            ref = (volume.get("spec") or {}).get("claimRef") or {}
            if ref.get("namespace") == namespace:
                lines.append(
                    f"  PV {volume['metadata']['name']} -> {ref.get('name')} "
                    f"node={volume_node(volume)} {(volume.get('status') or {}).get('phase')}"
                )
        for event in api.list("Event", namespace)[-25:]:
            obj = event.get("involvedObject") or {}
            lines.append(
                f"  Event {event.get('type')} {event.get('reason')} {obj.get('kind')}/"
                f"{obj.get('name')}: {str(event.get('message'))[:300]}"
            )
    except (ApiError, KeyError) as exc:
        lines.append(f"(could not describe: {exc!r})")
    return "\n".join(lines)


def wait_runs(
    api: Api,
    namespace: str,
    names: list[str],
    *,
    seen: Seen | None = None,
    timeout: float = 240.0,
    until: Callable[[dict[str, Obj]], bool] | None = None,
) -> dict[str, Obj]:
    """Poll until every named PipelineRun has Tekton's verdict (Succeeded True or False) or
    ``until(runs)`` holds, recording into ``seen``; fail with ``describe`` on timeout."""
    deadline = time.monotonic() + timeout
    runs: dict[str, Obj] = {}
    while True:
        if seen is not None:
            seen.record(api, namespace)
        runs = {r["metadata"]["name"]: r for r in api.list("PipelineRun", namespace)}
        if until is not None and until(runs):
            return runs
        if until is None and all(done(runs.get(n)) for n in names):
            return runs
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout:.0f}s waiting for PipelineRuns {names}\n"
                + describe(api, namespace)
            )
        time.sleep(0.5)


def task_pods(api: Api, namespace: str, run: str) -> dict[str, Obj]:
    """pipeline task name -> its pod, for one PipelineRun."""
    out: dict[str, Obj] = {}
    for pod in api.list("Pod", namespace, label_selector=f"tekton.dev/pipelineRun={run}"):
        task_name = (pod["metadata"].get("labels") or {}).get("tekton.dev/pipelineTask")
        if task_name:
            out[task_name] = pod
    return out


def verdict(run: Obj) -> tuple[str, str]:
    cond = succeeded(run) or {}
    return str(cond.get("status")), str(cond.get("reason"))


def assert_succeeded(runs: dict[str, Obj], api: Api, namespace: str, *names: str) -> None:
    for name in names:
        assert verdict(runs[name]) == ("True", "Succeeded"), (
            f"PipelineRun {name}: {succeeded(runs[name])}\n" + describe(api, namespace)
        )
