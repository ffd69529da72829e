"""Placement by node name (issue 20), the reconciler's half, on the real control plane: a
pod held by the placeholder's scheduling gate is released onto the placeholder's node by
one patch and the scheduler binds it there; a pod pinned to a node its run left (cordon,
stuck relocation) while still pending is deleted, and the pod the engine makes again (the
test plays Tekton's TaskRun reconciler) runs with its run.

The pods are made by the webhook's decision with ``placement: auto``, run in-process with
the view of the placeholder the scenario needs (a pod pinned to a node the placeholder is
leaving comes from a view that lags), and created in a namespace the webhook leaves alone
(mode ``disabled``), so that what is stored is exactly that.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from coschedule.config.settings import Settings
from coschedule.k8s.scheduler_messages import Cause, parse
from coschedule.marks import (
    ANNOTATION_PINNED_NODE,
    GATE_PLACEHOLDER,
    Mode,
    Placement,
    run_placeholder,
)
from coschedule.mutate.decision import AdmissionContext, decide
from coschedule.reconcile.node_pins import REASON_STRANDED
from coschedule.wire.jsonpatch import apply
from tests.e2e.conftest import E2E, STUCK_GRACE
from tests.e2e.kube import Api, Obj, wait_for
from tests.e2e.runs import leader_metric, node, placeholder_pod_name, unschedulable, wait_bound
from tests.e2e.runs import wait_placeholder_bound as placeholder_bound
from tests.e2e.test_stuck import NO_WORKSPACE, events_on, fill
from tests.e2e.world import TektonRun, describe_namespace, in_pool, pod_phase, unique

pytestmark = pytest.mark.e2e


class Seen:
    """The webhook's view of placeholder pods, as the test wants it: bound to ``node``."""

    def __init__(self, node: str | None) -> None:
        self.bound = node

    def node(self, namespace: str, placeholder: str) -> str | None:
        return self.bound


def as_admitted(run: TektonRun, manifest: Obj, pin: str | None) -> Obj:
    """``manifest`` as the webhook admits it with ``placement: auto`` when its view has the
    placeholder bound to ``pin`` (None: not bound): pinned there, or gated."""
    settings = Settings(mode=Mode.PIPELINERUNS, placement=Placement.AUTO)
    decision = decide(manifest, AdmissionContext(settings, run.namespace, placeholders=Seen(pin)))
    assert decision.allowed, decision.reasons
    assert decision.placeholder, decision.reasons
    admitted: Obj = apply(manifest, decision.ops)
    return admitted


def create(run: TektonRun, task: str, pin: str | None, manifest: Obj | None = None) -> Obj:
    manifest = manifest or run.pod_manifest(task, fixture=NO_WORKSPACE)
    return run.submit(task, as_admitted(run, manifest, pin))


def pinned_to(pod: Obj) -> str | None:
    return (pod["metadata"].get("annotations") or {}).get(ANNOTATION_PINNED_NODE)


def wait_gone(api: Api, ns: str, pod: Obj, why: str, timeout: float = 30) -> None:
    name, uid = pod["metadata"]["name"], pod["metadata"]["uid"]

    def gone() -> bool:
        now = api.get("Pod", name, ns)
        return now is None or now["metadata"]["uid"] != uid

    wait_for(
        f"pod {ns}/{name} deleted ({why})",
        gone,
        timeout=timeout,
        describe=lambda: describe_namespace(api, ns),
    )


def recreated_event(api: Api, ns: str, run: TektonRun, pod: str) -> dict[str, Any]:
    found: list[Obj] = wait_for(
        f"a {REASON_STRANDED} Event on PipelineRun {run.name}",
        lambda: (
            [
                e
                for e in events_on(api, ns, "PipelineRun", run.name, REASON_STRANDED)
                if pod in str(e.get("message"))
            ]
            or None
        ),
        timeout=10,
        describe=lambda: "\n".join(
            f"{e.get('reason')}: {e.get('message')}" for e in api.list("Event", ns)
        ),
    )
    assert len(found) == 1, found
    return found[0]


def test_a_gated_pod_is_released_onto_its_placeholders_node_and_bound_there(
    e2e: E2E, namespace: Callable[..., str]
) -> None:
    e2e.require("scheduler", "controller-manager", "reconciler")
    api = e2e.api
    ns = namespace(mode="disabled")
    run = TektonRun(api, ns, unique("pr")).create()
    first = create(run, "build", None)
    # Stored as admitted: gated, no pod affinity, no pin yet.
    assert first["spec"]["schedulingGates"] == [{"name": GATE_PLACEHOLDER}]
    assert "podAffinity" not in (first["spec"].get("affinity") or {})
    placeholder = placeholder_bound(api, ns, run_placeholder(ns, run.name))
    here = node(placeholder)
    bound = wait_bound(api, ns, run.pod_name("build"), node=here)
    assert bound["metadata"]["uid"] == first["metadata"]["uid"]  # released, not recreated
    assert not bound["spec"].get("schedulingGates")
    assert pinned_to(bound) == here
    # The next pod, admitted once the placeholder is bound, is pinned at once.
    wait_bound(api, ns, create(run, "report", here)["metadata"]["name"], node=here)


@pytest.mark.usefixtures("restore_nodes")
def test_a_pod_pinned_to_a_cordoned_node_is_recreated_where_its_run_went(
    e2e: E2E, namespace: Callable[..., str]
) -> None:
    e2e.require("scheduler", "controller-manager", "reconciler")
    api = e2e.api
    ns = namespace(mode="disabled")
    run = TektonRun(api, ns, unique("pr")).create()
    build = create(run, "build", None)
    placeholder = run_placeholder(ns, run.name)
    first = placeholder_bound(api, ns, placeholder)
    old_node = node(first)
    wait_bound(api, ns, run.pod_name("build"), node=old_node)

    api.patch("Node", old_node, {"spec": {"unschedulable": True}})
    # Admitted pinned to the node the webhook still saw the placeholder on: it can never
    # be scheduled there, nor follow.
    stranded = create(run, "test", old_node)
    wait_gone(api, ns, stranded, f"pinned to cordoned {old_node}")
    moved = placeholder_bound(api, ns, placeholder, not_node=old_node)
    new_node = node(moved)
    event = recreated_event(api, ns, run, run.pod_name("test"))
    assert f"was pending on node {old_node}" in event["message"], event["message"]
    assert leader_metric(e2e, "coschedule_stranded_pods_deleted_total") >= 1

    # Tekton makes the TaskRun's pod again; the webhook pins it to the run's new node.
    create(run, "test", new_node)
    wait_bound(api, ns, run.pod_name("test"), node=new_node)
    # The started pod was never touched.
    still = api.must_get("Pod", run.pod_name("build"), ns)
    assert still["metadata"]["uid"] == build["metadata"]["uid"]
    assert node(still) == old_node
    assert not still["metadata"].get("deletionTimestamp")


@pytest.mark.usefixtures("pool")
def test_a_pinned_pod_that_does_not_fit_moves_its_run_and_is_recreated_there(
    e2e: E2E, namespace: Callable[..., str]
) -> None:
    """Stuck relocation with the new encoding: the pin is not a reason (the scheduler counts
    the other nodes as not matching node affinity); the node's CPU is. The placeholder
    moves; the pod pinned to the old node is deleted and made again pinned to the new."""
    e2e.require("scheduler", "controller-manager", "reconciler")
    api = e2e.api
    ns = namespace(mode="disabled")
    run = TektonRun(api, ns, unique("pr")).create()
    create(run, "build", None, in_pool(run.pod_manifest("build", fixture=NO_WORKSPACE)))
    placeholder = run_placeholder(ns, run.name)
    first = placeholder_bound(api, ns, placeholder)
    old_node = node(first)
    wait_bound(api, ns, run.pod_name("build"), node=old_node)
    pod_phase(api, run.pods["build"], "Succeeded")  # nothing of the run runs
    fill(api, ns, old_node, "cpu")

    manifest = in_pool(run.pod_manifest("test", fixture=NO_WORKSPACE), cpu="1")
    stranded = create(run, "test", old_node, manifest)
    _, message = unschedulable(api, ns, run.pod_name("test"), "Insufficient cpu")
    # The scheduler's count of the other nodes is the pin; the node's own reason is cpu.
    assert [r.cause for r in parse(message).pinned().blocking] == [Cause.RESOURCES], message

    moved = placeholder_bound(api, ns, placeholder, not_node=old_node, timeout=STUCK_GRACE + 20)
    new_node = node(moved)
    wait_gone(api, ns, stranded, f"pinned to {old_node}, which the run left")
    recreated_event(api, ns, run, run.pod_name("test"))
    assert events_on(api, ns, "PipelineRun", run.name, "RunRelocated")
    manifest = in_pool(run.pod_manifest("test", fixture=NO_WORKSPACE), cpu="1")
    create(run, "test", new_node, manifest)
    wait_bound(api, ns, run.pod_name("test"), node=new_node)
    assert node(api.must_get("Pod", placeholder_pod_name(placeholder), ns)) == new_node
