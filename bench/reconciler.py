"""Reconciler at scale: reaction times, RSS and API calls with full caches.

The controller runs unchanged (informers, queue, workers, ``plan``) on a synthesized event
stream: an in-process fake API (``FakeApi``) answers list pages and feeds watch events
generated on the fly from the realistic Tekton fixture marked by the real admission code,
so the fake keeps almost nothing in memory and the RSS is the controller's. Scenario:
5,000 nodes, 2,000 runs of 10 marked pods (20,000 pods), each run's StatefulSet and
placeholder pod already there (steady state after a restart). Then, one at a time:
- cordon a node holding a placeholder pod -> time until the pod DELETE call;
- first pod of a new run -> time until the StatefulSet POST call.
Run: ``python -m bench.reconciler [--samples 200] [--json bench/results/reconciler.json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any, cast

import orjson

from coschedule import heap
from coschedule.config.settings import Settings
from coschedule.kube.client import KubeClient
from coschedule.marks import BadMark, Mode
from coschedule.mutate.decision import AdmissionContext, decide
from coschedule.reconcile import shapes
from coschedule.reconcile.controller import Controller
from coschedule.reconcile.manager import Manager
from coschedule.reconcile.model import OwnerRef
from coschedule.reconcile.placeholder import build_statefulset, group_spec
from coschedule.reconcile.reconciler_metrics import ReconcileMetrics
from coschedule.wire.jsonpatch import apply
from coschedule.wire.watch_events import EVERY_FIELD, EventShape

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "pods" / "tekton-taskrun.json"
SETTINGS = Settings(mode=Mode.PIPELINERUNS)
NAMESPACE = "ci"
TARGET_P99_S = 1.0
TARGET_RSS_MB = 200.0


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class BoundTo:
    """The webhook's placeholder view when every placeholder is bound to ``node``."""

    def __init__(self, node: str) -> None:
        self.bound = node

    def node(self, namespace: str, placeholder: str) -> str | None:
        return self.bound


class Shapes:
    """Full objects made on demand: a marked Tekton pod per (run, task), nodes, sets."""

    def __init__(self) -> None:
        self.template = orjson.loads(FIXTURE.read_bytes())

    def run_name(self, run: int) -> str:
        return f"pr-{run:05d}"

    def marked_pod(self, run: int, task: int, node: str = "") -> dict[str, Any]:
        """A running pod on ``node``, pinned there as the webhook pins a pod whose placeholder
        is bound; without ``node``, a new run's first pod: gated, its placeholder not made."""
        pod: dict[str, Any] = orjson.loads(orjson.dumps(self.template))
        meta = pod["metadata"]
        run_name = self.run_name(run)
        meta["name"] = f"{run_name}-task{task}-pod"
        meta["labels"]["tekton.dev/pipelineRun"] = run_name
        meta["labels"]["tekton.dev/taskRun"] = f"{run_name}-task{task}"
        meta["ownerReferences"][0]["name"] = f"{run_name}-task{task}"
        meta["ownerReferences"][0]["uid"] = f"tr-{run}-{task}"
        view = BoundTo(node) if node else None
        decision = decide(pod, AdmissionContext(SETTINGS, NAMESPACE, placeholders=view))
        marked: dict[str, Any] = apply(pod, decision.ops)
        marked["metadata"].update(
            uid=f"pod-{run}-{task}",
            resourceVersion=str(run * 100 + task),
            creationTimestamp=f"2026-11-21T06:{task:02d}:00Z",
        )
        marked["spec"]["nodeName"] = node
        marked["status"] = {"phase": "Running"} if node else {"phase": "Pending"}
        return marked

    def node(self, index: int, unschedulable: bool = False) -> dict[str, Any]:
        name = f"node-{index:05d}"
        labels = {
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "node.kubernetes.io/instance-type": "m6i.2xlarge",
            "topology.kubernetes.io/zone": f"zone-{index % 3}",
            "topology.kubernetes.io/region": "eu-west-1",
            "node-pool": "ci-builders",
        }
        node: dict[str, Any] = {
            "metadata": {"name": name, "labels": labels, "resourceVersion": str(index)},
            "spec": {"podCIDR": f"10.{index // 250}.{index % 250}.0/24"},
            "status": {
                "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110"},
                "conditions": [{"type": "Ready", "status": "True"}],
                "images": [{"names": [f"registry.example.com/img-{i}:v1"]} for i in range(20)],
            },
        }
        if unschedulable:
            node["spec"]["unschedulable"] = True
            node["metadata"]["resourceVersion"] = f"{index}-cordoned"
        return node

    def statefulset(self, run: int) -> dict[str, Any]:
        pods = [shapes.parse_marked(shapes.slim_marked_pod(self.marked_pod(run, 0)))]
        parsed = [p for p in pods if not isinstance(p, BadMark)]
        group = group_spec(NAMESPACE, parsed[0].marks.placeholder, parsed)
        assert group is not None
        owner = OwnerRef("tekton.dev/v1", "PipelineRun", self.run_name(run), f"pr-uid-{run}")
        body = build_statefulset(group, SETTINGS, owner)
        body["metadata"].update(uid=f"sts-{run}", resourceVersion=f"s{run}")
        return body

    def placeholder_pod(self, run: int, name: str, node: str) -> dict[str, Any]:
        return {
            "metadata": {
                "name": f"{name}-0",
                "namespace": NAMESPACE,
                "resourceVersion": f"p{run}",
                "labels": {
                    "app.kubernetes.io/component": "affinity-assistant",
                    "app.kubernetes.io/instance": name,
                    "app.kubernetes.io/managed-by": "coschedule",
                },
            },
            "spec": {"nodeName": node},
        }


class FakeApi:
    """Just enough of KubeClient for the controller: pages, watch queues, recorded calls.

    Each list and watch path is one kind with its own stream, and each stream has one
    watcher: a path the fake does not know, or a second watch of one kind, fails at once
    (two informers on one queue would each take every other event, and a sample would wait
    for a call that never comes)."""

    def __init__(self, runs: int, pods_per_run: int, nodes: int) -> None:
        self.shapes = Shapes()
        self.runs = runs
        self.pods_per_run = pods_per_run
        self.node_count = nodes
        self.placeholder_names = {run: self._placeholder(run) for run in range(runs)}
        self.watches: dict[str, asyncio.Queue[dict[str, Any]]] = {}
        self.watching: set[str] = set()
        self.discovery = 0  # discovery reads
        self.calls: Counter[str] = Counter()
        self.call_log: list[tuple[str, str, float]] = []

    def _placeholder(self, run: int) -> str:
        pod = self.shapes.marked_pod(run, 0)
        return str(pod["metadata"]["labels"]["coschedule.dev/placeholder"])

    def node_of(self, run: int) -> str:
        return f"node-{(run * 2) % self.node_count:05d}"

    def _kind(self, path: str, params: Mapping[str, Any]) -> str:
        if path == "/api/v1/nodes":
            return "nodes"
        if path == "/api/v1/namespaces":
            return "namespaces"
        if path == "/apis/apps/v1/statefulsets":
            return "statefulsets"
        if path == "/api/v1/pods":
            selector = str(params.get("labelSelector", ""))
            return "placeholder-pods" if "affinity-assistant" in selector else "pods"
        # PipelineRuns are not listed: discovery (``get``) says Tekton's API is not served.
        raise AssertionError(f"FakeApi: no list or watch of {path} (add its kind)")

    def _items(self, kind: str) -> list[Any]:
        if kind == "nodes":
            return list(range(self.node_count))
        if kind == "namespaces":
            return [NAMESPACE]
        if kind == "pods":
            return [(r, t) for r in range(self.runs) for t in range(self.pods_per_run)]
        return list(range(self.runs))

    def _make(self, kind: str, item: Any) -> dict[str, Any]:
        if kind == "nodes":
            return self.shapes.node(item)
        if kind == "namespaces":
            labels = {"kubernetes.io/metadata.name": item, "coschedule.dev/enabled": "true"}
            return {"metadata": {"name": item, "labels": labels, "resourceVersion": "1"}}
        if kind == "pods":
            run, task = item
            return self.shapes.marked_pod(run, task, self.node_of(run))
        if kind == "statefulsets":
            return self.shapes.statefulset(item)
        return self.shapes.placeholder_pod(item, self.placeholder_names[item], self.node_of(item))

    async def list(
        self,
        path: str,
        params: Mapping[str, Any] | None = None,
        *,
        accept: str | None = None,
        shape: EventShape = EVERY_FIELD,  # objects are made as decoded: it changes nothing
    ) -> dict[str, Any]:
        params = params or {}
        kind = self._kind(path, params)
        self.calls[f"LIST {kind}"] += 1
        items = self._items(kind)
        start = int(params.get("continue") or 0)
        limit = int(params.get("limit") or 500)
        page = [self._make(kind, item) for item in items[start : start + limit]]
        meta: dict[str, Any] = {"resourceVersion": "1"}
        if start + limit < len(items):
            meta["continue"] = str(start + limit)
        return {"metadata": meta, "items": page}

    async def watch(
        self,
        path: str,
        params: Mapping[str, Any],
        *,
        opened: Callable[[], None] | None = None,
        accept: str | None = None,
        read_timeout: float | None = None,
        shape: EventShape = EVERY_FIELD,
    ) -> AsyncIterator[dict[str, Any]]:
        kind = self._kind(path, params)
        if kind in self.watching:
            raise AssertionError(f"FakeApi: a second watch of {kind} ({path})")
        self.watching.add(kind)
        if opened is not None:
            opened()
        queue = self.watches.setdefault(kind, asyncio.Queue())
        try:
            while True:
                yield await queue.get()
        finally:
            self.watching.discard(kind)

    def push(self, kind: str, event_type: str, obj: dict[str, Any]) -> None:
        self.watches[kind].put_nowait({"type": event_type, "object": obj})

    def _record(self, verb: str, path: str) -> None:
        self.calls[verb + " " + path.split("/")[-2 if verb != "POST" else -1]] += 1
        self.call_log.append((verb, path, time.monotonic()))

    async def get(self, path: str) -> dict[str, Any] | None:
        if path == "/api/v1" or (path.startswith("/apis/") and path.count("/") == 3):
            # Discovery (is Tekton's API served? no: the PipelineRuns are not watched): not
            # an API call per run, and asked again every 30 s, so not in the figures.
            self.discovery += 1
            return None
        self._record("GET", path)
        name = path.rsplit("/", 1)[-1]
        if "/taskruns/" not in path and "/pipelineruns/" not in path:
            return None  # owners only; anything else (a claim, discovery) is not there: 404
        if "/taskruns/" in path:
            run = name.split("-task")[0]
            index = int(run.removeprefix("pr-"))
            return {
                "metadata": {
                    "name": name,
                    "uid": f"tr-{index}-{name.split('-task')[1]}",
                    "ownerReferences": [
                        {
                            "apiVersion": "tekton.dev/v1",
                            "kind": "PipelineRun",
                            "name": run,
                            "uid": f"pr-uid-{index}",
                            "controller": True,
                        }
                    ],
                }
            }
        index = int(name.removeprefix("pr-"))
        return {
            "metadata": {"name": name, "uid": f"pr-uid-{index}"},
            "status": {"conditions": [{"type": "Succeeded", "status": "Unknown"}]},
        }

    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self._record("POST", path)
        return {"metadata": {"uid": "created"}}

    async def patch(self, path: str, body: Any, **_: Any) -> dict[str, Any]:
        self._record("PATCH", path)
        return {}

    async def replace(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self._record("PUT", path)
        return {}

    async def delete(self, path: str, *, body: Mapping[str, Any] | None = None) -> None:
        self._record("DELETE", path)

    async def aclose(self) -> None:
        return None


# A sample waits this long for its call: far above any reaction measured (under 1 ms), so
# that a call that never comes fails the bench saying which, instead of hanging it.
CALL_TIMEOUT_S = 30.0
# The caches' first lists and the reconciles on taking the lead: about 15 s at full scale.
STARTUP_TIMEOUT_S = 300.0


async def wait_for_call(api: FakeApi, verb: str, fragment: str, since: int) -> float:
    try:
        async with asyncio.timeout(CALL_TIMEOUT_S):
            while True:
                for entry_verb, path, at in api.call_log[since:]:
                    if entry_verb == verb and fragment in path:
                        return at
                await asyncio.sleep(0.0005)
    except TimeoutError:
        seen = [f"{v} {p}" for v, p, _ in api.call_log[since:]][-10:]
        raise TimeoutError(
            f"no {verb} of *{fragment}* within {CALL_TIMEOUT_S:g} s; calls since: {seen or 'none'}"
        ) from None


def full_collection_ms(rounds: int = 5) -> float:
    """The median CPU time of a full (generation 2) collection, in ms: the stall of the
    event loop each time the collector walks the whole heap."""
    times = []
    for _ in range(rounds):
        started = time.process_time()
        gc.collect()
        times.append((time.process_time() - started) * 1000)
    return round(sorted(times)[rounds // 2], 3)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def scenario(runs: int, pods_per_run: int, nodes: int, samples: int) -> dict[str, Any]:
    gc.collect()
    baseline = rss_mb()
    api = FakeApi(runs, pods_per_run, nodes)
    manager = Manager(ReconcileMetrics())
    controller = Controller(
        cast(KubeClient, api), lambda: SETTINGS, manager.metrics, leading=manager.is_leading
    )
    manager.add(controller)
    started = time.monotonic()
    manager.start_informers()
    try:
        return await _measure(api, manager, controller, started, baseline, samples)
    finally:
        await manager.stop()


async def _measure(
    api: FakeApi,
    manager: Manager,
    controller: Controller,
    started: float,
    baseline: float,
    samples: int,
) -> dict[str, Any]:
    runs, pods_per_run, nodes = api.runs, api.pods_per_run, api.node_count
    try:
        await asyncio.wait_for(manager.wait_synced(), STARTUP_TIMEOUT_S)
    except TimeoutError:
        waiting = [
            f"{i.name} ({i.last_error or 'no error'})"
            for i in controller.informers
            if not i.synced.is_set()
        ]
        raise TimeoutError(
            f"caches not synced within {STARTUP_TIMEOUT_S:g} s: {', '.join(waiting)}"
        ) from None
    synced_s = time.monotonic() - started
    manager.start_leading()
    while controller.queue.busy:  # polling the queue from outside
        if time.monotonic() - started > 2 * STARTUP_TIMEOUT_S:
            raise TimeoutError(f"startup reconciles not done within {2 * STARTUP_TIMEOUT_S:g} s")
        await asyncio.sleep(0.05)
    settle_s = time.monotonic() - started
    startup_calls = dict(api.calls)
    startup_writes = sum(v for k, v in api.calls.items() if not k.startswith("LIST"))
    gc.collect()
    rss_full = rss_mb()
    # The process freezes what its caches hold once synced (coschedule.heap, as
    # ``coschedule reconcile`` does): a full collection's walk before and after.
    walk_before = full_collection_ms()
    frozen = heap.settle()
    walk_after = full_collection_ms()

    # Node cordon -> placeholder pod DELETE.
    cordon: list[float] = []
    for sample in range(samples):
        run = (sample * 7) % runs
        index = (run * 2) % nodes
        mark = len(api.call_log)
        pushed = time.monotonic()
        api.push("nodes", "MODIFIED", api.shapes.node(index, unschedulable=True))
        done = await wait_for_call(api, "DELETE", f"/pods/{api.placeholder_names[run]}-0", mark)
        cordon.append(done - pushed)
        api.push("nodes", "MODIFIED", api.shapes.node(index))  # uncordon for the next round

    # First pod of a new run -> StatefulSet POST.
    create: list[float] = []
    before = Counter(api.calls)
    for sample in range(samples):
        run = runs + sample
        pod = api.shapes.marked_pod(run, 0)
        mark = len(api.call_log)
        pushed = time.monotonic()
        api.push("pods", "ADDED", pod)
        done = await wait_for_call(api, "POST", "/statefulsets", mark)
        create.append(done - pushed)
    await asyncio.sleep(0.2)
    new_run_calls = {k: v - before.get(k, 0) for k, v in api.calls.items() if v != before.get(k, 0)}
    gc.collect()
    rss_end = rss_mb()
    relists = sum(v for k, v in api.calls.items() if k.startswith("LIST"))
    per_new_run = {k: round(v / samples, 2) for k, v in new_run_calls.items()}
    return {
        # First the headline figures (bench/report.py picks figures by their key words).
        "cordon_to_delete_ms": {
            "p50": round(pct(cordon, 0.5) * 1000, 2),
            "p99": round(pct(cordon, 0.99) * 1000, 2),
            "max": round(max(cordon) * 1000, 2),
        },
        "first_pod_to_create_ms": {
            "p50": round(pct(create, 0.5) * 1000, 2),
            "p99": round(pct(create, 0.99) * 1000, 2),
            "max": round(max(create) * 1000, 2),
        },
        "rss_mb": round(rss_end, 1),
        "api_calls_per_new_run": round(sum(per_new_run.values()), 2),
        "api_calls_constant_per_run": startup_writes == 0
        and relists == list_pages(runs, pods_per_run, nodes),
        "feed": "synthesized event stream (in-process FakeApi; no HTTP), controller unchanged",
        "nodes": nodes,
        "runs": runs,
        "marked_pods": runs * pods_per_run,
        "samples": samples,
        # Mostly the fake making 20,000 pods through the real admission code.
        "cache_sync_seconds": round(synced_s, 2),
        "startup_settled_seconds": round(settle_s, 2),
        "memory_mb": {
            "baseline_rss": round(baseline, 1),
            "caches_full_rss": round(rss_full, 1),
        },
        "heap": {
            "frozen_objects": frozen,
            "full_collection_ms_before_freeze": walk_before,
            "full_collection_ms_after_freeze": walk_after,
        },
        "api_calls": {
            "list_pages_total": relists,
            "startup_calls_excluding_lists": startup_writes,
            "startup": startup_calls,
            "per_new_run": per_new_run,
            "per_eviction": "1 DELETE pod + 1 POST event",
        },
        "targets": {"p99_seconds": TARGET_P99_S, "rss_mb": TARGET_RSS_MB},
        "ok": pct(cordon, 0.99) <= TARGET_P99_S
        and pct(create, 0.99) <= TARGET_P99_S
        and rss_end <= TARGET_RSS_MB,
    }


def list_pages(runs: int, pods_per_run: int, nodes: int, page: int = 500) -> int:
    """One list per informer, in pages: any more would be a relist."""

    def pages(n: int) -> int:
        return max(1, -(-n // page))

    # marked pods, placeholder pods, nodes, StatefulSets, and the one namespace
    return pages(runs * pods_per_run) + pages(runs) + pages(nodes) + pages(runs) + pages(1)


def render(result: dict[str, Any]) -> str:
    rows = [
        ("feed", result["feed"]),
        (
            "caches",
            f"{result['nodes']} nodes, {result['runs']} runs, {result['marked_pods']} marked pods",
        ),
        (
            "cache sync",
            f"{result['cache_sync_seconds']} s (settled {result['startup_settled_seconds']} s)",
        ),
        (
            "cordon -> pod DELETE",
            "p50 {p50} ms  p99 {p99} ms  max {max} ms".format(**result["cordon_to_delete_ms"]),
        ),
        (
            "first pod -> sts POST",
            "p50 {p50} ms  p99 {p99} ms  max {max} ms".format(**result["first_pod_to_create_ms"]),
        ),
        (
            "RSS",
            f"baseline {result['memory_mb']['baseline_rss']} MB, caches full "
            f"{result['memory_mb']['caches_full_rss']} MB, end {result['rss_mb']} MB",
        ),
        (
            "API calls at startup",
            f"{result['api_calls']['startup_calls_excluding_lists']} "
            f"(+{result['api_calls']['list_pages_total']} list pages of 500 in all, no relists)",
        ),
        (
            "API calls per new run",
            f"{result['api_calls_per_new_run']} {result['api_calls']['per_new_run']}",
        ),
        ("API calls constant per run", str(result["api_calls_constant_per_run"])),
        (
            "full GC walk",
            f"{result['heap']['full_collection_ms_before_freeze']} ms, "
            f"{result['heap']['full_collection_ms_after_freeze']} ms once the caches are "
            f"frozen ({result['heap']['frozen_objects']} objects)",
        ),
        ("targets met", str(result["ok"])),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--pods-per-run", type=int, default=10)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--json", default=str(ROOT / "bench" / "results" / "reconciler.json"))
    parser.add_argument("--quick", action="store_true", help="a tenth of the scale, 20 samples")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.nodes, args.samples = args.runs // 10, args.nodes // 10, 20
    result = asyncio.run(scenario(args.runs, args.pods_per_run, args.nodes, args.samples))
    print(render(result))
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
