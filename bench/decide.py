"""Pure decide cost per pod (µs): the admission hot path without the network.

Two figures per payload: ``decide`` alone (the pod already parsed), and ``handle``, the
whole body-to-body path the server runs (lean parse, decide, encode, metrics). The payloads
are decided offline (no claim cache: claims grouped as mounted), as the ratio benchmark
runs the server, plus ``tekton in a cluster``: the Tekton pod against the webhook's real
claim cache holding its run's template claim, as the first pod of a run meets it (the claim
is rewritten to the placeholder's and the run's templates are encoded), and ``tekton in a
cluster, later pod``: the same once the placeholder StatefulSet exists. The two ``placement
auto`` rows decide the Tekton pod by node name against the webhook's placeholder cache:
before its placeholder's pod is bound (gated), and after (pinned to its node).
Run: ``python -m bench.decide``. Prints a table; ``--json FILE`` writes the figures.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson

from bench.payloads import (
    affine_tekton_pod,
    fat_pod,
    not_selected_pod,
    review_bytes,
    small_pod,
    tekton_pod,
)
from coschedule.config.settings import Settings
from coschedule.config.store import SettingsStore
from coschedule.kube.claim_cache import ClaimCache
from coschedule.kube.client import Credentials, KubeClient
from coschedule.kube.placeholder_cache import PlaceholderCache
from coschedule.marks import (
    GATE_PLACEHOLDER,
    GATED_BY_POLICY,
    LABEL_GATED_BY,
    TEMPLATE_CLAIM,
    ClaimTemplate,
    Mode,
    Placement,
    placeholder_labels,
)
from coschedule.mutate.decision import AdmissionContext, decide
from coschedule.server.pod_endpoint import PodEndpoint
from coschedule.server.webhook_metrics import WebhookMetrics

GOALS_US = {"tekton": 30.0, "fat": 150.0}
IN_A_CLUSTER = "tekton in a cluster"
LATER_IN_A_CLUSTER = "tekton in a cluster, later pod"
AUTO_GATED = "tekton, placement auto, gated"
AUTO_PINNED = "tekton, placement auto, pinned"
# The same pod as the admission policy coschedule-gate-pods hands it to the webhook (gate
# and label added in kube-apiserver): what the policy costs, or saves, the webhook.
POLICY_GATED = "tekton, policy-gated, kept gated"
POLICY_PINNED = "tekton, policy-gated, pinned"
PAYLOADS: dict[str, Callable[[], dict[str, Any]]] = {
    "small": small_pod,
    "tekton": tekton_pod,
    "tekton, podTemplate affinity": affine_tekton_pod,
    "fat": fat_pod,
    "not-selected": not_selected_pod,
}


# The clock ``per_call_us`` reads: wall time by default; ``--cpu`` reads this process's CPU
# time, which other processes on a busy machine do not inflate (preemption does not count).
CLOCK: list[Callable[[], float]] = [time.perf_counter]


def per_call_us(fn: Callable[[], object], rounds: int = 7, budget: float = 0.3) -> float:
    """Median over rounds of the mean time per call, in µs."""
    clock = CLOCK[0]
    calls = 1
    while True:  # calibrate so that one round takes about `budget` seconds
        start = clock()
        for _ in range(calls):
            fn()
        elapsed = clock() - start
        if elapsed > budget / 4:
            break
        calls *= 2
    calls = max(1, int(calls * budget / max(elapsed, 1e-9)))
    samples = []
    for _ in range(rounds):
        start = clock()
        for _ in range(calls):
            fn()
        samples.append((clock() - start) / calls * 1e6)
    return statistics.median(samples)


def run_claims_cache(pod: dict[str, Any], namespace: str = "ci") -> ClaimCache:
    """The webhook's claim cache (never started: fed the way its watches feed it) holding
    the pod's claims as Tekton makes them for volumeClaimTemplate workspaces: owned by the
    PipelineRun, ReadWriteOnce, not bound yet."""
    cache = ClaimCache(KubeClient(Credentials(server="https://127.0.0.1:1")))
    for informer in (cache.claims, cache.statefulsets, cache.pods):
        informer.synced.set()
    run = pod["metadata"]["labels"]["tekton.dev/pipelineRun"]
    for volume in pod["spec"]["volumes"]:
        claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
        if claim is None:
            continue
        obj = {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {
                "name": claim,
                "namespace": namespace,
                "resourceVersion": "1",
                "uid": f"uid-{claim}",
                "ownerReferences": [
                    {
                        "apiVersion": "tekton.dev/v1",
                        "kind": "PipelineRun",
                        "name": run,
                        "uid": "6b4c1d2e",
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}},
                "storageClassName": "standard",
                "volumeMode": "Filesystem",
            },
            "status": {"phase": "Pending"},
        }
        cache.claims.apply("ADDED", cache.claims.transform(obj))
    return cache


def _row(
    name: str, pod: dict[str, Any], ctx: AdmissionContext, handler: PodEndpoint
) -> dict[str, Any]:
    body = review_bytes(pod)
    status, _ = handler.handle(body)
    assert status == 200
    return {
        "payload": name,
        "bytes": len(body),
        "parse_us": per_call_us(functools.partial(orjson.loads, body)),
        "decide_us": per_call_us(functools.partial(decide, pod, ctx)),
        "handle_us": per_call_us(functools.partial(handler.handle, body)),
        "goal_us": GOALS_US.get(name),
        "mode": ctx.settings.mode.value,
    }


def placeholder_cache() -> PlaceholderCache:
    """The webhook's placeholder cache (never started: fed the way its watch feeds it)."""
    cache = PlaceholderCache(KubeClient(Credentials(server="https://127.0.0.1:1")))
    cache.informer.synced.set()
    return cache


def bind_placeholder(cache: PlaceholderCache, namespace: str, name: str, node: str) -> None:
    """The placeholder's pod, bound to ``node``, into the cache."""
    obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{name}-0",
            "namespace": namespace,
            "resourceVersion": "7",
            "labels": placeholder_labels(name),
        },
        "spec": {"nodeName": node},
        "status": {"phase": "Running"},
    }
    cache.informer.apply("ADDED", cache.informer.transform(obj))


def add_placeholder(
    cache: ClaimCache, namespace: str, name: str, templates: Sequence[ClaimTemplate]
) -> None:
    """The run's placeholder StatefulSet, as the reconciler makes it, into the cache."""
    obj = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, "namespace": namespace, "resourceVersion": "5"},
        "spec": {
            "volumeClaimTemplates": [
                {"metadata": {"name": t.name, "annotations": {TEMPLATE_CLAIM: t.claim}}}
                for t in templates
            ]
        },
    }
    cache.statefulsets.apply("ADDED", cache.statefulsets.transform(obj))


def measure(mode: Mode = Mode.PIPELINERUNS) -> list[dict[str, Any]]:
    ctx = AdmissionContext(Settings(mode=mode), "ci", explain=False)  # as the server calls it
    # The in-cluster rows measure the costlier path: the opt-in claim rewrite (offline, with no
    # claim view, it changes nothing).
    store = SettingsStore(
        None, {"COSCHEDULE_COSCHEDULE": mode.value, "COSCHEDULE_REWRITE_CLAIMS": "true"}
    )
    handler = PodEndpoint(store, WebhookMetrics())
    rows = [_row(name, make(), ctx, handler) for name, make in PAYLOADS.items()]
    pod = tekton_pod()
    claims = run_claims_cache(pod)
    in_cluster = AdmissionContext(
        Settings(mode=mode, rewrite_claims=True), "ci", None, claims, explain=False
    )
    first = decide(pod, in_cluster)
    if first.placeholder is None or not first.templates:
        raise RuntimeError("the Tekton pod must have its template claim rewritten")
    cluster_handler = PodEndpoint(store, WebhookMetrics(), claims=claims)
    rows.append(_row(IN_A_CLUSTER, pod, in_cluster, cluster_handler))
    # Once the reconciler has made the placeholder StatefulSet, a run's pods follow its
    # (immutable) templates instead of working them out: most pods of a run.
    add_placeholder(claims, "ci", first.placeholder, first.templates)
    if decide(pod, in_cluster).templates is not None:
        raise RuntimeError("a later pod must follow the StatefulSet's templates")
    rows.append(_row(LATER_IN_A_CLUSTER, pod, in_cluster, cluster_handler))
    rows += measure_placement(mode)
    return rows


def measure_placement(mode: Mode) -> list[dict[str, Any]]:
    """The Tekton pod placed by node name (``placement: auto``), offline claims as the
    ``tekton`` row: gated (its placeholder not bound), then pinned."""
    placeholders = placeholder_cache()
    ctx = AdmissionContext(
        Settings(mode=mode, placement=Placement.AUTO),
        "ci",
        placeholders=placeholders,
        explain=False,
    )
    store = SettingsStore(
        None, {"COSCHEDULE_COSCHEDULE": mode.value, "COSCHEDULE_PLACEMENT": "auto"}
    )
    handler = PodEndpoint(store, WebhookMetrics(), placeholders=placeholders)
    pod = tekton_pod()
    placeholder = decide(pod, ctx).placeholder
    if placeholder is None or placeholders.node("ci", placeholder) is not None:
        raise RuntimeError("the Tekton pod must join a placeholder that is not bound yet")
    gated = policy_gated(pod)
    rows = [_row(AUTO_GATED, pod, ctx, handler), _row(POLICY_GATED, gated, ctx, handler)]
    bind_placeholder(placeholders, "ci", placeholder, "node-a")
    if placeholders.node("ci", placeholder) != "node-a":
        raise RuntimeError("the placeholder's pod must be bound in the cache")
    rows.append(_row(AUTO_PINNED, pod, ctx, handler))
    rows.append(_row(POLICY_PINNED, gated, ctx, handler))
    return rows


def policy_gated(pod: dict[str, Any]) -> dict[str, Any]:
    """``pod`` as the admission policy leaves it: the gate appended and its label."""
    gated: dict[str, Any] = orjson.loads(orjson.dumps(pod))
    gated["spec"].setdefault("schedulingGates", []).append({"name": GATE_PLACEHOLDER})
    gated["metadata"].setdefault("labels", {})[LABEL_GATED_BY] = GATED_BY_POLICY
    return gated


def render(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| payload | bytes | orjson parse µs | decide µs | whole handle µs | goal (decide) |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        goal = row["goal_us"]
        verdict = (
            ""
            if goal is None
            else (f"≤ {goal:.0f} µs {'met' if row['decide_us'] <= goal else 'MISSED'}")
        )
        lines.append(
            f"| {row['payload']} | {row['bytes']} | {row['parse_us']:.1f} | "
            f"{row['decide_us']:.1f} | {row['handle_us']:.1f} | {verdict} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument(
        "--cpu", action="store_true", help="time by this process's CPU time (a busy machine)"
    )
    args = parser.parse_args()
    if args.cpu:
        CLOCK[0] = time.process_time
    rows = measure()
    print(render(rows))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_bytes(orjson.dumps(rows, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()
