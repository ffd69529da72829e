"""What co-scheduled runs cost the real kube-scheduler and the control plane, as ratios to
plain pods in the same interleaved run; by default as deployed (``coschedule serve`` and
``coschedule reconcile`` running, ``bench/deployed.py``).

The cluster: kube-apiserver, etcd and kube-scheduler v1.36 from ``KUBEBUILDER_ASSETS`` (the
e2e suite's control plane, ``tests/e2e/cluster.py``), N Ready nodes (API objects: 32 CPU,
128 GiB, 110 pods) with 10 bound background pods each (created with ``spec.nodeName``). The
scheduler runs with ``--kube-api-qps 500 --kube-api-burst 500`` so its client rate limit
does not hide what scheduling costs. No node lifecycle controller runs (nothing marks the
kubelet-less nodes unreachable). kube-controller-manager runs the StatefulSet controller
alone, with its own default client limit (20 QPS, burst 30) as most clusters keep it, or
``--kcm-api-qps N``: the placeholders' pods are its work, and a sustained 5 runs/s outruns
that default (docs/benchmarks.md).

The pods: 30 PipelineRuns x 10 Tekton pods (``tests/fixtures``: nine ``tekton-taskrun``
tasks mounting the run's workspace claim and the ``finally`` task), per batch:

- ``plain``: the pods as Tekton creates them (each run's claim bound, usable anywhere), in
  a namespace coschedule does not serve;
- as deployed (the default: all three scenarios): the same pods with real owners (each
  run's PipelineRun and TaskRuns created first) in an enabled namespace, through the
  registered webhook; the reconciler makes each run's placeholder StatefulSet when the run
  is created (kube-controller-manager's StatefulSet controller renders its pod) and lifts
  the gates of pods that arrived before it was bound. Scenarios: ``deployed`` (burst,
  seeded: the runs first, the scheduler running, so their placeholders are bound and the
  pods, made at once with the scheduler stopped, are pinned at admission),
  ``deployed-gated`` (burst, gated: the scheduler stopped from before the runs are made,
  so every pod is gated and the reconciler lifts every gate) and ``deployed-steady`` (a run
  every 200 ms, its PipelineRun, TaskRuns and pods made at its arrival, the scheduler
  running; compared with plain pods arriving at the same rate). Also measured: the
  webhook's and the reconciler's CPU, each run's first pod bound, placeholder bound -> gate
  lifted, the run pods pinned at admission, and what the reconciler logged (stale
  releases, placeholders restored);
- the older stand-ins (``--encoding affinity|pin-after-bound|gate-pin|gate-pin-spread``):
  the pods through ``decide`` in process, the placeholder pod rendered by the bench, the
  gates lifted by the bench (issue 20's candidates);
- ``plain beside``: plain pods again while the co-scheduled batch is still there (the
  spillover: what co-scheduled pods cost everyone else's pods).

Per round: plain, co-scheduled, plain beside; the batches are interleaved so a burst of
other work on the machine touches all three. In a burst the scheduler is stopped (SIGSTOP)
while a batch's pods are created and continued (SIGCONT) once they are all there; its CPU
(utime + stime from ``/proc/PID/stat``) and the wall time are taken from then until every
pod of the batch is bound (a watch on the batch; 0.3 s more for the trailing events and
bindings). In steady both are taken from the first run's arrival; a run's first pod bound
is counted from its first pod sent. The webhook's and the reconciler's CPU are taken from
before the batch's runs are made (the placeholder made for a new run is counted) to the
same end. The co-scheduled batch counts only the run pods: the placeholders' cost is in
it, amortised.

Run: ``python -m bench.scheduler [--quick | --full] [--nodes N ...] [--rounds 3] [--json
FILE] [--keep-logs DIR] [--kcm-api-qps N]``: 500 nodes and 3 rounds by default,
``--quick`` 50 nodes and 5 runs, ``--full`` the issue's scale (5,000 nodes, 5 rounds);
in ``python -m bench`` (``make bench``) unless ``--no-scheduler``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import json
import os
import re
import shutil
import signal
import ssl
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any, Final, cast
from urllib.parse import urlencode

import httptools
import httpx
import jsonpatch
import orjson
import uvloop

from bench import deployed
from bench.decide import add_placeholder, run_claims_cache
from bench.servers import cpu_seconds, loadavg
from coschedule.config.settings import Settings
from coschedule.k8s.constants import PREFERRED
from coschedule.marks import (
    COMPONENT_AFFINITY_ASSISTANT,
    LABEL_COMPONENT,
    BadMark,
    Mode,
    Placement,
    run_placeholder,
)
from coschedule.mutate.decision import AdmissionContext, Decision, decide
from coschedule.placement import node_pin
from coschedule.reconcile.placeholder import build_statefulset, group_spec
from coschedule.reconcile.shapes import parse_marked
from tests.e2e.cluster import ControlPlane, Proc, find_binaries
from tests.e2e.world import strip_service_account_volume
from tests.fixtures import load_pod

Obj = dict[str, Any]

BATCH_LABEL: Final = "bench.coschedule.dev/batch"
# --v=2: kube-scheduler logs each bind with its own time, to the microsecond (``logged_binds``).
SCHEDULER_ARGS: Final = ("--kube-api-qps=500", "--kube-api-burst=500", "--v=2")
# kube-scheduler's line for a bind (klog: I<month><day> <local time>).
BOUND_LOG: Final = re.compile(
    r'^I(\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d+) .*"Successfully bound pod to node" '
    r'pod="[^/"]+/([^"]+)"'
)
LOG_WAIT_S: Final = 3.0  # for the scheduler's last binds of a batch to reach its log
NODE_RESOURCES: Final = {"cpu": "32", "memory": "128Gi", "pods": "110", "ephemeral-storage": "1Ti"}
ZONES: Final = 3
TASK_FIXTURE: Final = "tekton-taskrun"
FINALLY_FIXTURE: Final = "tekton-taskrun-no-workspace"
FIXTURE_CLAIM: Final = "pvc-1f1344866c"
PLAIN_NS: Final = "bench-plain"
CO_NS: Final = "bench-co"
BACKGROUND_NS: Final = "bench-background"
SERVICE_ACCOUNTS: Final = ("default", "ci-builder")
SETTLE_S: Final = 0.3
MERGE_PATCH: Final = "application/merge-patch+json"
JSON_PATCH: Final = "application/json-patch+json"
GOAL_COSCHEDULED: Final = 1.2  # x plain scheduler CPU per pod, at 5,000 nodes
GOAL_SPILLOVER: Final = 1.05
GOAL_NODES: Final = 5000


@dataclass(frozen=True, slots=True)
class Encoding:
    """How a run's pods are tied to its placeholder. ``affinity`` is what coschedule makes
    (``decide`` and the reconciler's StatefulSet, untouched); the others are candidates
    made from those pods by swapping the tie, to choose the next encoding by."""

    name: str
    title: str
    pods: str  # affinity | pin-after-bound | gate-pin
    # How the stand-ins' placeholders keep apart: the preferred anti-affinity to each other
    # they had when these encodings were measured, or the ScheduleAnyway topology spread
    # constraint coschedule gives them now (a placeholder requests almost nothing: without
    # either, the scheduler stacks a batch of them on a few nodes and the runs' pods do not
    # fit there). The deployed encodings' placeholders are the reconciler's own.
    spread: str = "anti-affinity"
    # As deployed: "seeded" (the runs made first, the scheduler running, then their pods at
    # once), "gated" (the scheduler stopped from before the runs are made: no placeholder
    # is bound when the pods arrive) or "steady" (a run every ``STEADY_EVERY_S``).
    scenario: str = "seeded"

    @property
    def cadence_s(self) -> float:
        """Seconds between runs: 0 for a burst."""
        return STEADY_EVERY_S if self.scenario == "steady" else 0.0


DEPLOYED: Final = "deployed"
DEPLOYED_GATED: Final = "deployed-gated"
DEPLOYED_STEADY: Final = "deployed-steady"
AS_DEPLOYED: Final = (DEPLOYED, DEPLOYED_GATED, DEPLOYED_STEADY)
STEADY_EVERY_S: Final = 0.2  # the issue's steady arrival: a run every 200 ms
ENCODINGS: Final = {
    e.name: e
    for e in (
        Encoding(
            DEPLOYED,
            "as deployed, burst, seeded: the runs first (as Tekton makes them), then all "
            "their pods at once",
            DEPLOYED,
        ),
        Encoding(
            DEPLOYED_GATED,
            "as deployed, burst, gated: the scheduler stopped from before the runs are made, "
            "so every pod is gated and the reconciler lifts the gates",
            DEPLOYED,
            scenario="gated",
        ),
        Encoding(
            DEPLOYED_STEADY,
            f"as deployed, steady: a run every {STEADY_EVERY_S * 1000:.0f} ms, its pods with it, "
            "the scheduler running",
            DEPLOYED,
            scenario="steady",
        ),
        Encoding("affinity", "pod affinity (today)", "affinity"),
        Encoding(
            "pin-after-bound",
            "first pod pod affinity, later pods pinned by node name (candidate)",
            "pin-after-bound",
        ),
        Encoding(
            "gate-pin",
            "pods gated, pinned by node name and ungated once the placeholder is bound (candidate)",
            "gate-pin",
        ),
        Encoding(
            "gate-pin-spread",
            "gated and pinned as above, placeholders spread by a topology spread constraint "
            "instead of anti-affinity (candidate)",
            "gate-pin",
            spread="topology-spread",
        ),
    )
}


@dataclass(frozen=True, slots=True)
class Plan:
    nodes: tuple[int, ...] = (500,)
    rounds: int = 3
    groups: int = 30
    per_group: int = 10
    first_pods: int = 1  # pods of a run admitted before its placeholder is bound
    background_per_node: int = 10
    concurrency: int = 48
    bind_timeout_s: float = 1200.0  # a loaded machine at 5,000 nodes: minutes per batch
    keep_logs: Path | None = None  # copy every process's log here at the end
    # Written with what is measured so far after every batch triple (a run stopped early,
    # say at 5,000 nodes against a deadline, keeps its finished scenarios); ``--json``.
    checkpoint: Path | None = None
    encodings: tuple[str, ...] = AS_DEPLOYED
    # kube-controller-manager's client limit (--kube-api-qps and --kube-api-burst): None is
    # its own default (20 QPS, burst 30), which a sustained 5 runs/s outruns (a StatefulSet
    # costs its controller a pod, an Event and status writes); ``--kcm-api-qps``.
    kcm_api_qps: int | None = None
    # The "affinity" encoding is the pod-affinity one, whatever the default placement.
    settings: Settings = field(
        default_factory=lambda: Settings(mode=Mode.PIPELINERUNS, placement=Placement.POD_AFFINITY)
    )


def kcm_args(plan: Plan) -> tuple[str, ...]:
    """kube-controller-manager's flags for ``plan``'s client limit."""
    qps = plan.kcm_api_qps
    return () if qps is None else (f"--kube-api-qps={qps}", f"--kube-api-burst={qps}")


def kcm_limit(qps: int | None) -> str:
    return "its default (20 QPS, burst 30)" if qps is None else f"{qps} QPS, burst {qps}"


QUICK: Final = Plan(nodes=(50,), rounds=1, groups=5)
FULL: Final = Plan(nodes=(5000,), rounds=5)  # the issue's scale: 5,000 nodes, 5 rounds


# ---- the pods ------------------------------------------------------------------------


def tekton_pod(namespace: str, run: str, index: int, last: bool, batch: str) -> Obj:
    """Task ``index`` of ``run`` as Tekton creates it (the fixture renamed, re-owned, without
    the token volume the ServiceAccount plugin adds again); the run's workspace claim is
    ``<run>-ws``. The last task is the run's ``finally`` task (no workspace)."""
    pod = load_pod(FINALLY_FIXTURE if last else TASK_FIXTURE)
    meta = pod["metadata"]
    task = "report-status" if last else f"task-{index}"
    task_run = f"{run}-{task}"
    meta["name"] = f"{task_run}-pod"
    meta["namespace"] = namespace
    meta.pop("generateName", None)
    meta["labels"].update(
        {
            "tekton.dev/pipelineRun": run,
            "tekton.dev/pipelineRunUID": f"uid-{run}",
            "tekton.dev/pipelineTask": task,
            "tekton.dev/taskRun": task_run,
            "tekton.dev/taskRunUID": f"uid-{task_run}",
            BATCH_LABEL: batch,
        }
    )
    meta["ownerReferences"][0].update(name=task_run, uid=f"uid-{task_run}")
    spec = pod["spec"]
    strip_service_account_volume(spec)
    for volume in spec["volumes"]:
        source = volume.get("persistentVolumeClaim")
        if source is not None and source["claimName"] == FIXTURE_CLAIM:
            source["claimName"] = f"{run}-ws"
    return pod


def run_pods(namespace: str, run: str, per_group: int, batch: str) -> list[Obj]:
    return [
        tekton_pod(namespace, run, index, index == per_group - 1, batch)
        for index in range(per_group)
    ]


def mutated(pod: Obj, decision: Decision) -> Obj:
    if not decision.allowed:
        raise RuntimeError(f"decide denied a benchmark pod: {decision.message}")
    result: Obj = jsonpatch.apply_patch(pod, decision.ops)
    return result


def placeholder_pod(sts: Obj, batch: str) -> Obj:
    """Replica 0 of the placeholder StatefulSet, as the StatefulSet controller renders it:
    the template with the pod's identity (name, hostname, labels) and a volume per claim
    template, named after the template, mounting ``<template>-<set>-0``."""
    name = sts["metadata"]["name"]
    template = copy.deepcopy(sts["spec"]["template"])
    pod_name = f"{name}-0"
    labels = {
        **template["metadata"]["labels"],
        "statefulset.kubernetes.io/pod-name": pod_name,
        "apps.kubernetes.io/pod-index": "0",
        "controller-revision-hash": f"{name}-5d8f7c9b6",
        BATCH_LABEL: batch,
    }
    spec = template["spec"]
    spec["hostname"] = pod_name
    spec["subdomain"] = sts["spec"]["serviceName"]
    claims = [
        {
            "name": t["metadata"]["name"],
            "persistentVolumeClaim": {"claimName": f"{t['metadata']['name']}-{pod_name}"},
        }
        for t in sts["spec"].get("volumeClaimTemplates") or []
    ]
    spec["volumes"] = claims + list(spec.get("volumes") or [])
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name,
            "namespace": sts["metadata"]["namespace"],
            "labels": labels,
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "StatefulSet",
                    "name": name,
                    "uid": f"uid-{name}",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": spec,
    }


@dataclass(slots=True)
class Work:
    """One step of a batch: created with the scheduler stopped, then measured until every
    pod in ``expect`` is bound."""

    create: list[Obj] = field(default_factory=list)
    patch: list[tuple[str, list[Obj]]] = field(default_factory=list)  # (pod, JSONPatch)
    expect: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Batch:
    name: str
    kind: str  # plain, beside, or the encoding's name
    namespace: str
    counted: int  # the run pods (what the per-pod figures divide by)
    # Each step is made from the pods bound so far (name -> node): what the webhook's
    # watch-fed view of the placeholders would know.
    steps: list[Callable[[dict[str, str]], Work]] = field(default_factory=list)
    claims: list[str] = field(default_factory=list)  # bound claims the batch needs made
    groups: dict[str, list[str]] = field(default_factory=dict)  # placeholder pod -> its pods
    runs: dict[str, list[str]] = field(default_factory=dict)  # run -> its pods, in order
    # Before the watch opens, outside the measured window (the runs' owners, as Tekton has
    # them before their pods).
    prepare: Callable[[Client], Awaitable[None]] | None = None
    selector: str | None = ""  # the watch's; "" is the batch label, None the namespace
    # Steady: a run every ``cadence_s`` (its owners made by ``prepare_run``, then its pods),
    # the scheduler running; 0 is a burst (every pod made with the scheduler stopped).
    cadence_s: float = 0.0
    prepare_run: Callable[[Client, str], Awaitable[None]] | None = None
    # Burst, gated: the scheduler is stopped before ``prepare``, so no run's placeholder
    # is bound when its pods arrive.
    stop_before_prepare: bool = False


def plain_kind(cadence_s: float) -> str:
    """The kind of the plain batches a scenario is compared with: burst or steady."""
    return "plain:steady" if cadence_s else "plain"


def plain_batch(name: str, plan: Plan, kind: str = "", cadence_s: float = 0.0) -> Batch:
    pods = [
        pod
        for group in range(plan.groups)
        for pod in run_pods(PLAIN_NS, f"pr-{group:02d}", plan.per_group, name)
    ]
    for pod in pods:
        pod["metadata"]["name"] += f"-{name}"
    work = Work(pods, [], [pod["metadata"]["name"] for pod in pods])
    runs: dict[str, list[str]] = {}
    by_run: dict[str, list[Obj]] = {}
    for pod in pods:
        run = pod["metadata"]["labels"]["tekton.dev/pipelineRun"]
        runs.setdefault(run, []).append(pod["metadata"]["name"])
        by_run.setdefault(run, []).append(pod)

    async def prepare_run(client: Client, run: str) -> None:
        await deployed.own(client.create, PLAIN_NS, {run: by_run[run]}, BATCH_LABEL, name)

    # Steady: a run's window starts before its owners are made, as the deployed runs' do, so
    # plain runs make theirs too (in a namespace coschedule does not serve: no webhook).
    return Batch(
        name, kind or plain_kind(cadence_s), PLAIN_NS, len(pods), [lambda _: work], runs=runs,
        cadence_s=cadence_s, prepare_run=prepare_run if cadence_s else None,
    )  # fmt: skip


def plain_claims(plan: Plan) -> list[str]:
    return [f"pr-{group:02d}-ws" for group in range(plan.groups)]


def decided_runs(name: str, plan: Plan) -> Iterator[tuple[Obj, list[Obj], list[str]]]:
    """Per run: its placeholder pod, its pods as ``decide`` mutates them (the webhook in a
    cluster: the first pod decides the claim templates, the later ones follow the
    placeholder's; with ``rewrite-claims`` off the placeholder mounts the engine's claim)
    and the claims they mount."""
    for group in range(plan.groups):
        run = f"pr-{name}-{group:02d}"
        pods = run_pods(CO_NS, run, plan.per_group, name)
        cache = run_claims_cache(pods[0], CO_NS)
        ctx = AdmissionContext(plan.settings, CO_NS, None, cache, explain=False)
        first = decide(pods[0], ctx)
        if first.placeholder is None:
            raise RuntimeError("the first pod of a run must join its run's placeholder")
        templates = first.templates or ()
        add_placeholder(cache, CO_NS, first.placeholder, templates)
        done = [mutated(pods[0], first)] + [mutated(pod, decide(pod, ctx)) for pod in pods[1:]]
        # The reconciler reads the first pod as stored and makes the run's StatefulSet.
        marked = parse_marked(done[0])
        if isinstance(marked, BadMark):
            raise RuntimeError(f"the mutated pod's marks do not parse: {marked}")
        spec = group_spec(CO_NS, first.placeholder, [marked])
        assert spec is not None
        sts = build_statefulset(spec, plan.settings, None, templates)
        holder = placeholder_pod(sts, name)
        # Whatever the claim settings decide (the placeholder's templates' claims, or the
        # engine's claim mounted as it is), every claim mounted must exist, bound.
        claims = sorted(
            {
                volume["persistentVolumeClaim"]["claimName"]
                for pod in (holder, *done)
                for volume in pod["spec"].get("volumes") or []
                if "persistentVolumeClaim" in volume
            }
        )
        yield holder, done, claims


def placeholder_selector_all() -> dict[str, str]:
    return {LABEL_COMPONENT: COMPONENT_AFFINITY_ASSISTANT}


def unplaced(pod: Obj) -> Obj:
    """The decided pod without its placeholder term (the only affinity a fixture pod has)."""
    result = copy.deepcopy(pod)
    del result["spec"]["affinity"]
    return result


def pinned(pod: Obj, node_name: str) -> Obj:
    """The pod with its placeholder term swapped for the pin the webhook makes
    (``placement/node_pin.py``: ``matchFields metadata.name``, the scheduler evaluates that
    one node)."""
    result = unplaced(pod)
    applied: Obj = jsonpatch.apply_patch(result, node_pin.pin_ops(result["spec"], node_name))
    return applied


def gated(pod: Obj) -> Obj:
    """The pod without its placeholder term, held by the placeholder's scheduling gate."""
    result = unplaced(pod)
    applied: Obj = jsonpatch.apply_patch(result, node_pin.gate_ops(result["spec"]))
    return applied


def coscheduled_batch(name: str, plan: Plan, encoding: Encoding) -> Batch:
    """The runs' placeholders and pods in ``encoding``, in the order the scheduler meets
    them: each placeholder before its run's pods."""
    batch = Batch(name, encoding.name, CO_NS, 0)
    holders: list[Obj] = []
    now: list[Obj] = []  # created with the placeholders
    later: list[tuple[str, Obj]] = []  # (placeholder pod, pod) once the placeholder is bound
    for holder, pods, claims in decided_runs(name, plan):
        holder_name = holder["metadata"]["name"]
        if encoding.spread == "anti-affinity":
            # How placeholders kept apart before the spread constraint (the one measured
            # against it): a preferred anti-affinity to each other.
            del holder["spec"]["topologySpreadConstraints"]
            term = {
                "labelSelector": {"matchLabels": placeholder_selector_all()},
                "topologyKey": plan.settings.topology_key,
            }
            holder["spec"].setdefault("affinity", {})["podAntiAffinity"] = {
                PREFERRED: [{"weight": 100, "podAffinityTerm": term}]
            }
        holders.append(holder)
        batch.counted += len(pods)
        batch.claims.extend(claims)
        batch.groups[holder_name] = [p["metadata"]["name"] for p in pods]
        if encoding.pods == "affinity":
            now.extend([holder, *pods])
        elif encoding.pods == "pin-after-bound":
            now.extend([holder, *pods[: plan.first_pods]])
            later.extend((holder_name, pod) for pod in pods[plan.first_pods :])
        elif encoding.pods == "gate-pin":
            held = [gated(pod) for pod in pods]
            now.extend([holder, *held])
            later.extend((holder_name, pod) for pod in held)
        else:
            raise ValueError(f"unknown encoding {encoding.pods!r}")
    first_wave = [pod["metadata"]["name"] for pod in now if not pod["spec"].get("schedulingGates")]
    batch.steps.append(lambda _: Work(now, [], first_wave))
    if later:
        names = [pod["metadata"]["name"] for _, pod in later]
        if encoding.pods == "gate-pin":
            batch.steps.append(
                lambda bound: Work(
                    [],
                    [
                        # The reconciler's one patch: pin, record the pin, lift the gate
                        # (node affinity of a gated pod may still be set).
                        (pod["metadata"]["name"], node_pin.release_ops(pod, bound[holder]))
                        for holder, pod in later
                    ],
                    names,
                )
            )
        else:
            batch.steps.append(
                lambda bound: Work([pinned(pod, bound[holder]) for holder, pod in later], [], names)
            )
    return batch


def deployed_batch(name: str, plan: Plan, encoding: Encoding = ENCODINGS[DEPLOYED]) -> Batch:
    """The runs' pods as Tekton creates them, in the enabled namespace: the registered
    webhook mutates them (pinned at admission when the run's placeholder, made when the run
    was, is bound already; gated otherwise), the reconciler makes each run's placeholder
    and lifts its pods' gates with the pin. ``encoding.scenario``: seeded (the runs made
    first, the scheduler running), gated (the scheduler stopped from before the runs are
    made) or steady (each run made at its arrival, its pods right after)."""
    namespace = deployed.NAMESPACE
    batch = Batch(
        name,
        encoding.name,
        namespace,
        0,
        selector=None,
        cadence_s=encoding.cadence_s,
        stop_before_prepare=encoding.scenario == "gated",
    )
    by_run: dict[str, list[Obj]] = {}
    for group in range(plan.groups):
        run = f"pr-{name}-{group:02d}"
        pods = run_pods(namespace, run, plan.per_group, name)
        by_run[run] = pods
        names = [pod["metadata"]["name"] for pod in pods]
        batch.runs[run] = names
        batch.groups[f"{run_placeholder(namespace, run)}-0"] = names
        batch.claims.append(f"{run}-ws")
        batch.counted += len(pods)
    pods = [pod for run in by_run.values() for pod in run]

    async def prepare(client: Client) -> None:
        await deployed.own(client.create, namespace, by_run, BATCH_LABEL, name)

    async def prepare_run(client: Client, run: str) -> None:
        await deployed.own(client.create, namespace, {run: by_run[run]}, BATCH_LABEL, name)

    if batch.cadence_s:
        batch.prepare_run = prepare_run
    else:
        batch.prepare = prepare
    work = Work(pods, [], [pod["metadata"]["name"] for pod in pods])
    batch.steps.append(lambda _: work)
    return batch


# ---- the cluster ---------------------------------------------------------------------


def node(name: str, index: int) -> Obj:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/os": "linux",
                "topology.kubernetes.io/zone": f"zone-{index % ZONES}",
                "topology.kubernetes.io/region": "bench",
            },
        },
        "status": {
            "capacity": NODE_RESOURCES,
            "allocatable": NODE_RESOURCES,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "node of the scheduler benchmark",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": "v1.36.2",
                "containerRuntimeVersion": "fake://0",
                "kernelVersion": "6.0.0",
                "osImage": "bench",
                "bootID": name,
                "machineID": name,
                "systemUUID": name,
                "kubeProxyVersion": "",
            },
        },
    }


def background_pod(node_name: str, index: int) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"bg-{node_name}-{index}",
            "namespace": BACKGROUND_NS,
            "labels": {"app": f"service-{index}"},
        },
        "spec": {
            "nodeName": node_name,
            "automountServiceAccountToken": False,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
                }
            ],
        },
    }


def bound_claim_objects(namespace: str, claim: str, pv_name: str) -> tuple[Obj, Obj]:
    """A claim bound to a volume usable on every node (the scheduler's VolumeBinding wants
    the bind-completed annotation; no PV controller runs)."""
    pv = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": pv_name},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "hostPath": {"path": f"/tmp/bench/{pv_name}"},
            "claimRef": {"namespace": namespace, "name": claim},
        },
    }
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": claim,
            "namespace": namespace,
            "annotations": {"pv.kubernetes.io/bind-completed": "yes"},
        },
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "",
            "volumeName": pv_name,
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }
    return pv, pvc


class _Conn(asyncio.Protocol):
    """One keep-alive HTTPS connection to the apiserver, one request at a time; answers are
    parsed by httptools (C). httpx costs the client more CPU per request than the
    apiserver spends on it: 50,000 pods would take most of an hour on a shared machine."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.WriteTransport | None = None
        self.waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self.body: list[bytes] = []
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.WriteTransport, transport)

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result((self.parser.get_status_code(), b"".join(self.body)))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError(f"apiserver connection lost: {exc}"))

    async def send(self, raw: bytes) -> tuple[int, bytes]:
        assert self.transport is not None
        if self.closed or self.transport.is_closing():
            raise ConnectionError("apiserver connection closed")
        self.body = []
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(raw)
        return await self.waiter


class Client:
    """Concurrent admin requests to the benchmark's apiserver: a pool of lean keep-alive
    connections for the many small requests, httpx for the watch."""

    def __init__(self, server: str, ca_file: Path, token: str, concurrency: int) -> None:
        self.server = server
        self.context = ssl.create_default_context(cafile=str(ca_file))
        self.token = token
        self.concurrency = concurrency
        self.pool: asyncio.Queue[_Conn] | None = None
        self.conns: list[_Conn] = []

    async def _pool(self) -> asyncio.Queue[_Conn]:
        if self.pool is None:
            pool: asyncio.Queue[_Conn] = asyncio.Queue()
            for _ in range(self.concurrency):
                pool.put_nowait(await self._connect())
            self.pool = pool
        return self.pool

    async def _connect(self) -> _Conn:
        url = httpx.URL(self.server)
        _, conn = await asyncio.get_running_loop().create_connection(
            _Conn, url.host, url.port or 443, ssl=self.context, server_hostname=url.host
        )
        self.conns.append(conn)
        return conn

    async def close(self) -> None:
        for conn in self.conns:
            if conn.transport is not None:
                conn.transport.close()

    async def request(
        self,
        method: str,
        path: str,
        body: Obj | list[Obj] | None = None,
        *,
        params: dict[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Obj:
        target = path + ("?" + urlencode(params) if params else "")
        content = orjson.dumps(body) if body is not None else b""
        head = (
            f"{method} {target} HTTP/1.1\r\nHost: apiserver\r\n"
            f"Authorization: Bearer {self.token}\r\nAccept: application/json\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {len(content)}\r\n\r\n"
        )
        pool = await self._pool()
        conn = await pool.get()
        retried = False
        try:
            # kube-apiserver closes a keep-alive connection idle for 90 s (a long batch leaves
            # most of the pool idle): such a one is replaced, and a request it loses is sent
            # once more on a new one.
            while True:
                if conn.closed or conn.transport is None or conn.transport.is_closing():
                    conn = await self._connect()
                try:
                    status, answer = await conn.send(head.encode() + content)
                    break
                except ConnectionError:
                    if retried:
                        raise
                    retried = True
                    conn.closed = True  # a new one for the second try
        finally:
            pool.put_nowait(conn)
        if retried and method == "POST" and status == 409:
            return {}  # the lost create had landed
        if status >= 300:
            raise RuntimeError(f"{method} {path}: HTTP {status}: {answer[:500].decode()}")
        doc = orjson.loads(answer) if answer else {}
        return doc if isinstance(doc, dict) else {}

    async def create(self, path: str, body: Obj) -> Obj:
        return await self.request("POST", path, body)

    async def merge_patch(self, path: str, body: Obj) -> Obj:
        return await self.request("PATCH", path, body, content_type=MERGE_PATCH)

    async def create_all(self, items: Sequence[tuple[str, Obj]]) -> None:
        """Create in order, as many in flight as there are connections."""
        await self._each([("POST", path, body, "application/json") for path, body in items])

    async def patch_all(self, items: Sequence[tuple[str, list[Obj]]]) -> None:
        await self._each([("PATCH", path, ops, JSON_PATCH) for path, ops in items])

    async def _each(self, calls: Sequence[tuple[str, str, Obj | list[Obj], str]]) -> None:
        queue = iter(calls)

        async def worker() -> None:
            for method, path, body, content_type in queue:
                await self.request(method, path, body, content_type=content_type)

        await asyncio.gather(*(worker() for _ in range(self.concurrency)))


def pods_path(namespace: str) -> str:
    return f"/api/v1/namespaces/{namespace}/pods"


async def make_cluster(client: Client, nodes: int, plan: Plan, log: Callable[[str], None]) -> None:
    for namespace in (BACKGROUND_NS, PLAIN_NS, CO_NS):
        await client.create(
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        )
        for account in SERVICE_ACCOUNTS:
            await client.create(
                f"/api/v1/namespaces/{namespace}/serviceaccounts",
                {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account}},
            )
    names = [f"node-{index:05d}" for index in range(nodes)]
    started = time.monotonic()
    await client.create_all([("/api/v1/nodes", node(name, i)) for i, name in enumerate(names)])
    # TaintNodesByCondition gives a new node the not-ready taint, which only the node
    # lifecycle controller (not running: no kubelets) would lift.
    queue = iter(names)

    async def untaint() -> None:
        for name in queue:
            await client.merge_patch(f"/api/v1/nodes/{name}", {"spec": {"taints": None}})

    await asyncio.gather(*(untaint() for _ in range(client.concurrency)))
    stored = await client.request("GET", f"/api/v1/nodes/{names[0]}")
    if not (stored.get("status") or {}).get("conditions"):
        raise RuntimeError("the apiserver dropped the node status on create")
    log(f"{nodes} nodes in {time.monotonic() - started:.1f}s")
    started = time.monotonic()
    await client.create_all(
        [
            (pods_path(BACKGROUND_NS), background_pod(name, k))
            for k in range(plan.background_per_node)
            for name in names
        ]
    )
    spent = time.monotonic() - started
    log(f"{nodes * plan.background_per_node} bound background pods in {spent:.1f}s")
    await make_claims(client, PLAIN_NS, plain_claims(plan), "plain")


async def make_claims_for(client: Client, namespace: str) -> None:
    """The ServiceAccounts the Tekton fixtures run as, in a namespace made elsewhere."""
    for account in SERVICE_ACCOUNTS:
        await client.create(
            f"/api/v1/namespaces/{namespace}/serviceaccounts",
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account}},
        )


async def make_claims(client: Client, namespace: str, claims: Sequence[str], tag: str) -> None:
    items: list[tuple[str, Obj]] = []
    for index, claim in enumerate(claims):
        pv, pvc = bound_claim_objects(namespace, claim, f"pv-{tag}-{index:03d}")
        items.append(("/api/v1/persistentvolumes", pv))
        items.append((f"/api/v1/namespaces/{namespace}/persistentvolumeclaims", pvc))
    await client.create_all(items)


# ---- measuring -----------------------------------------------------------------------


@dataclass(slots=True)
class BatchResult:
    kind: str
    pods: int
    cpu_s: float
    wall_s: float
    colocated: int | None = None  # groups whose pods all share their placeholder's node
    groups: int = 0
    # Distinct nodes the batch's placeholders are bound to: every run on a node of its own
    # when it equals ``groups`` (what keeping placeholders apart is for).
    holder_nodes: int | None = None
    # Per run: seconds from the scheduler's continue to its first pod bound, as the
    # benchmark's watch saw it, and as kube-scheduler logged its bind (no watch between:
    # under load kube-apiserver delivers watch events late, to the kubelet as to us).
    first_bound: list[float] = field(default_factory=list)
    first_bound_logged: list[float] = field(default_factory=list)
    # kube-apiserver's CPU over the same window as the scheduler's (``cpu_s``): what the
    # batch's writes (binds; releases when gated) and their watch events cost it.
    apiserver_cpu_s: float = 0.0
    # As deployed: the webhook's and the reconciler's CPU over the batch (creation to bound),
    # each gated pod's wait from its placeholder bound to its gate lifted, and what the
    # reconciler logged (releases, stale releases, placeholders restored).
    webhook_cpu_s: float = 0.0
    reconciler_cpu_s: float = 0.0
    lift: list[float] = field(default_factory=list)
    # Per run: seconds from its start to its placeholder bound (negative: bound before; a
    # placeholder bound before the batch's watch opened is left out): what a gated burst's
    # first pod waits on before any release.
    placeholder_bound: list[float] = field(default_factory=list)
    logged: dict[str, int] = field(default_factory=dict)
    # Run pods the webhook gated (the rest were pinned at admission: their run's
    # placeholder was bound when they were made).
    gated: int = 0

    def to_json(self) -> Obj:
        return {
            "kind": self.kind,
            "pods": self.pods,
            "cpu_s": round(self.cpu_s, 3),
            "wall_s": round(self.wall_s, 3),
            "colocated": self.colocated,
            "groups": self.groups,
            "holder_nodes": self.holder_nodes,
            "first_bound_s": [round(t, 3) for t in self.first_bound],
            "first_bound_logged_s": [round(t, 3) for t in self.first_bound_logged],
            "apiserver_cpu_s": round(self.apiserver_cpu_s, 3),
            "webhook_cpu_s": round(self.webhook_cpu_s, 3),
            "reconciler_cpu_s": round(self.reconciler_cpu_s, 3),
            "lift_s": [round(t, 3) for t in self.lift],
            "placeholder_bound_s": [round(t, 3) for t in self.placeholder_bound],
            "logged": self.logged,
            "gated": self.gated,
        }


@dataclass(slots=True)
class Seen:
    """What the batch's watch saw: each pod's node, when it was bound, when our gate left
    it (monotonic seconds)."""

    bound: dict[str, str] = field(default_factory=dict)
    bound_at: dict[str, float] = field(default_factory=dict)
    ungated_at: dict[str, float] = field(default_factory=dict)
    gated: set[str] = field(default_factory=set)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def record(self, obj: Obj) -> None:
        name = obj["metadata"]["name"]
        spec = obj.get("spec") or {}
        now = time.monotonic()
        if node_pin.gate_index(spec) is not None:
            self.gated.add(name)
        elif name in self.gated and name not in self.ungated_at:
            self.ungated_at[name] = now
        node_name = spec.get("nodeName")
        if node_name:
            self.bound[name] = node_name
            self.bound_at.setdefault(name, now)
            self.changed.set()


def _selector(batch: Batch) -> dict[str, str]:
    if batch.selector is None:
        return {}
    return {"labelSelector": batch.selector or f"{BATCH_LABEL}={batch.name}"}


async def watch_bound(client: Client, batch: Batch, resource_version: str, seen: Seen) -> None:
    """Record each pod of the batch as it is bound (name -> node). A watch the apiserver
    ends (a slow reader on a loaded machine is dropped) is opened again from the last event
    seen, or from a fresh list when that version is gone."""
    version: str | None = resource_version
    # A client of its own: cancelling a stream can leave a shared pool's connection stuck.
    async with httpx.AsyncClient(
        base_url=client.server,
        verify=client.context,
        headers={"Authorization": f"Bearer {client.token}"},
        timeout=httpx.Timeout(None),
    ) as http:
        while True:
            if version is None:
                listed = await client.request(
                    "GET", pods_path(batch.namespace), params=_selector(batch)
                )
                for obj in listed.get("items") or []:
                    seen.record(obj)
                version = str(listed["metadata"]["resourceVersion"])
            params = {
                "watch": "true",
                **_selector(batch),
                "resourceVersion": version,
                "allowWatchBookmarks": "false",
            }
            async with http.stream("GET", pods_path(batch.namespace), params=params) as response:
                if response.status_code != 200:
                    await response.aread()
                    raise RuntimeError(f"watch {batch.name}: HTTP {response.status_code}")
                async for line in response.aiter_lines():
                    if not line:
                        continue
                    event = orjson.loads(line)
                    obj = event.get("object") or {}
                    if event.get("type") == "ERROR":  # 410 Gone: list again
                        version = None
                        break
                    version = obj["metadata"]["resourceVersion"]
                    if event.get("type") in ("ADDED", "MODIFIED"):
                        seen.record(obj)
            await asyncio.sleep(0.2)


async def run_batch(
    client: Client,
    scheduler: Proc,
    batch: Batch,
    plan: Plan,
    product: deployed.Deployed | None = None,
    apiserver_pid: int | None = None,
) -> BatchResult:
    if product is not None:
        product.log_counts()  # from here on: a run's placeholder may be made as it is created
    if batch.claims:
        await make_claims(client, batch.namespace, batch.claims, batch.name)
    # The webhook's and the reconciler's CPU from before the runs are made: the placeholder
    # the reconciler makes for a new run is part of what a co-scheduled pod costs.
    others = (product.webhook_pid, product.reconciler_pid) if product is not None else ()
    others_before = [cpu_seconds(pid) for pid in others]
    log_from = scheduler.log_path.stat().st_size if scheduler.log_path.exists() else 0
    if batch.stop_before_prepare:
        os.kill(scheduler.pid, signal.SIGSTOP)  # continued by the step, once the pods are made
    try:
        if batch.prepare is not None:
            await batch.prepare(client)
        listed = await client.request(
            "GET", pods_path(batch.namespace), params={**_selector(batch), "limit": "1"}
        )
    except BaseException:
        os.kill(scheduler.pid, signal.SIGCONT)
        raise
    seen = Seen()
    watcher = asyncio.create_task(
        watch_bound(client, batch, str(listed["metadata"]["resourceVersion"]), seen)
    )
    await asyncio.sleep(0.1)  # the watch is open
    result = BatchResult(batch.kind, batch.counted, 0.0, 0.0, groups=len(batch.groups))
    step_starts: list[dict[str, float]] = []
    try:
        for step in batch.steps:
            work = step(seen.bound)
            spent, took, starts = await _run_step(
                client, (scheduler, apiserver_pid), batch, work, (seen, watcher), plan
            )
            result.cpu_s += spent[0]
            result.apiserver_cpu_s += sum(spent[1:])
            result.wall_s += took
            step_starts.append(starts)
            result.first_bound += first_bound(batch.runs, seen.bound_at, starts)
            result.placeholder_bound += placeholders_bound(
                batch.groups, batch.runs, seen.bound_at, starts
            )
    finally:
        watcher.cancel()
        await asyncio.wait([watcher], timeout=5)
    logged = await scheduler_binds(
        scheduler, log_from, [p for ps in batch.runs.values() for p in ps]
    )
    for starts in step_starts:
        result.first_bound_logged += first_bound(batch.runs, logged, starts)
    if others:
        result.webhook_cpu_s, result.reconciler_cpu_s = (
            cpu_seconds(pid) - was for pid, was in zip(others, others_before, strict=True)
        )
    if product is not None:
        result.logged = product.log_counts()
    missing = [holder for holder in batch.groups if holder not in seen.bound]
    if missing:
        # A placeholder made when its run was created (the reconciler's seed) can be bound
        # before the watch opened: read where it is (its bound time stays unknown).
        listed = await client.request("GET", pods_path(batch.namespace))
        for obj in listed.get("items") or []:
            name = obj["metadata"]["name"]
            node_name = (obj.get("spec") or {}).get("nodeName")
            if name in missing and node_name:
                seen.bound[name] = node_name
    if batch.groups:
        result.colocated = sum(
            1
            for holder, members in batch.groups.items()
            if all(seen.bound.get(member) == seen.bound.get(holder) for member in members)
        )
        result.holder_nodes = len(
            {seen.bound[holder] for holder in batch.groups if holder in seen.bound}
        )
        result.gated = sum(
            1 for members in batch.groups.values() for pod in members if pod in seen.gated
        )
        result.lift = [
            seen.ungated_at[pod] - seen.bound_at[holder]
            for holder, members in batch.groups.items()
            if holder in seen.bound_at
            for pod in members
            if pod in seen.ungated_at
        ]
    return result


def first_bound(
    runs: dict[str, list[str]], bound_at: dict[str, float], starts: dict[str, float]
) -> list[float]:
    """Per run: seconds from its start (the scheduler continued in a burst, its first pod
    sent in steady) to its first pod bound; runs with no pod bound yet are left out."""
    return [
        min(bound_at[p] for p in pods if p in bound_at) - starts[run]
        for run, pods in runs.items()
        if run in starts and any(p in bound_at for p in pods)
    ]


def placeholders_bound(
    groups: dict[str, list[str]],
    runs: dict[str, list[str]],
    bound_at: dict[str, float],
    starts: dict[str, float],
) -> list[float]:
    """Per run: seconds from its start to its placeholder (``groups``: placeholder pod ->
    the run's pods) bound; placeholders not seen bound are left out."""
    run_of = {pod: run for run, pods in runs.items() for pod in pods}
    found = []
    for holder, members in groups.items():
        run = next((run_of[m] for m in members if m in run_of), None)
        if run is not None and run in starts and holder in bound_at:
            found.append(bound_at[holder] - starts[run])
    return found


def arrivals(
    runs: dict[str, list[str]], create: Sequence[Obj], cadence_s: float
) -> list[tuple[float, str, list[Obj]]]:
    """Steady: (seconds after the start, run, its pods to create) for each run, one every
    ``cadence_s``, in the batch's order; pods of no run (none today) come with the first."""
    by_name = {pod["metadata"]["name"]: pod for pod in create}
    plan = [
        (index * cadence_s, run, [by_name.pop(name) for name in names if name in by_name])
        for index, (run, names) in enumerate(runs.items())
    ]
    if plan and by_name:
        plan[0][2].extend(by_name.values())
    return plan


async def _run_step(
    client: Client,
    procs: tuple[Proc, int | None],
    batch: Batch,
    work: Work,
    watch: tuple[Seen, asyncio.Task[None]],
    plan: Plan,
) -> tuple[list[float], float, dict[str, float]]:
    """(CPU seconds of the scheduler and of kube-apiserver, when its pid is given; wall
    seconds; when each run started) from continuing the stopped scheduler (a burst) or the
    first run's arrival (steady) to every expected pod bound."""
    scheduler, apiserver_pid = procs
    pids = [scheduler.pid] + ([apiserver_pid] if apiserver_pid is not None else [])
    seen, watcher = watch
    path = pods_path(batch.namespace)
    if batch.cadence_s:
        before = [cpu_seconds(pid) for pid in pids]
        started = time.monotonic()
        starts: dict[str, float] = {}

        async def arrive(at: float, run: str, pods: list[Obj]) -> None:
            await asyncio.sleep(max(0.0, started + at - time.monotonic()))
            if batch.prepare_run is not None:
                await batch.prepare_run(client, run)  # its PipelineRun and TaskRuns first
            starts[run] = time.monotonic()
            await client.create_all([(path, pod) for pod in pods])

        await asyncio.gather(
            *(arrive(*one) for one in arrivals(batch.runs, work.create, batch.cadence_s))
        )
        await client.patch_all([(f"{path}/{name}", ops) for name, ops in work.patch])
    else:
        os.kill(scheduler.pid, signal.SIGSTOP)
        try:
            await client.create_all([(path, pod) for pod in work.create])
            await client.patch_all([(f"{path}/{name}", ops) for name, ops in work.patch])
            before = [cpu_seconds(pid) for pid in pids]
            started = time.monotonic()
        finally:
            os.kill(scheduler.pid, signal.SIGCONT)
        starts = dict.fromkeys(batch.runs, started)
    deadline = started + plan.bind_timeout_s
    while not all(name in seen.bound for name in work.expect):
        if watcher.done():  # the watch failed: say why
            watcher.result()
            raise RuntimeError(f"batch {batch.name}: the watch ended")
        seen.changed.clear()
        with contextlib.suppress(TimeoutError):  # a second at most: the watch may fail
            await asyncio.wait_for(seen.changed.wait(), 1.0)
        if time.monotonic() > deadline:
            missing = [name for name in work.expect if name not in seen.bound]
            holders = {seen.bound.get(holder, "-") for holder in batch.groups}
            raise RuntimeError(
                f"batch {batch.name}: {len(missing)} of {len(work.expect)} pods not bound after "
                f"{plan.bind_timeout_s:.0f}s (e.g. {missing[:3]}); the placeholders are on "
                f"{len(holders)} node(s) for {len(batch.groups)} runs"
            )
    wall = time.monotonic() - started
    await asyncio.sleep(SETTLE_S)
    spent = [cpu_seconds(pid) - was for pid, was in zip(pids, before, strict=True)]
    return spent, wall, starts


def logged_binds(text: str, year: int) -> dict[str, float]:
    """Pod name -> when kube-scheduler logged its bind (seconds since the epoch; klog writes
    local time without the year), from its log at ``--v=2``; the first bind of a name."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        match = BOUND_LOG.match(line)
        if match is None:
            continue
        month, day, hour, minute, second, fraction, name = match.groups()
        at = datetime(year, int(month), int(day), int(hour), int(minute), int(second))
        found.setdefault(name, at.timestamp() + float(f"0.{fraction}"))
    return found


async def scheduler_binds(scheduler: Proc, offset: int, names: Sequence[str]) -> dict[str, float]:
    """``names`` -> when kube-scheduler logged each bound, on this process's monotonic clock
    (as ``Seen.bound_at``), from its log past ``offset``; those not logged within
    ``LOG_WAIT_S`` are left out."""
    wanted = set(names)
    deadline = time.monotonic() + LOG_WAIT_S
    while True:
        with scheduler.log_path.open("rb") as log:
            log.seek(offset)
            text = log.read().decode(errors="replace")
        epoch_to_monotonic = time.monotonic() - time.time()
        found = logged_binds(text, datetime.now().year)
        if wanted <= found.keys() or time.monotonic() > deadline:
            return {name: at + epoch_to_monotonic for name, at in found.items() if name in wanted}
        await asyncio.sleep(0.2)


async def delete_batch(client: Client, batch: Batch) -> None:
    if batch.kind in AS_DEPLOYED:
        await deployed.clean(client.request, batch.namespace, f"{BATCH_LABEL}={batch.name}")
        return
    selector = f"{BATCH_LABEL}={batch.name}"
    await client.request(
        "DELETE",
        pods_path(batch.namespace),
        params={"labelSelector": selector, "gracePeriodSeconds": "0"},
    )
    if batch.prepare_run is not None:  # plain steady runs' owners: their names come again
        for plural in ("taskruns", "pipelineruns"):
            await client.request(
                "DELETE",
                f"{deployed.TEKTON}/{batch.namespace}/{plural}",
                params={"labelSelector": selector},
            )


# ---- one cluster size ----------------------------------------------------------------


async def measure_nodes(
    nodes: int, plan: Plan, log: Callable[[str], None], done: Sequence[Obj] = ()
) -> Obj:
    binaries, source = find_binaries()
    if binaries is None:
        return {"nodes": nodes, "available": False, "note": source}
    with tempfile.TemporaryDirectory(prefix="coschedule-bench-scheduler-") as tmp:
        plane = ControlPlane(binaries, Path(tmp))
        try:
            api = plane.start_apiserver()
            assert plane.pki is not None
            client = Client(plane.server, plane.pki.ca_crt, plane.pki.admin_token, plan.concurrency)
            try:
                started = time.monotonic()
                product = None
                if any(ENCODINGS[name].pods == DEPLOYED for name in plan.encodings):
                    # In a thread: the installer's client is a blocking one.
                    product = await asyncio.to_thread(
                        deployed.deploy, plane, binaries, Path(tmp), log, kcm_args(plan)
                    )
                else:
                    api.close()
                await make_cluster(client, nodes, plan, log)
                if product is not None:
                    await make_claims_for(client, deployed.NAMESPACE)
                scheduler = plane.start_scheduler(SCHEDULER_ARGS)
                setup_s = time.monotonic() - started
                log(f"cluster of {nodes} nodes ready in {setup_s:.0f}s")
                apiserver_pid = plane.procs["kube-apiserver"].pid
                return await _rounds(
                    client, (scheduler, apiserver_pid), nodes, plan, setup_s, log, product, done
                )
            finally:
                await client.close()
        finally:
            plane.stop()
            if plan.keep_logs is not None:
                shutil.copytree(Path(tmp) / "logs", plan.keep_logs / str(nodes), dirs_exist_ok=True)


async def _rounds(
    client: Client,
    procs: tuple[Proc, int],
    nodes: int,
    plan: Plan,
    setup_s: float,
    log: Callable[[str], None],
    product: deployed.Deployed | None = None,
    done: Sequence[Obj] = (),
) -> Obj:
    encodings = [ENCODINGS[name] for name in plan.encodings]
    scheduler, apiserver_pid = procs

    def co_batch(name: str, encoding: Encoding) -> Batch:
        if encoding.pods == DEPLOYED:
            return deployed_batch(name, plan, encoding)
        return coscheduled_batch(name, plan, encoding)

    # Warm-up, not counted: the scheduler's first batches of each kind.
    warm = [plain_batch("warm-plain", plan), co_batch("warm-co", encodings[0])]
    for batch in warm:
        await run_batch(client, scheduler, batch, plan, product)
        await delete_batch(client, batch)
    load_before = loadavg()
    rows: list[BatchResult] = []
    for index in range(plan.rounds):
        for encoding in encodings:
            # Interleaved: plain alone, the encoding, plain beside it.
            # Steady scenarios are compared with plain pods arriving at the same rate.
            cadence = encoding.cadence_s
            alone = plain_batch(f"plain-{encoding.name}-{index}", plan, cadence_s=cadence)
            rows.append(await run_batch(client, scheduler, alone, plan, None, apiserver_pid))
            await delete_batch(client, alone)
            await asyncio.sleep(1)
            co = co_batch(f"co-{encoding.name}-{index}", encoding)
            rows.append(
                await run_batch(
                    client,
                    scheduler,
                    co,
                    plan,
                    product if encoding.pods == DEPLOYED else None,
                    apiserver_pid,
                )
            )
            beside = plain_batch(
                f"beside-{encoding.name}-{index}", plan, f"beside:{encoding.name}", cadence
            )
            rows.append(await run_batch(client, scheduler, beside, plan, None, apiserver_pid))
            await delete_batch(client, beside)
            await delete_batch(client, co)
            await asyncio.sleep(1)
            log(
                f"{nodes} nodes, round {index + 1}: "
                + ", ".join(
                    f"{r.kind} {r.cpu_s / r.pods * 1000:.2f} ms/pod in {r.wall_s:.2f}s"
                    for r in rows[-3:]
                )
            )
            if plan.checkpoint is not None:
                so_far = partial(nodes, plan, rows, setup_s, load_before, loadavg())
                write_json(plan.checkpoint, [*done, so_far])
    return summarize(nodes, plan, rows, setup_s, load_before, loadavg())


def _totals(rows: Sequence[BatchResult]) -> Obj:
    pods = sum(r.pods for r in rows)
    cpu = sum(r.cpu_s for r in rows)
    wall = sum(r.wall_s for r in rows)
    if not pods:
        return {"pods": 0, "cpu_ms_per_pod": 0.0, "pods_per_s": 0.0}
    first = [t for r in rows for t in r.first_bound]
    first_logged = [t for r in rows for t in r.first_bound_logged]
    lift = [t for r in rows for t in r.lift]
    holders = [t for r in rows for t in r.placeholder_bound]
    logged: dict[str, int] = {}
    for r in rows:
        for key, count in r.logged.items():
            logged[key] = logged.get(key, 0) + count
    webhook = sum(r.webhook_cpu_s for r in rows)
    reconciler = sum(r.reconciler_cpu_s for r in rows)
    grouped = sum(r.pods for r in rows if r.groups)
    return {
        "pods": pods,
        "cpu_ms_per_pod": round(cpu / pods * 1000, 3),
        "pods_per_s": round(pods / wall, 1),
        "first_bound_p50_s": _pct(first, 50),
        "first_bound_p99_s": _pct(first, 99),
        "first_bound_logged_p50_s": _pct(first_logged, 50),
        "first_bound_logged_p99_s": _pct(first_logged, 99),
        "apiserver_ms_per_pod": round(sum(r.apiserver_cpu_s for r in rows) / pods * 1000, 3),
        "webhook_ms_per_pod": round(webhook / pods * 1000, 3),
        "reconciler_ms_per_pod": round(reconciler / pods * 1000, 3),
        "control_plane_ms_per_pod": round((cpu + webhook + reconciler) / pods * 1000, 3),
        "lift_p50_s": _pct(lift, 50),
        "lift_p99_s": _pct(lift, 99),
        "placeholder_bound_p50_s": _pct(holders, 50),
        "placeholder_bound_p99_s": _pct(holders, 99),
        "logged": logged,
        "pinned_at_admission": f"{grouped - sum(r.gated for r in rows)}/{grouped}",
    }


def _pct(values: Sequence[float], q: int) -> float | None:
    """The q-th percentile (nearest rank), or None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, -(-q * len(ordered) // 100) - 1))
    return round(ordered[rank], 3)


def _round_ratios(rows: Sequence[BatchResult], name: str, attr: str) -> list[float]:
    """Per round, the encoding's figure over the plain batch's before it (interleaved: the
    rows run plain, encoding, beside)."""
    ratios: list[float] = []
    plain: BatchResult | None = None
    for row in rows:
        if row.kind.startswith("plain"):
            plain = row
        elif row.kind == name and plain is not None:
            if attr == "cpu":
                mine, base = row.cpu_s / row.pods, plain.cpu_s / plain.pods
            else:  # throughput
                mine, base = row.pods / row.wall_s, plain.pods / plain.wall_s
            if base:
                ratios.append(round(mine / base, 3))
    return ratios


def summarize(
    nodes: int,
    plan: Plan,
    rows: list[BatchResult],
    setup_s: float,
    load_before: float,
    load_after: float,
) -> Obj:
    plains = {
        kind: _totals([r for r in rows if r.kind == kind])
        for kind in ("plain", plain_kind(STEADY_EVERY_S))
    }
    encodings = []
    for name in plan.encodings:
        # Each scenario against plain pods made the same way (a burst, or steady arrivals).
        plain = plains[plain_kind(ENCODINGS[name].cadence_s)]
        mine = [r for r in rows if r.kind == name]
        co = _totals(mine)
        beside = _totals([r for r in rows if r.kind == f"beside:{name}"])
        encodings.append(
            {
                "name": name,
                "title": ENCODINGS[name].title,
                **co,
                "beside_cpu_ms_per_pod": beside["cpu_ms_per_pod"],
                "cpu_ratio": _ratio(co["cpu_ms_per_pod"], plain["cpu_ms_per_pod"]),
                "throughput_ratio": _ratio(co["pods_per_s"], plain["pods_per_s"]),
                "spillover_ratio": _ratio(beside["cpu_ms_per_pod"], plain["cpu_ms_per_pod"]),
                "colocated": f"{sum(r.colocated or 0 for r in mine)}/{sum(r.groups for r in mine)}",
                # Distinct nodes the placeholders took per batch, summed, over the runs: 90/90
                # is every run on a node of its own (the fewest in one batch: the worst stack).
                "distinct_nodes": f"{sum(r.holder_nodes or 0 for r in mine)}/"
                f"{sum(r.groups for r in mine)}",
                "fewest_nodes": min((r.holder_nodes or 0 for r in mine), default=0),
                "cpu_ratios": _round_ratios(rows, name, "cpu"),
                "throughput_ratios": _round_ratios(rows, name, "throughput"),
                "control_plane_ratio": _ratio(
                    co.get("control_plane_ms_per_pod", 0.0), plain["cpu_ms_per_pod"]
                ),
                "scenario": ENCODINGS[name].scenario if ENCODINGS[name].pods == DEPLOYED else None,
                "plain": plain,
            }
        )
    return {
        "nodes": nodes,
        "available": True,
        "background_pods": nodes * plan.background_per_node,
        "rounds": plan.rounds,
        "batch": f"{plan.groups} runs x {plan.per_group} pods",
        "mode": plan.settings.mode.value,
        "setup_s": round(setup_s, 1),
        "kcm_api_qps": plan.kcm_api_qps,
        "load_before": load_before,
        "load_after": load_after,
        "plain": plains["plain"],
        "plain_steady": plains[plain_kind(STEADY_EVERY_S)],
        "encodings": encodings,
        "batches": [r.to_json() for r in rows],
    }


def partial(
    nodes: int,
    plan: Plan,
    rows: list[BatchResult],
    setup_s: float,
    load_before: float,
    load_after: float,
) -> Obj:
    """The summary of a run still going: only the scenarios with a batch measured, the
    rounds begun, marked ``partial``."""
    measured = tuple(name for name in plan.encodings if any(r.kind == name for r in rows))
    result = summarize(
        nodes, replace(plan, encodings=measured), rows, setup_s, load_before, load_after
    )
    result["rounds"] = max((sum(r.kind == name for r in rows) for name in measured), default=0)
    result["partial"] = True
    return result


def write_json(path: Path, results: Sequence[Obj]) -> None:
    """Whole or not at all (a run stopped while writing leaves the last checkpoint)."""
    staged = path.with_name(path.name + ".tmp")
    staged.write_text(json.dumps(list(results), indent=2) + "\n")
    staged.replace(path)


def _ratio(value: float, base: float) -> float | None:
    """None when the base is 0 (a batch too small for the 10 ms tick of /proc)."""
    return round(value / base, 3) if base else None


def _x(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def measure(plan: Plan, log: Callable[[str], None] | None = None) -> list[Obj]:
    say = log or (lambda message: print(message, file=sys.stderr, flush=True))
    results: list[Obj] = []
    for nodes in plan.nodes:
        results.append(uvloop.run(measure_nodes(nodes, plan, say, results)))
    return results


def render(results: Sequence[Obj]) -> str:
    lines = [
        "kube-scheduler v1.36: scheduler CPU per pod of co-scheduled runs (placeholders "
        "included) and of plain pods beside them, as ratios to plain pods in the same run:",
        "",
        "| nodes | encoding | ms/pod (plain) | CPU x plain | throughput x plain "
        "| plain beside it (spillover) | runs co-located | placeholders on distinct nodes |",
        "|---:|---|---:|---:|---:|---:|---|---|",
    ]
    for result in results:
        if not result.get("available"):
            lines.append(f"| {result['nodes']:,} | not measured: {result.get('note')} |")
            continue
        for row in result["encodings"]:
            lines.append(
                f"| {result['nodes']:,} | {row['title']} | {row['cpu_ms_per_pod']:.2f} "
                f"({_plain(result, row)['cpu_ms_per_pod']:.2f}) | {_x(row['cpu_ratio'])} | "
                f"{_x(row['throughput_ratio'])} | {_x(row['spillover_ratio'])} | "
                f"{row['colocated']} | {row['distinct_nodes']} (fewest {row['fewest_nodes']}) |"
            )
    lines += render_deployed(results)
    lines.append("")
    for result in results:
        if result.get("available"):
            lines.append(
                f"{result['nodes']:,} nodes: {result['background_pods']:,} bound background "
                f"pods, batches of {result['batch']}, {result['rounds']} round(s), mode "
                f"{result['mode']}, kube-controller-manager client limit "
                f"{kcm_limit(result.get('kcm_api_qps'))}, set up in {result['setup_s']:.0f}s, "
                f"load {result['load_before']:.1f} -> {result['load_after']:.1f}"
            )
    goal = next((r for r in results if r.get("available") and r["nodes"] == GOAL_NODES), None)
    for row in goal["encodings"] if goal is not None else []:
        met = (row["cpu_ratio"] or 0) <= GOAL_COSCHEDULED and (
            row["spillover_ratio"] or 0
        ) <= GOAL_SPILLOVER
        lines.append(
            f"goal at {GOAL_NODES:,} nodes (co-scheduled <= {GOAL_COSCHEDULED}x, spillover <= "
            f"{GOAL_SPILLOVER}x): {row['title']}: {'met' if met else 'MISSED'}"
        )
    return "\n".join(lines)


def _plain(result: Obj, row: Obj) -> Obj:
    """The plain totals ``row`` is compared with (older results carry only ``plain``)."""
    plain: Obj = row.get("plain") or result["plain"]
    return plain


def _s(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f} s"


def _median(values: Sequence[float]) -> str:
    if not values:
        return "n/a"
    ordered = sorted(values)
    return f"{ordered[len(ordered) // 2]:.2f}x ({ordered[0]:.2f}-{ordered[-1]:.2f})"


SCENARIO_TITLES: Final = {"seeded": "burst, seeded", "gated": "burst, gated", "steady": "steady"}


def render_deployed(results: Sequence[Obj]) -> list[str]:
    """The issue's columns for the deployed processes: scheduler CPU and pods/s as ratios
    to plain pods (median of the rounds' ratios, their range), a run's first pod bound
    (p50 / p99, plain's in brackets), the whole control plane's CPU per pod, and the
    reconciler's own figures."""
    rows = [
        (result, row)
        for result in results
        if result.get("available")
        for row in result["encodings"]
        if row["name"] in AS_DEPLOYED
    ]
    if not rows:
        return []
    lines = [
        "",
        "As deployed (`coschedule serve` registered, `coschedule reconcile` leading). burst, "
        "seeded: each run's PipelineRun and TaskRuns made first (the reconciler makes and the "
        "scheduler binds its placeholder), then every pod at once with the scheduler stopped; "
        "burst, gated: the scheduler stopped from before the runs are made, so every pod is "
        "gated; steady: a run every 200 ms, its pods right after it, the scheduler running "
        "(pods/s is then the arrival rate). Plain pods are made the same way in each:",
        "",
        "| nodes | scenario | scheduler CPU x plain | pods/s x plain "
        "| a run's first pod bound p50 / p99 "
        "(plain) | control-plane CPU per pod x plain (scheduler + webhook + reconciler) "
        "| spillover | pinned at admission |",
        "|---:|---|---:|---:|---|---|---:|---|",
    ]
    for result, row in rows:
        plain = _plain(result, row)
        scenario = SCENARIO_TITLES.get(row.get("scenario") or "seeded", "")
        lines.append(
            f"| {result['nodes']:,} | {scenario} | {_median(row['cpu_ratios'])} | "
            f"{_median(row['throughput_ratios'])} | {_s(row['first_bound_p50_s'])} / "
            f"{_s(row['first_bound_p99_s'])} ({_s(plain['first_bound_p50_s'])} / "
            f"{_s(plain['first_bound_p99_s'])}) | {_x(row['control_plane_ratio'])} "
            f"({row['cpu_ms_per_pod']:.2f} + {row['webhook_ms_per_pod']:.2f} + "
            f"{row['reconciler_ms_per_pod']:.2f} ms; plain {plain['cpu_ms_per_pod']:.2f} ms) | "
            f"{_x(row['spillover_ratio'])} | {row.get('pinned_at_admission', '-')} |"
        )
    lines.append("")
    for result, row in rows:
        logged = row["logged"]
        released = logged.get("released", 0)
        stale = logged.get("release_stale", 0)
        lines.append(
            f"{result['nodes']:,} nodes, {SCENARIO_TITLES.get(row.get('scenario') or 'seeded')}, "
            "reconciler: a run's placeholder bound after its start p50 "
            f"{_s(row.get('placeholder_bound_p50_s'))}, p99 "
            f"{_s(row.get('placeholder_bound_p99_s'))}; placeholder bound -> gate lifted p50 "
            f"{_s(row['lift_p50_s'])}, p99 {_s(row['lift_p99_s'])}; {released} releases, "
            f"{stale} refused as stale ({stale / max(1, released + stale):.1%}); "
            f"{logged.get('labels_restored', 0)} placeholders 'restored'; "
            f"{logged.get('api_errors', 0)} API errors retried; "
            f"{logged.get('created', 0)} placeholders created; "
            f"{row.get('pinned_at_admission', '-')} run pods pinned at admission (never gated)"
        )
    for result, row in rows:
        plain = _plain(result, row)
        if row.get("apiserver_ms_per_pod") is None:
            continue  # a result from before these were measured
        lines.append(
            f"{result['nodes']:,} nodes, {SCENARIO_TITLES.get(row.get('scenario') or 'seeded')}, "
            f"kube-apiserver {row['apiserver_ms_per_pod']:.2f} ms CPU per pod (plain "
            f"{plain.get('apiserver_ms_per_pod', 0.0):.2f} ms); a run's first pod bound as "
            f"kube-scheduler logged it p50 {_s(row.get('first_bound_logged_p50_s'))} / p99 "
            f"{_s(row.get('first_bound_logged_p99_s'))} (plain "
            f"{_s(plain.get('first_bound_logged_p50_s'))} / "
            f"{_s(plain.get('first_bound_logged_p99_s'))}), as the benchmark's watch saw it "
            f"{_s(row['first_bound_p50_s'])} / {_s(row['first_bound_p99_s'])}"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scheduler", description=__doc__)
    parser.add_argument("--nodes", type=int, action="append", help="cluster sizes (repeatable)")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--groups", type=int, default=None, help="runs per batch (default 30)")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK.nodes[0]} nodes, 1 round")
    parser.add_argument(
        "--full",
        action="store_true",
        help=f"the issue's scale: {FULL.nodes[0]:,} nodes, {FULL.rounds} rounds",
    )
    parser.add_argument(
        "--encoding",
        action="append",
        choices=sorted(ENCODINGS),
        help="encodings to measure (repeatable; default: the three as-deployed scenarios, "
        f"{', '.join(AS_DEPLOYED)})",
    )
    parser.add_argument(
        "--json",
        type=Path,
        default=None,
        help="write the results here (also what is measured so far, after every batch triple)",
    )
    parser.add_argument("--keep-logs", type=Path, default=None, help="copy the logs here")
    parser.add_argument(
        "--kcm-api-qps",
        type=int,
        default=None,
        help="kube-controller-manager's --kube-api-qps and --kube-api-burst (default: its own, "
        "20 and 30)",
    )
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL if args.full else Plan()
    if args.nodes:
        plan = replace(plan, nodes=tuple(args.nodes))
    if args.rounds is not None:
        plan = replace(plan, rounds=args.rounds)
    if args.groups is not None:
        plan = replace(plan, groups=args.groups)
    if args.keep_logs is not None:
        plan = replace(plan, keep_logs=args.keep_logs)
    if args.encoding:
        plan = replace(plan, encodings=tuple(args.encoding))
    if args.json is not None:
        plan = replace(plan, checkpoint=args.json)
    if args.kcm_api_qps is not None:
        plan = replace(plan, kcm_api_qps=args.kcm_api_qps)
    results = measure(plan)
    if args.json is not None:
        write_json(args.json, results)
    print(render(results))
    return 0 if all(r.get("available") for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
