"""What reading one watch event costs: the whole parse against ``decode_event``.

Every fixture pod (``tests/fixtures/pods``) as a watch sends it: the server's fields and
``managedFields`` shaped as kube-apiserver keeps them (its creator's entry lists every field
it set, as FieldsV1; coschedule's release and kube-scheduler's status write add theirs),
once whole (what the reconciler's pod caches watch) and once as metadata alone (the
webhook's). Per event, the least of ``--rounds`` loops of ``--loop``: the whole parse with
``managedFields`` popped (what every cache did before) and ``decode_event``; CPU time of
this thread, freeing the result included. In process, so a floor: in a busy server both
cost more (docs/benchmarks.md has the figures counted in place).

Run: ``python -m bench.watch_decode [--loop 2000] [--rounds 7]``.
"""

from __future__ import annotations

import argparse
import copy
import time
from collections.abc import Callable
from typing import Any

import orjson

from coschedule.wire.watch_events import decode_event
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


def events() -> dict[str, list[bytes]]:
    """Each fixture pod's MODIFIED event, whole and as metadata alone."""
    pods = [stored(load_pod(name)) for name in FIXTURE_NAMES]
    return {
        "whole pod": [orjson.dumps({"type": "MODIFIED", "object": pod}) for pod in pods],
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
        for line in lines:  # the two agree before they are timed
            if decode_event(line) != whole(line):
                raise AssertionError(f"decode_event differs from the whole parse: {shape}")
        figures[shape] = {
            "bytes": sum(map(len, lines)) / len(lines),
            "whole_us": per_event_us(whole, lines, loop, rounds),
            "decode_event_us": per_event_us(decode_event, lines, loop, rounds),
        }
    return figures


def render(figures: dict[str, dict[str, float]]) -> str:
    rows = [
        "| event (fixture pods, mean size) | whole parse | decode_event | saved |",
        "|---|---:|---:|---:|",
    ]
    for shape, row in figures.items():
        saved = 1 - row["decode_event_us"] / row["whole_us"]
        rows.append(
            f"| {shape} ({row['bytes'] / 1000:.1f} KB) | {row['whole_us']:.1f} µs "
            f"| {row['decode_event_us']:.1f} µs | {saved:.0%} |"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loop", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    print(render(measure(args.loop, args.rounds)))


if __name__ == "__main__":
    main()
