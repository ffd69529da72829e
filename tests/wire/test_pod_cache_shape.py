"""The reconciler's pod caches decode only what their transforms read (``POD_CACHE``): the
transforms give the same slim pod from it as from the whole parse, for every fixture pod in
every state a run's pod passes through and for generated ones, and they read no field the
shape leaves out (recorded, not assumed)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.watch_decode import running, stored
from coschedule.marks import ANNOTATION_PINNED_NODE, GATE_PLACEHOLDER
from coschedule.reconcile import shapes, stuck
from coschedule.wire.watch_events import POD_CACHE, POD_CACHE_READS, decode_event, decode_list
from tests.fixtures import FIXTURE_NAMES, load_pod
from tests.wire.test_lean import Recording

Obj = dict[str, Any]

# The reconciler's two pod caches, as the controller builds them.
TRANSFORMS: dict[str, Callable[[Obj], Obj]] = {
    "marked": stuck.with_scheduling(shapes.slim_marked_pod),
    "placeholder": stuck.with_condition(shapes.slim_placeholder_pod),
}

REQUIRED_POOL = {
    "requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [
            {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["ab"]}]}
        ]
    }
}


def _unschedulable(pod: Obj) -> None:
    pod["status"]["conditions"] = [
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": "0/3 nodes are available: 3 Insufficient cpu.",
            "lastTransitionTime": "2026-11-29T06:00:03Z",
        }
    ]
    pod["spec"].setdefault("affinity", {})["nodeAffinity"] = REQUIRED_POOL
    pod["spec"]["topologySpreadConstraints"] = [
        {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}
    ]


def _gated(pod: Obj) -> None:
    pod["spec"]["schedulingGates"] = [{"name": GATE_PLACEHOLDER}]
    pod["spec"].setdefault("affinity", {})["nodeAffinity"] = REQUIRED_POOL
    pod["spec"]["nodeSelector"] = {"kubernetes.io/os": "linux"}
    pod["spec"]["tolerations"] = [{"key": "ci", "operator": "Exists", "effect": "NoSchedule"}]


def _sidecars(pod: Obj) -> None:
    pod["spec"].setdefault("initContainers", []).append(
        {
            "name": "proxy",
            "image": "registry.example.com/proxy:1",
            "restartPolicy": "Always",
            "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
        }
    )
    pod["spec"]["overhead"] = {"cpu": "250m", "memory": "120Mi"}
    pod["spec"]["schedulerName"] = "custom-scheduler"


def _running(pod: Obj) -> None:
    pod.update(running(pod))
    pod["metadata"].setdefault("annotations", {})[ANNOTATION_PINNED_NODE] = "node-b"


def _finished(pod: Obj) -> None:
    _running(pod)
    for index, status in enumerate(pod["status"]["containerStatuses"]):
        status["state"] = {
            "terminated": {"exitCode": 0, "finishedAt": f"2026-11-29T06:01:{index:02d}Z"}
        }
    pod["status"]["phase"] = "Succeeded"


def _deleting(pod: Obj) -> None:
    _running(pod)
    pod["metadata"]["deletionTimestamp"] = "2026-11-29T06:02:00Z"
    pod["metadata"]["deletionGracePeriodSeconds"] = 30


STATES: dict[str, Callable[[Obj], None]] = {
    "created": lambda pod: None,
    "unschedulable": _unschedulable,
    "gated": _gated,
    "sidecars": _sidecars,
    "running": _running,
    "finished": _finished,
    "deleting": _deleting,
}


def pod_in(name: str, state: str) -> Obj:
    pod = stored(load_pod(name))
    STATES[state](pod)
    return pod


def cases() -> Iterator[tuple[str, str]]:
    for name in FIXTURE_NAMES:
        for state in STATES:
            yield name, state


def outcome(transform: Callable[[Obj], Obj], obj: Obj) -> Any:
    """The slim pod, or the kind of error a value the transform refuses raises."""
    try:
        return transform(copy.deepcopy(obj))
    except Exception as exc:  # compared, not hidden
        return type(exc)


def same_from_both(pod: Obj) -> None:
    """Each transform gives the same from the shaped decode as from the whole one (or
    refuses both alike), on an event and on a list page."""
    line = orjson.dumps({"type": "MODIFIED", "object": pod})
    page = orjson.dumps({"kind": "PodList", "metadata": {"resourceVersion": "9"}, "items": [pod]})
    shaped, whole = POD_CACHE.event(line)["object"], decode_event(line)["object"]
    (shaped_item,) = POD_CACHE.page(page)["items"]
    (whole_item,) = decode_list(page)["items"]
    for name, transform in TRANSFORMS.items():
        expected = outcome(transform, whole)
        assert outcome(transform, shaped) == expected, name
        assert outcome(transform, shaped_item) == outcome(transform, whole_item), name


@pytest.mark.parametrize(("name", "state"), list(cases()))
def test_the_caches_keep_the_same_from_the_shaped_decode(name: str, state: str) -> None:
    same_from_both(pod_in(name, state))


def test_the_shape_builds_little_of_a_tekton_pod() -> None:
    pod = pod_in("tekton-taskrun", "running")
    line = orjson.dumps({"type": "MODIFIED", "object": pod})
    shaped = POD_CACHE.event(line)["object"]
    # The steps' images, scripts, args, env and mounts, and the container statuses' ids:
    # scanned, not built.
    assert shaped["metadata"] == {k: v for k, v in pod["metadata"].items() if k != "managedFields"}
    for container in shaped["spec"]["containers"] + shaped["spec"]["initContainers"]:
        assert set(container) <= {"resources", "restartPolicy"}
    assert "volumes" not in shaped["spec"]
    assert all(set(s) == {"state"} for s in shaped["status"]["containerStatuses"])
    assert "podIP" not in shaped["status"]
    assert len(orjson.dumps(shaped)) < len(line) / 3


def test_a_declared_field_of_another_type_is_parsed_whole() -> None:
    pod = pod_in("tekton-taskrun", "created")
    pod["spec"]["containers"] = "not a list"
    pod["status"]["extra"] = {"kept": True}
    line = orjson.dumps({"type": "ADDED", "object": pod})
    assert POD_CACHE.event(line) == decode_event(line)


def recorded(pod: Obj, transform: Callable[[Obj], Obj]) -> dict[str, set[str]]:
    reads: dict[str, set[str]] = {"spec": set(), "container": set(), "status": set(), "cs": set()}
    view = copy.deepcopy(pod)
    spec = view["spec"]
    for key in ("containers", "initContainers"):
        if key in spec:
            spec[key] = [Recording(c, reads["container"]) for c in spec[key]]
    view["spec"] = Recording(spec, reads["spec"])
    status = view["status"]
    if "containerStatuses" in status:
        status["containerStatuses"] = [
            Recording(s, reads["cs"]) for s in status["containerStatuses"]
        ]
    view["status"] = Recording(status, reads["status"])
    transform(view)
    return reads


@pytest.mark.parametrize("transform", list(TRANSFORMS))
def test_the_transforms_read_only_what_the_shape_builds(transform: str) -> None:
    seen: dict[str, set[str]] = {"spec": set(), "container": set(), "status": set(), "cs": set()}
    for name, state in cases():
        for part, keys in recorded(pod_in(name, state), TRANSFORMS[transform]).items():
            seen[part] |= keys
    assert seen["spec"] <= set(POD_CACHE_READS["spec"])
    assert seen["container"] <= set(POD_CACHE_READS["spec.containers[]"])
    assert seen["status"] <= set(POD_CACHE_READS["status"])
    assert seen["cs"] <= set(POD_CACHE_READS["status.containerStatuses[]"])
    if transform == "marked":  # the reads above are the transform's, not none at all
        assert {"nodeName", "schedulingGates", "containers", "overhead"} <= seen["spec"]
        assert {"resources", "restartPolicy"} <= seen["container"]
        assert {"phase", "conditions", "containerStatuses"} <= seen["status"]
        assert seen["cs"] == {"state"}


junk = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(FIXTURE_NAMES),
    states=st.lists(st.sampled_from(sorted(STATES)), max_size=3),
    spec_junk=st.dictionaries(st.sampled_from(["volumes", "hostname", "x"]), junk, max_size=2),
    declared=st.dictionaries(st.sampled_from(POD_CACHE_READS["spec"]), junk, max_size=2),
    status_junk=st.dictionaries(st.sampled_from(["podIP", "qosClass", "phase"]), junk, max_size=2),
)
def test_generated_pods_keep_the_same(
    name: str,
    states: list[str],
    spec_junk: Obj,
    declared: Obj,
    status_junk: Obj,
) -> None:
    pod = stored(load_pod(name))
    for state in states:
        STATES[state](pod)
    pod["spec"].update(spec_junk)
    pod["spec"].update(declared)  # any value, of any type, in a field the transforms read
    pod["status"].update(status_junk)
    same_from_both(pod)
