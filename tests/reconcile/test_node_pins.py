"""Pods placed by node name, planned: (observed group, earlier actions) -> release / delete.
Pure: no API. ``test_node_pins_api.py`` carries the same plans out over HTTP.

The group is the run pr-7f3k2 (tekton-taskrun pods, owned by TaskRuns, which Tekton
recreates) with its StatefulSet and placeholder pod; its pods as the webhook leaves them
with ``placement: auto`` (``pods.by_node_name``)."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import pytest

from coschedule.config.settings import Settings
from coschedule.k8s.constants import HOSTNAME
from coschedule.k8s.nodeaffinity import pod_allows, required_terms
from coschedule.marks import ANNOTATION_PINNED_NODE, GATE_PLACEHOLDER, Mode, Placement
from coschedule.mutate.decision import AdmissionContext, decide
from coschedule.reconcile import relocation
from coschedule.reconcile.model import (
    DeletePlaceholderPod,
    DeleteStrandedPod,
    DeleteStrayPod,
    MarkStuck,
    Observed,
    PatchStatefulSet,
    PlaceholderPod,
    RecordEvent,
    ReleasePod,
    RelocatePlaceholder,
)
from coschedule.reconcile.node_pins import REASON_STRANDED, plan_pins, stranded_first
from coschedule.reconcile.plan import plan
from coschedule.reconcile.stuck_runs import plan_stuck
from coschedule.wire.jsonpatch import apply
from tests.fixtures import load_pod
from tests.reconcile import test_stuck_plan as stuck_plan
from tests.reconcile.pods import by_node_name, condition, marked_pod
from tests.reconcile.test_plan import PIPELINERUN, RUNNING, existing_set, observed_for

NODES = ("worker-1", "worker-2", "worker-3")
NOW = stuck_plan.NOW


def pending(name: str = "pr-7f3k2-build-pod", **kwargs: Any) -> dict[str, Any]:
    return marked_pod("tekton-taskrun", name=name, phase="Pending", **kwargs)


def gated(name: str = "pr-7f3k2-build-pod") -> dict[str, Any]:
    return by_node_name(pending(name))


def pinned(to: str, name: str = "pr-7f3k2-build-pod", **kwargs: Any) -> dict[str, Any]:
    return by_node_name(pending(name, **kwargs), to)


def group(
    *pods: dict[str, Any],
    on: str | None = "worker-2",
    deleting: tuple[str, ...] = (),
    left: tuple[str, ...] = (),
) -> Observed:
    """The run's group: its placeholder pod bound ``on`` a node (None: not bound yet), the
    placeholder pods being deleted on ``deleting``, the nodes a relocation ``left``."""
    observed = observed_for(*pods, owner=RUNNING)
    sts = existing_set(observed_for(pending("pr-7f3k2-first-pod"), owner=RUNNING))
    if left:
        state = relocation.Relocations(HOSTNAME, left, on or "", 1.0)
        sts = replace(
            sts, annotations={**sts.annotations, relocation.ANNOTATION_RELOCATIONS: state.encode()}
        )
    ppods = [
        PlaceholderPod(observed.namespace, f"{observed.name}-0", node, (), True)
        for node in deleting
    ]
    ppods.append(PlaceholderPod(observed.namespace, f"{observed.name}-0", on or "", (), False))
    return replace(observed, statefulset=sts, placeholder_pods=tuple(ppods))


def allowed(pod: dict[str, Any]) -> set[str]:
    spec = pod["spec"]
    terms = required_terms(spec.get("affinity"))
    return {n for n in NODES if pod_allows(spec.get("nodeSelector") or {}, terms, {}, n)}


class Bound:
    """The webhook's view of placeholder pods: every placeholder bound to ``node``."""

    def __init__(self, node: str | None) -> None:
        self.bound = node

    def node(self, namespace: str, placeholder: str) -> str | None:
        return self.bound


@pytest.mark.parametrize("node", [None, "worker-2"])
def test_the_pods_here_are_what_the_webhook_admits_with_placement_auto(node: str | None) -> None:
    """``by_node_name`` (pinned to ``node``, gated with None) is the webhook's own output."""
    settings = Settings(mode=Mode.PIPELINERUNS, placement=Placement.AUTO)
    pod = load_pod("tekton-taskrun")
    decision = decide(pod, AdmissionContext(settings, "ci", placeholders=Bound(node)))
    admitted = apply(pod, decision.ops)
    ours = by_node_name(pending(), node)
    for part in ("affinity", "schedulingGates"):
        assert ours["spec"].get(part) == admitted["spec"].get(part), part
    assert ours["metadata"]["annotations"] == admitted["metadata"]["annotations"]


# ---- release ----------------------------------------------------------------------------


def test_a_gated_pod_is_pinned_to_its_placeholders_node_and_released_in_one_patch() -> None:
    pod = gated()
    result = plan_pins(group(pod, on="worker-2"))
    [release] = result.actions
    assert isinstance(release, ReleasePod)
    assert (release.namespace, release.name, release.node) == (
        "ci",
        "pr-7f3k2-build-pod",
        "worker-2",
    )
    # The patch, applied to the pod as stored: pinned there, recorded, gate lifted; the
    # gate's removal is guarded by a test of the gate.
    ops = list(release.ops)
    assert ops[-2]["op"] == "test"
    assert ops[-2]["value"] == {"name": GATE_PLACEHOLDER}
    released = apply(pod, ops)
    assert allowed(released) == {"worker-2"}
    assert released["spec"]["schedulingGates"] == []
    assert released["metadata"]["annotations"][ANNOTATION_PINNED_NODE] == "worker-2"
    # Its other marks and containers are untouched.
    for key in ("containers", "volumes", "tolerations"):
        assert released["spec"].get(key) == pod["spec"].get(key)


def test_a_runs_gated_pods_are_released_oldest_first() -> None:
    """The release stage ranks a pass's releases in the order planned: the run's first
    task's pod first, whatever the names sort as."""
    made = {
        "pr-7f3k2-a-lint-pod": "2026-11-21T06:00:09Z",
        "pr-7f3k2-b-build-pod": "2026-11-21T06:00:01Z",
        "pr-7f3k2-c-test-pod": "2026-11-21T06:00:05Z",
    }
    pods = [by_node_name(pending(name, created=at)) for name, at in made.items()]
    result = plan_pins(group(*pods, on="worker-2"))
    assert [a.name for a in result.actions if isinstance(a, ReleasePod)] == [
        "pr-7f3k2-b-build-pod",
        "pr-7f3k2-c-test-pod",
        "pr-7f3k2-a-lint-pod",
    ]


def test_a_gated_pod_keeps_the_users_node_affinity_and_other_gates() -> None:
    pod = gated()
    ssd = {"key": "disk", "operator": "In", "values": ["ssd"]}
    pod["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [ssd]}]
            }
        }
    }
    pod["spec"]["schedulingGates"].insert(0, {"name": "example.com/quota"})
    [release] = plan_pins(group(pod, on="worker-2")).actions
    assert isinstance(release, ReleasePod)
    released = apply(pod, list(release.ops))
    assert released["spec"]["schedulingGates"] == [{"name": "example.com/quota"}]
    [term] = required_terms(released["spec"]["affinity"]) or []
    assert term["matchExpressions"] == [ssd]
    assert term["matchFields"] == [
        {"key": "metadata.name", "operator": "In", "values": ["worker-2"]}
    ]


@pytest.mark.parametrize(
    ("observed", "why"),
    [
        (group(gated(), on=None), "the placeholder pod is not bound yet"),
        (group(gated(), on=None, deleting=("worker-1",)), "the placeholder pod is moving"),
        (
            replace(group(gated()), placeholder_pods=()),
            "no placeholder pod (the StatefulSet has not made it yet)",
        ),
    ],
)
def test_a_gated_pod_waits_while_its_placeholder_is_not_bound(observed: Observed, why: str) -> None:
    assert plan_pins(observed).actions == (), why


def test_a_gated_pod_is_not_released_onto_a_node_the_placeholder_is_leaving() -> None:
    observed = group(gated(), on="worker-2")
    ppod = f"{observed.name}-0"
    event = RecordEvent("ci", observed.name, "PlaceholderMoved", "cordoned")
    for earlier in (
        DeletePlaceholderPod("ci", ppod, observed.name, "worker-2", "cordoned", "", event),
        DeleteStrayPod("ci", ppod, observed.name, "worker-2"),
        RelocatePlaceholder("ci", observed.name, {}, (ppod,), "x", "worker-2", "w3", "p", ""),
    ):
        assert plan_pins(observed, (earlier,)).actions == (), earlier


def test_a_gated_pod_pinned_to_another_node_is_made_again_not_patched() -> None:
    """kube-apiserver lets a gated pod's node affinity grow, never change (422): a pod
    gated while pinned to worker-1 cannot be moved to worker-2 by a patch."""
    pod = by_node_name(pinned("worker-1"))  # pinned, then gated again
    [delete] = plan_pins(group(pod, on="worker-2")).actions
    assert isinstance(delete, DeleteStrandedPod)
    assert delete.node == "worker-1"
    # Pinned where the placeholder is: released as any gated pod.
    [release] = plan_pins(group(pod, on="worker-1")).actions
    assert isinstance(release, ReleasePod)
    assert [op["op"] for op in release.ops] == ["test", "remove"]


def test_a_gated_pod_that_is_finished_or_deleted_is_left_alone() -> None:
    deleted = gated()
    deleted["metadata"]["deletionTimestamp"] = "2026-11-21T06:01:00Z"
    failed = gated()
    failed["status"]["phase"] = "Failed"
    assert plan_pins(group(deleted)).actions == ()
    assert plan_pins(group(failed)).actions == ()


# ---- stranded ---------------------------------------------------------------------------


def test_a_pending_pod_pinned_to_a_node_its_run_left_is_deleted_for_tekton_to_recreate() -> None:
    pod = pinned("worker-1")
    result = plan_pins(group(pod, on="worker-2"))
    [delete] = result.actions
    assert isinstance(delete, DeleteStrandedPod)
    meta = pod["metadata"]
    # Conditional on the very pod seen: uid and resourceVersion.
    assert (delete.name, delete.uid, delete.resource_version, delete.node) == (
        meta["name"],
        meta["uid"],
        meta["resourceVersion"],
        "worker-1",
    )
    # One Event, on the run.
    assert delete.event.involved == PIPELINERUN
    assert delete.event.reason == REASON_STRANDED
    assert delete.event.message == (
        "pod pr-7f3k2-build-pod was pending on node worker-1, which its run left for node "
        "worker-2; deleted for its TaskRun pr-7f3k2-build to recreate it there"
    )


@pytest.mark.parametrize(
    ("observed", "expected"),
    [
        # Bound meanwhile (started, or about to): never deleted.
        (group(pinned("worker-1", node="worker-1"), on="worker-2"), False),
        # On its run's node: nothing to do.
        (group(pinned("worker-2"), on="worker-2"), False),
        # The placeholder pod is being deleted off the pod's node: the run is leaving it.
        (group(pinned("worker-1"), on=None, deleting=("worker-1",)), True),
        # A relocation left the pod's node; the new placeholder pod is not bound yet.
        (group(pinned("worker-1"), on=None, left=("worker-1",)), True),
        # The placeholder pod is (re)created and not bound, and nothing says it leaves the
        # pod's node: it may well come back there; wait.
        (group(pinned("worker-1"), on=None), False),
        # Left another node, not this pod's.
        (group(pinned("worker-1"), on=None, left=("worker-3",)), False),
    ],
)
def test_which_pinned_pods_are_stranded(observed: Observed, expected: bool) -> None:
    actions = plan_pins(observed).actions
    assert [type(a) for a in actions] == ([DeleteStrandedPod] if expected else [])


def test_a_pod_pinned_where_the_placeholder_is_evicted_now_is_stranded() -> None:
    observed = group(pinned("worker-2"), on="worker-2")
    event = RecordEvent("ci", observed.name, "PlaceholderMoved", "cordoned")
    evict = DeletePlaceholderPod(
        "ci", f"{observed.name}-0", observed.name, "worker-2", "cordoned", "", event
    )
    [delete] = plan_pins(observed, (evict,)).actions
    assert isinstance(delete, DeleteStrandedPod)
    # The run's next node is not known yet: the Event names none, nor a "there".
    assert delete.event.message == (
        "pod pr-7f3k2-build-pod was pending on node worker-2, which its run is leaving; "
        "deleted for its TaskRun pr-7f3k2-build to recreate it, pinned to the node the run's "
        "placeholder is bound to next (held behind the coschedule.dev/placeholder scheduling "
        "gate until it is)"
    )


def test_only_pods_whose_engine_recreates_them_are_deleted() -> None:
    pod = pinned("worker-1")
    for owner in (
        {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "name": "wf", "uid": "w"},
        {"apiVersion": "batch/v1", "kind": "Job", "name": "job", "uid": "j"},
    ):
        other = copy.deepcopy(pod)
        other["metadata"]["ownerReferences"] = [{**owner, "controller": True}]
        assert plan_pins(group(other, on="worker-2")).actions == (), owner["kind"]
    # A TaskRun that owns the pod without being its controller does not recreate it.
    bare = copy.deepcopy(pod)
    bare["metadata"]["ownerReferences"][0]["controller"] = False
    assert plan_pins(group(bare, on="worker-2")).actions == ()


def test_pods_tied_by_pod_affinity_and_terminating_pods_are_never_deleted() -> None:
    affinity = pending()  # today's encoding: no pin, no gate
    terminating = pinned("worker-1")
    terminating["metadata"]["deletionTimestamp"] = "2026-11-21T06:01:00Z"
    succeeded = pinned("worker-1")
    succeeded["status"]["phase"] = "Succeeded"
    for pod in (affinity, terminating, succeeded):
        assert plan_pins(group(pod, on="worker-2")).actions == ()


def test_one_look_releases_the_gated_and_deletes_the_stranded() -> None:
    stranded = pinned("worker-1", name="pr-7f3k2-a-pod")
    waiting = gated("pr-7f3k2-b-pod")
    here = pinned("worker-2", name="pr-7f3k2-c-pod")
    actions = plan_pins(group(stranded, waiting, here, on="worker-2")).actions
    assert [(type(a).__name__, getattr(a, "name", "")) for a in actions] == [
        ("DeleteStrandedPod", "pr-7f3k2-a-pod"),
        ("ReleasePod", "pr-7f3k2-b-pod"),
    ]


# ---- stuck runs with pods placed by node name ---------------------------------------------
# The stuck-run planner's group (tests/reconcile/test_stuck_plan.py): placeholder on
# worker-1 (full: 0.5 of 2 cpu free), worker-2 empty; the next task asks 1 cpu.

# kube-scheduler 1.36's words (seen on the e2e control plane).
PIN_CPU_MESSAGE = (
    "0/2 nodes are available: 1 Insufficient cpu, 1 node(s) didn't satisfy plugin(s) "
    "[NodeAffinity]. no new claims to deallocate, preemption: 0/2 nodes are available: 1 No "
    "preemption victims found for incoming pod, 1 Preemption is not helpful for scheduling."
)


def test_a_pinned_pod_that_does_not_fit_its_runs_node_moves_the_run_then_is_recreated() -> None:
    pod = by_node_name(stuck_plan.stuck_pod(message=PIN_CPU_MESSAGE), "worker-1")
    observed = stuck_plan.group(pod)
    result = plan_stuck(observed, stuck_plan.facts(observed, pod), stuck_plan.SETTINGS, NOW)
    [move] = [a for a in result.actions if isinstance(a, RelocatePlaceholder)]
    # As for a pod tied by pod affinity: the pin is not a reason, and it does not keep the
    # pod off the other nodes (the pod is recreated pinned where the run goes).
    assert (move.from_node, move.to_node, move.reason) == (
        "worker-1",
        "worker-2",
        "insufficient-resources",
    )
    assert "the pod requests 1 cpu and node worker-1 has 0.5 of 2 free" in move.why
    # The move deletes the placeholder pod on worker-1: the pod pinned there is stranded.
    [delete] = plan_pins(observed, result.actions).actions
    assert isinstance(delete, DeleteStrandedPod)
    assert delete.name == stuck_plan.STUCK_POD
    # ... and deleted before the placeholder pod frees its room on worker-1, where the
    # scheduler would otherwise bind it (found by the e2e suite with a node full of pods).
    both = stranded_first(result, plan_pins(observed, result.actions))
    kinds = [type(a) for a in both.actions]
    assert kinds.index(DeleteStrandedPod) < kinds.index(RelocatePlaceholder)
    assert sorted(map(repr, both.actions)) == sorted(map(repr, (*result.actions, delete))), (
        "nothing planned is lost or added"
    )
    assert both.requeue == result.then(plan_pins(observed, result.actions)).requeue

    # Next look: the placeholder is on worker-2. The pod pinned to worker-1 is not stuck
    # (no second move, no Warning); it is deleted for Tekton to recreate it on worker-2.
    state = relocation.parse(move.patch["metadata"]["annotations"])
    assert state is not None
    moved = stuck_plan.group(
        pod,
        on="worker-2",
        annotations={relocation.ANNOTATION_RELOCATIONS: state.encode()},
    )
    later = NOW + 60
    after = plan_stuck(moved, stuck_plan.facts(moved, pod), stuck_plan.SETTINGS, later)
    assert not [a for a in after.actions if isinstance(a, RelocatePlaceholder | MarkStuck)]
    [delete] = plan_pins(moved, after.actions).actions
    assert isinstance(delete, DeleteStrandedPod)
    assert "left for node worker-2" in delete.event.message


def test_a_gated_pod_is_not_stuck_however_long_it_waits() -> None:
    pod = by_node_name(stuck_plan.stuck_pod())
    pod["status"]["conditions"] = [
        condition("SchedulingGated", "Scheduling is blocked due to non-empty scheduling gates", 0)
    ]
    observed = stuck_plan.group(pod)
    facts = stuck_plan.facts(observed, pod, read=False)
    assert stuck_plan.facts_wanted(observed, facts, stuck_plan.SETTINGS, NOW) is None
    result = plan_stuck(observed, facts, stuck_plan.SETTINGS, NOW)
    assert not [a for a in result.actions if isinstance(a, RelocatePlaceholder | MarkStuck)]
    # It is released instead.
    [release] = plan_pins(observed, result.actions).actions
    assert isinstance(release, ReleasePod)
    assert release.node == "worker-1"


def test_a_pinned_pod_whose_own_rules_exclude_its_runs_node_is_explained_not_ignored() -> None:
    """The pin is taken out of the pod's rules, the user's are not: a nodeSelector that
    excludes the run's node is the reason given, as for a pod tied by pod affinity."""
    message = (
        "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector. "
        "preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling."
    )
    running = marked_pod("tekton-taskrun", node="worker-1")  # forbids a move: explained
    pod = stuck_plan.stuck_pod(message=message)
    pod["spec"]["nodeSelector"] = {"disk": "ssd"}
    pod = by_node_name(pod, "worker-1")
    observed = stuck_plan.group(running, pod)
    result = plan_stuck(
        observed,
        stuck_plan.facts(observed, running, pod, used={"worker-1": "0"}),
        stuck_plan.SETTINGS,
        NOW,
    )
    [mark] = [a for a in result.actions if isinstance(a, MarkStuck)]
    assert mark.reason == "node-affinity"
    assert "the pod's nodeSelector / node affinity excludes node worker-1" in mark.text


def test_a_release_comes_before_the_placeholders_drift_patch() -> None:
    # The placeholder was made before the first pod (from its run: no claim); the first
    # pod, gated, mounts the run's workspace claim: the template drifts. Its patch is
    # conditional and may meet a 409 that ends the pass: the release goes first.
    first = gated()
    observed = group(first, on="worker-2")
    assert observed.statefulset is not None
    drifted = replace(
        observed.statefulset,
        annotations={**observed.statefulset.annotations, "coschedule.dev/template-hash": "old"},
    )
    observed = replace(observed, statefulset=drifted)
    result = plan(observed, Settings(mode=Mode.PIPELINERUNS), NOW)
    assert any(isinstance(a, PatchStatefulSet) for a in result.actions)
    both = stranded_first(result, plan_pins(observed, result.actions))
    kinds = [type(a) for a in both.actions]
    assert kinds.index(ReleasePod) < kinds.index(PatchStatefulSet)
    assert sorted(map(repr, both.actions)) == sorted(
        map(repr, (*result.actions, *plan_pins(observed, result.actions).actions))
    )
