"""Stuck runs, planned: (observed group, facts, settings, now) -> actions. Pure: no API.

The group is a run whose next pod does not fit on its placeholder's node (worker-1); the
facts are what the controller's caches and reads would give. ``tests/reconcile/
test_stuck_runs.py`` carries the same plans out through the controller over HTTP.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from coschedule.config.settings import Settings
from coschedule.k8s.constants import REQUIRED
from coschedule.k8s.quantity import resources
from coschedule.marks import Mode
from coschedule.reconcile import relocation, shapes, stuck
from coschedule.reconcile.model import (
    ClearStuck,
    DeleteStrayPod,
    MarkStuck,
    Observed,
    OwnerRef,
    PlaceholderPod,
    Plan,
    RecordEvent,
    RelocatePlaceholder,
)
from coschedule.reconcile.placeholder import ANNOTATION_TEMPLATE_HASH, group_spec
from coschedule.reconcile.plan import drift
from coschedule.reconcile.stuck_runs import (
    MIN_STUCK_RECHECK_SECONDS,
    RECHECK_MARGIN,
    StuckFacts,
    Wanted,
    plan_stuck,
    step,
)
from tests.reconcile import test_stuck_runs
from tests.reconcile.pods import marked_pod, unschedulable
from tests.reconcile.test_plan import PIPELINERUN, RUNNING, existing_set, observed_for
from tests.reconcile.test_stuck import local_pv
from tests.reconcile.test_stuck_runs import CPU_MESSAGE

NOW = 1_800_000_000.0
GRACE = 2
SETTINGS = Settings(mode=Mode.PIPELINERUNS, stuck_grace_seconds=GRACE)
WAITING_MESSAGE = (
    "0/2 nodes are available: 2 node(s) didn't match pod affinity rules. preemption: "
    "0/2 nodes are available: 2 Preemption is not helpful for scheduling."
)
SLIM = stuck.with_scheduling(shapes.slim_marked_pod)
STUCK_POD = "pr-7f3k2-test-pod"
CLAIMS = ("pvc-1f1344866c", "pvc-f87b6a85f3")


def stuck_pod(since: float = NOW - 10, message: str = CPU_MESSAGE) -> dict[str, Any]:
    return test_stuck_runs.stuck_pod(since, message)


def node(name: str, cpu: str = "2", **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": spec,
        "status": {"allocatable": {"cpu": cpu, "memory": "8Gi", "pods": "110"}},
    }


NODES = {name: node(name) for name in ("worker-1", "worker-2")}


def group(
    *pods: dict[str, Any],
    on: str = "worker-1",
    annotations: dict[str, str] | None = None,
    deleting: bool = False,
) -> Observed:
    """The run's group with its StatefulSet and its placeholder pod bound to ``on``."""
    observed = observed_for(*pods, owner=RUNNING)
    sts = existing_set(observed, SETTINGS)
    if annotations:
        sts = replace(sts, annotations={**sts.annotations, **annotations})
    placeholder = PlaceholderPod(observed.namespace, f"{observed.name}-0", on, (), deleting)
    return replace(observed, statefulset=sts, placeholder_pods=(placeholder,))


def facts(
    observed: Observed,
    *pods: dict[str, Any],
    used: dict[str, str] | None = None,
    read: bool = True,
    placeholder: dict[str, Any] | None = None,
    **more: Any,
) -> StuckFacts:
    """The caches for ``observed`` and, with ``read``, every claim (unbound) and each node's
    bound requests read (``used``: cpu in use per node; worker-1 full by default)."""
    cpu = {"worker-1": "1500m", "worker-2": "0", **(used or {})}
    ppod = placeholder or {
        "metadata": {"name": f"{observed.name}-0", "namespace": observed.namespace},
        "spec": {"nodeName": observed.placeholder_pods[0].node_name},
    }
    found = StuckFacts(
        pods={p["metadata"]["name"]: SLIM(p) for p in pods},
        nodes=NODES,
        placeholder_pods={f"{observed.namespace}/{observed.name}-0": ppod},
    )
    if read:
        found = replace(
            found,
            claims=tuple(stuck.ClaimState(c, False, None) for c in CLAIMS),
            usage={name: resources({"cpu": value}) for name, value in cpu.items()},
        )
    return replace(found, **more)


def facts_wanted(
    observed: Observed, facts: StuckFacts, settings: Settings, now: float
) -> Wanted | None:
    """What ``step`` asks to read before it can plan; None when nothing more."""
    found = step(observed, facts, settings, now)
    return found if isinstance(found, Wanted) else None


def only(result: Plan, kind: type) -> list[Any]:
    return [a for a in result.actions if isinstance(a, kind)]


def involved(event: RecordEvent) -> str:
    return "StatefulSet" if event.involved is None else event.involved.kind


# ---- moving ----------------------------------------------------------------------------


def test_nothing_runs_so_the_placeholder_moves_where_the_pod_fits() -> None:
    pod = stuck_pod()
    observed = group(pod)
    result = plan_stuck(observed, facts(observed, pod), SETTINGS, NOW)
    [move] = only(result, RelocatePlaceholder)
    assert (move.from_node, move.to_node) == ("worker-1", "worker-2")
    assert move.pods == (f"{observed.name}-0",)
    assert move.reason == "insufficient-resources"
    assert move.pod == f"ci/{STUCK_POD}"
    assert "the pod requests 1 cpu and node worker-1 has 0.5 of 2 free" in move.why
    annotations = move.patch["metadata"]["annotations"]
    state = relocation.parse(annotations)
    assert state is not None
    assert (state.left, state.target, state.at) == (("worker-1",), "worker-2", NOW)
    assert move.patch["metadata"]["resourceVersion"] == "42"
    affinity = move.patch["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
    [term] = affinity[REQUIRED]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [
        {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["worker-1"]}
    ]
    events = only(result, RecordEvent)
    assert [(e.reason, involved(e)) for e in events] == [
        ("PlaceholderRelocated", "StatefulSet"),
        ("RunRelocated", "Pod"),
        ("RunRelocated", "PipelineRun"),
    ]
    assert events[1].involved == OwnerRef("v1", "Pod", STUCK_POD, f"uid-{STUCK_POD}")
    assert events[2].involved == PIPELINERUN
    assert "from node worker-1 towards node worker-2" in events[0].message
    assert len({e.message for e in events}) == 1
    assert result.requeue is None


def test_the_move_and_drift_keep_one_template_rule() -> None:
    """After the move the StatefulSet carries what drift itself wants: no drift to undo."""
    pod = stuck_pod()
    observed = group(pod)
    [move] = only(plan_stuck(observed, facts(observed, pod), SETTINGS, NOW), RelocatePlaceholder)
    sts = observed.statefulset
    assert sts is not None
    moved = replace(sts, annotations={**sts.annotations, **move.patch["metadata"]["annotations"]})
    assert moved.annotations[ANNOTATION_TEMPLATE_HASH] != sts.annotations[ANNOTATION_TEMPLATE_HASH]
    spec = group_spec(observed.namespace, observed.name, observed.pods)
    assert drift(moved, spec, SETTINGS, observed.owner) is None
    # And drift of the old StatefulSet with the new relocations writes the same template.
    steered = replace(
        sts,
        annotations={
            **sts.annotations,
            relocation.ANNOTATION_RELOCATIONS: moved.annotations[relocation.ANNOTATION_RELOCATIONS],
        },
    )
    patch = drift(steered, spec, SETTINGS, observed.owner)
    assert patch is not None
    assert patch.patch["spec"]["template"] == move.patch["spec"]["template"]


def test_the_moved_placeholder_keeps_the_claims_of_pods_deleted_meanwhile() -> None:
    """A claim an earlier pod mounted (that pod deleted since): the placeholder remade
    elsewhere still mounts it, so the run's data moves with the run."""
    pod = stuck_pod()
    observed = replace(group(pod), claims_kept=("pvc-earlier",))
    [move] = only(plan_stuck(observed, facts(observed, pod), SETTINGS, NOW), RelocatePlaceholder)
    volumes = move.patch["spec"]["template"]["spec"]["volumes"]
    claims = sorted([*CLAIMS, "pvc-earlier"])
    assert [v["persistentVolumeClaim"]["claimName"] for v in volumes] == claims
    assert move.patch["metadata"]["annotations"]["coschedule.dev/claims"] == ",".join(claims)


def test_a_group_that_was_stuck_is_forgotten_when_it_moves() -> None:
    pod = stuck_pod()
    observed = group(pod)
    result = plan_stuck(
        observed, facts(observed, pod, explained=("x",), was_stuck=True), SETTINGS, NOW
    )
    assert only(result, ClearStuck) == [ClearStuck("ci", observed.name, True, None)]
    assert result.actions.index(only(result, ClearStuck)[0]) == 1  # after the move itself


# ---- what is read ----------------------------------------------------------------------


def test_claims_and_the_node_are_read_first_then_candidates_only_if_a_move_may_follow() -> None:
    pod = stuck_pod()
    observed = group(pod)
    unread = facts(observed, pod, read=False)
    assert facts_wanted(observed, unread, SETTINGS, NOW) == Wanted(CLAIMS, ("worker-1",))
    with pytest.raises(ValueError, match="not read"):
        plan_stuck(observed, unread, SETTINGS, NOW)
    partly = replace(
        unread,
        claims=tuple(stuck.ClaimState(c, False, None) for c in CLAIMS),
        usage={"worker-1": resources({"cpu": "1500m"})},
    )
    assert facts_wanted(observed, partly, SETTINGS, NOW) == Wanted(None, ("worker-2",))
    # A running task forbids any move: no other node's pods are listed.
    running = marked_pod("tekton-taskrun", node="worker-1")
    blocked = group(running, pod)
    assert facts_wanted(blocked, facts(blocked, running, pod, read=False), SETTINGS, NOW) == (
        Wanted(CLAIMS, ("worker-1",))
    )
    blocked_facts = replace(facts(blocked, running, pod, read=False), claims=partly.claims)
    blocked_facts = replace(blocked_facts, usage=partly.usage)
    assert facts_wanted(blocked, blocked_facts, SETTINGS, NOW) is None


def test_a_group_with_nothing_stuck_reads_nothing() -> None:
    pod = marked_pod("tekton-taskrun", node="worker-1")
    observed = group(pod)
    assert facts_wanted(observed, facts(observed, pod, read=False), SETTINGS, NOW) is None
    assert plan_stuck(observed, facts(observed, pod, read=False), SETTINGS, NOW) == Plan()


# ---- explaining ------------------------------------------------------------------------


def test_a_running_task_forbids_the_move_and_the_stuck_pod_is_explained_once() -> None:
    running = marked_pod("tekton-taskrun", node="worker-1")
    pod = stuck_pod()
    observed = group(running, pod)
    result = plan_stuck(observed, facts(observed, running, pod), SETTINGS, NOW)
    assert not only(result, RelocatePlaceholder)
    [mark] = only(result, MarkStuck)
    assert mark.explained is not None
    assert (mark.pod, mark.node, mark.reason) == (
        f"ci/{STUCK_POD}",
        "worker-1",
        "insufficient-resources",
    )
    text = mark.text
    assert "the pod requests 1 cpu and node worker-1 has 0.5 of 2 free" in text, text
    assert running["metadata"]["name"] in text
    assert "free cpu on node worker-1" in text
    events = only(result, RecordEvent)
    # One Event for one stuck run, on the run (not a copy on the pod at the same instant).
    assert [(e.reason, e.type, involved(e), e.message) for e in events] == [
        ("RunStuck", "Warning", "PipelineRun", text),
    ]
    assert result.requeue is not None
    assert result.requeue.after == MIN_STUCK_RECHECK_SECONDS
    # The same facts again: still stuck, nothing said twice; looked at again all the same.
    again = plan_stuck(
        observed,
        facts(observed, running, pod, explained=mark.explained, was_stuck=True),
        SETTINGS,
        NOW + 1,
    )
    assert again.actions == (MarkStuck("ci", observed.name),)
    assert again.requeue == result.requeue


def test_a_group_no_run_object_owns_is_told_on_its_stuck_pod() -> None:
    """A group with no owning run (a pod grouped by coschedule.dev/group alone): the one
    RunStuck Event goes on the stuck pod, the only object there is to describe."""
    running = marked_pod("tekton-taskrun", node="worker-1")
    pod = stuck_pod()
    observed = replace(group(running, pod), owner=None)
    result = plan_stuck(observed, facts(observed, running, pod), SETTINGS, NOW)
    [mark] = only(result, MarkStuck)
    [event] = only(result, RecordEvent)
    assert (event.reason, involved(event), event.message) == ("RunStuck", "Pod", mark.text)
    assert event.involved is not None
    assert event.involved.name == STUCK_POD


def test_a_node_local_volume_pins_the_run_it_is_explained_never_moved() -> None:
    pod = stuck_pod()
    observed = group(pod)
    local = stuck.ClaimState("pvc-1f1344866c", True, local_pv("local-pv-1", "worker-1"))
    pinned = replace(
        facts(observed, pod),
        claims=(local, stuck.ClaimState("pvc-f87b6a85f3", False, None)),
        usage={"worker-1": resources({"cpu": "1500m"})},
    )
    # Nowhere to go: the candidates' pods are never listed.
    assert facts_wanted(observed, pinned, SETTINGS, NOW) is None
    result = plan_stuck(observed, pinned, SETTINGS, NOW)
    assert not only(result, RelocatePlaceholder)
    [mark] = only(result, MarkStuck)
    assert "claim pvc-1f1344866c (volume local-pv-1, usable on node worker-1)" in mark.text
    assert "volumeClaimTemplates" in mark.text


def test_no_room_elsewhere_is_explained_with_each_nodes_reason() -> None:
    pod = stuck_pod()
    observed = group(pod)
    result = plan_stuck(observed, facts(observed, pod, used={"worker-2": "1900m"}), SETTINGS, NOW)
    [mark] = only(result, MarkStuck)
    assert "no other node can take the pod" in mark.text
    assert "worker-2: not enough cpu (0.1 free, 1.001 needed)" in mark.text
    assert "add capacity" in mark.text


# ---- not (yet) stuck -----------------------------------------------------------------


def test_within_the_grace_nothing_happens_and_the_look_is_set_for_its_end() -> None:
    pod = stuck_pod(since=NOW - 1)  # the condition's time has whole seconds
    observed = group(pod)
    result = plan_stuck(observed, facts(observed, pod, read=False), SETTINGS, NOW)
    assert result.actions == ()
    assert result.requeue is not None
    assert result.requeue.after == pytest.approx(GRACE - 1 + RECHECK_MARGIN)


def test_a_pod_waiting_for_its_placeholder_is_left_alone() -> None:
    pod = stuck_pod(since=NOW - 60, message=WAITING_MESSAGE)
    observed = group(pod)
    assert plan_stuck(observed, facts(observed, pod, read=False), SETTINGS, NOW) == Plan()


def test_a_stuck_group_whose_pod_got_placed_is_cleared_and_forgotten() -> None:
    pod = marked_pod("tekton-taskrun", node="worker-1")
    observed = group(pod)
    result = plan_stuck(
        observed, facts(observed, pod, explained=("x",), was_stuck=True), SETTINGS, NOW
    )
    assert result.actions == (ClearStuck("ci", observed.name, True, "no pod of the run is stuck"),)


def test_just_moved_gives_the_scheduler_the_grace() -> None:
    pod = stuck_pod()
    state = relocation.first("kubernetes.io/hostname", "worker-1", "worker-2", NOW - 0.5)
    observed = group(
        pod, on="worker-2", annotations={relocation.ANNOTATION_RELOCATIONS: state.encode()}
    )
    result = plan_stuck(observed, facts(observed, pod, read=False), SETTINGS, NOW)
    assert result.actions == ()
    assert result.requeue is not None
    assert result.requeue.after == pytest.approx(GRACE - 0.5 + RECHECK_MARGIN)


def test_a_placeholder_pod_back_in_a_domain_it_left_is_deleted_again() -> None:
    pod = stuck_pod()
    state = relocation.first("kubernetes.io/hostname", "worker-1", "worker-2", NOW - 0.5)
    observed = group(pod, annotations={relocation.ANNOTATION_RELOCATIONS: state.encode()})
    result = plan_stuck(observed, facts(observed, pod, read=False), SETTINGS, NOW)
    assert result.actions == (
        DeleteStrayPod("ci", f"{observed.name}-0", observed.name, "worker-1"),
    )


def test_a_group_without_a_live_pod_or_statefulset_forgets_only_what_it_remembered() -> None:
    pod = stuck_pod()
    observed = replace(group(pod), statefulset=None)
    assert plan_stuck(observed, facts(observed, pod, read=False), SETTINGS, NOW) == Plan()
    remembered = facts(observed, pod, read=False, explained=("x",))
    assert plan_stuck(observed, remembered, SETTINGS, NOW).actions == (
        ClearStuck("ci", observed.name, True, None),
    )


# ---- the placeholder itself ----------------------------------------------------------


PLACEHOLDER_MESSAGE = (
    "0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, 2 Too "
    "many pods. preemption: 0/3 nodes are available: 3 Preemption is not helpful for "
    "scheduling."
)


def pending_placeholder(observed: Observed, since: float) -> dict[str, Any]:
    return stuck.with_condition(shapes.slim_placeholder_pod)(
        {
            "metadata": {"name": f"{observed.name}-0", "namespace": "ci"},
            "spec": {},
            "status": {"conditions": [unschedulable(PLACEHOLDER_MESSAGE, since)]},
        }
    )


def test_a_placeholder_the_scheduler_cannot_place_is_explained_once() -> None:
    pod = marked_pod("tekton-taskrun")
    observed = group(pod, on="")
    cached = facts(observed, pod, read=False, placeholder=pending_placeholder(observed, NOW - 10))
    result = plan_stuck(observed, cached, SETTINGS, NOW)
    [mark] = only(result, MarkStuck)
    assert mark.explained is not None
    assert f"pod {observed.name}-0" in mark.text
    assert "2 Too many pods" in mark.text
    events = only(result, RecordEvent)
    assert [(e.reason, e.type, involved(e)) for e in events] == [
        ("PlaceholderUnschedulable", "Warning", "StatefulSet"),
        ("PlaceholderUnschedulable", "Warning", "PipelineRun"),
    ]
    assert result.requeue is not None
    assert result.requeue.after == MIN_STUCK_RECHECK_SECONDS
    again = plan_stuck(
        observed, replace(cached, explained=mark.explained, was_stuck=True), SETTINGS, NOW
    )
    assert again.actions == (MarkStuck("ci", observed.name),)
    # Within its grace: not stuck (any earlier count cleared), looked at when it ends.
    young = facts(
        observed,
        pod,
        read=False,
        placeholder=pending_placeholder(observed, NOW - 1),
        was_stuck=True,
    )
    early = plan_stuck(observed, young, SETTINGS, NOW)
    assert early.actions == (ClearStuck("ci", observed.name, False, None),)
    assert early.requeue is not None
    assert early.requeue.after == pytest.approx(GRACE - 1 + RECHECK_MARGIN)
