"""What reading one watch event costs: the whole parse against ``decode_event`` (and, for
whole pods, ``POD_CACHE``: the fields the reconciler's pod caches read).

Every fixture pod (``tests/fixtures/pods``) as a watch sends it: the server's fields and
``managedFields`` shaped as kube-apiserver keeps them (its creator's entry lists every field
it set, as FieldsV1; coschedule's release and kube-scheduler's status write add theirs),
whole as made and once running (its container statuses written: what the reconciler's pod
caches watch), and as metadata alone (the webhook's). Per event, the least of ``--rounds``
loops of ``--loop``: the whole parse with ``managedFields`` popped (what every cache did
before), ``decode_event`` and, for whole pods, ``POD_CACHE.event`` (checked to give the
marked-pod cache the same slim pod); CPU time of this thread, freeing the result included.
In process, so a floor: in a busy server all cost more (docs/benchmarks.md has the figures
counted in place).

Run: ``python -m bench.watch_decode [--loop 2000] [--rounds 7]``.
"""

from __future__ import annotations

import argparse
import copy
import time
from collections.abc import Callable
from typing import Any

import orjson

from coschedule.reconcile import shapes, stuck
from coschedule.wire.watch_events import POD_CACHE, decode_event
from tests.fixtures import FIXTURE_NAMES, load_pod


def fields_v1(value: Any) -> dict[str, Any]:
    """The FieldsV1 of a value a manager set: ``f:`` keys for fields, ``k:`` for list items
    keyed by name, ``v:`` for scalar items."""
    if isinstance(value, dict):
        return {f"f:{key}": fields_v1(item) for key, item in value.items()}
    if isinstance(value, list):
        found: dict[str, Any] = {".": {}}
        for item in value:
            if isinstance(item, dict) and "name" in item:
                found["k:" + orjson.dumps({"name": item["name"]}).decode()] = fields_v1(item)
            elif not isinstance(item, dict | list):
                found[f"v:{orjson.dumps(item).decode()}"] = {}
        return found
    return {}


def managed_fields(pod: dict[str, Any]) -> list[dict[str, Any]]:
    """The entries a Tekton pod has once released and bound."""
    meta = pod["metadata"]
    created = {
        key: meta[key] for key in ("labels", "annotations", "ownerReferences") if key in meta
    }
    entry = {"apiVersion": "v1", "fieldsType": "FieldsV1", "operation": "Update"}
    return [
        {
            **entry,
            "manager": "tekton-pipelines-controller",
            "time": "2026-11-29T06:00:00Z",
            "fieldsV1": fields_v1({"metadata": created, "spec": pod["spec"]}),
        },
        {
            **entry,
            "manager": "coschedule",
            "time": "2026-11-29T06:00:01Z",
            "fieldsV1": {"f:spec": {"f:affinity": {".": {}, "f:nodeAffinity": {}}}},
        },
        {
            **entry,
            "manager": "kube-scheduler",
            "time": "2026-11-29T06:00:02Z",
            "subresource": "status",
            "fieldsV1": {"f:status": {"f:conditions": {'k:{"type":"PodScheduled"}': {".": {}}}}},
        },
    ]


def stored(pod: dict[str, Any]) -> dict[str, Any]:
    """A fixture pod as a watch sends it: with the server's fields and managedFields."""
    pod = copy.deepcopy(pod)
    meta = pod["metadata"]
    meta.setdefault("name", f"{meta.get('generateName', 'pod-')}x7k2q")
    meta.update(
        uid="5c0e2a4e-8f0b-4d63-9a57-2f6d1f1b3c11",
        resourceVersion="48213",
        creationTimestamp="2026-11-29T06:00:00Z",
        managedFields=managed_fields(pod),
    )
    pod["status"] = {"phase": "Pending", "qosClass": "Burstable"}
    return pod


def running(pod: dict[str, Any], node: str = "node-b") -> dict[str, Any]:
    """A stored pod once bound and started: its status as the kubelet writes it."""
    pod = copy.deepcopy(pod)
    pod["spec"]["nodeName"] = node
    pod["status"] = {
        "phase": "Running",
        "hostIP": "10.0.0.2",
        "podIP": "10.244.1.7",
        "startTime": "2026-11-29T06:00:04Z",
        "qosClass": "Burstable",
        "conditions": [
            {"type": kind, "status": "True", "lastTransitionTime": "2026-11-29T06:00:04Z"}
            for kind in ("PodReadyToStartContainers", "Initialized", "Ready", "PodScheduled")
        ],
        "containerStatuses": [
            {
                "name": c["name"],
                "image": c.get("image", ""),
                "imageID": "sha256:" + "ab" * 32,
                "containerID": "containerd://" + "cd" * 32,
                "ready": True,
                "started": True,
                "restartCount": 0,
                "state": {"running": {"startedAt": "2026-11-29T06:00:05Z"}},
            }
            for c in pod["spec"].get("containers", [])
        ],
    }
    return pod


# What the reconciler's marked-pod cache keeps of an event: the same from either decode.
_MARKED = stuck.with_scheduling(shapes.slim_marked_pod)


def events() -> dict[str, list[bytes]]:
    """Each fixture pod's MODIFIED event: whole (as made, and running) and as metadata
    alone."""
    pods = [stored(load_pod(name)) for name in FIXTURE_NAMES]
    return {
        "whole pod": [orjson.dumps({"type": "MODIFIED", "object": pod}) for pod in pods],
        "whole pod, running": [
            orjson.dumps({"type": "MODIFIED", "object": running(pod)}) for pod in pods
        ],
        "metadata": [
            orjson.dumps(
                {
                    "type": "MODIFIED",
                    "object": {
                        "kind": "PartialObjectMetadata",
                        "apiVersion": "meta.k8s.io/v1",
                        "metadata": pod["metadata"],
                    },
                }
            )
            for pod in pods
        ],
    }


def whole(line: bytes) -> Any:
    """What every cache did before: parse all, then drop managedFields."""
    event = orjson.loads(line)
    event["object"]["metadata"].pop("managedFields", None)
    return event


def per_event_us(
    decode: Callable[[bytes], Any], lines: list[bytes], loop: int, rounds: int
) -> float:
    best = float("inf")
    for _ in range(rounds):
        started = time.thread_time()
        for _ in range(loop):
            for line in lines:
                decode(line)
        best = min(best, (time.thread_time() - started) / (loop * len(lines)))
    return best * 1e6


def measure(loop: int, rounds: int) -> dict[str, dict[str, float]]:
    figures: dict[str, dict[str, float]] = {}
    for shape, lines in events().items():
        pods = shape.startswith("whole pod")
        for line in lines:  # they agree before they are timed
            if decode_event(line) != whole(line):
                raise AssertionError(f"decode_event differs from the whole parse: {shape}")
            if pods and _MARKED(POD_CACHE.event(line)["object"]) != _MARKED(whole(line)["object"]):
                raise AssertionError(f"the marked-pod cache differs under POD_CACHE: {shape}")
        figures[shape] = {
            "bytes": sum(map(len, lines)) / len(lines),
            "whole_us": per_event_us(whole, lines, loop, rounds),
            "decode_event_us": per_event_us(decode_event, lines, loop, rounds),
        }
        if pods:
            figures[shape]["pod_cache_us"] = per_event_us(POD_CACHE.event, lines, loop, rounds)
    return figures


def render(figures: dict[str, dict[str, float]]) -> str:
    rows = [
        "| event (fixture pods, mean size) | whole parse | decode_event | saved "
        "| POD_CACHE | saved |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for shape, row in figures.items():
        saved = 1 - row["decode_event_us"] / row["whole_us"]
        cells = f"| {row['decode_event_us']:.1f} µs | {saved:.0%} "
        if "pod_cache_us" in row:
            shaped = row["pod_cache_us"]
            cells += f"| {shaped:.1f} µs | {1 - shaped / row['whole_us']:.0%} |"
        else:
            cells += "| n/a | |"
        rows.append(f"| {shape} ({row['bytes'] / 1000:.1f} KB) | {row['whole_us']:.1f} µs {cells}")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loop", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    print(render(measure(args.loop, args.rounds)))


if __name__ == "__main__":
    main()
