"""Stuck runs, the pure decisions: stuck? why? safe? where to? and what to say.

Pods are the realistic fixtures through the real admission path (``tests.reconcile.pods``)
with the PodScheduled condition kube-scheduler 1.36 writes; nodes are shaped as the API
returns them.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from coschedule.k8s.nodes import Node, parse_node
from coschedule.k8s.quantity import resources
from coschedule.k8s.scheduler_messages import Cause
from coschedule.k8s.volumes import volume_topology
from coschedule.reconcile import shapes, stuck
from tests.reconcile.pods import marked_pod, unschedulable

MESSAGES = {
    c["name"]: c["message"]
    for c in json.loads(
        (
            Path(__file__).resolve().parents[1]
            / "fixtures"
            / "scheduler"
            / "unschedulable-messages.json"
        ).read_text()
    )["cases"]
}
T0 = datetime(2026, 11, 21, 6, 0, 0, tzinfo=UTC).timestamp()
SLIM = stuck.with_scheduling(shapes.slim_marked_pod)


def pending(
    message: str,
    *,
    since: float = T0,
    cpu: str | None = None,
    node_selector: dict[str, str] | None = None,
    fixture: str = "tekton-taskrun",
    name: str | None = None,
) -> stuck.PendingPod:
    pod = marked_pod(fixture, name=name, phase="Pending")
    if cpu is not None:
        for container in pod["spec"]["containers"]:
            container.setdefault("resources", {})["requests"] = {"cpu": "0"}
        pod["spec"]["containers"][0]["resources"]["requests"] = {"cpu": cpu}
    if node_selector is not None:
        pod["spec"]["nodeSelector"] = node_selector
    pod["status"]["conditions"] = [unschedulable(message, since)]
    found = stuck.pending_pod(SLIM(pod), ("data",))
    assert found is not None
    return found


def node(
    name: str,
    *,
    zone: str = "zone-a",
    cpu: str = "2",
    pods: str = "110",
    taints: list[dict[str, str]] | None = None,
    unschedulable: bool = False,
    arch: str = "amd64",
) -> Node:
    return parse_node(
        {
            "metadata": {
                "name": name,
                "labels": {
                    "kubernetes.io/hostname": name,
                    "topology.kubernetes.io/zone": zone,
                    "kubernetes.io/arch": arch,
                },
            },
            "spec": {"taints": taints or [], "unschedulable": unschedulable},
            "status": {"allocatable": {"cpu": cpu, "memory": "8Gi", "pods": pods}},
        }
    )


def usage(**values: str) -> dict[str, Decimal]:
    return resources(values)


def pinned_pv(name: str, key: str, value: str) -> Any:
    """A volume usable only on nodes labelled ``key`` = ``value``."""
    expression = {"key": key, "operator": "In", "values": [value]}
    return volume_topology(
        {
            "metadata": {"name": name},
            "spec": {
                "nodeAffinity": {
                    "required": {"nodeSelectorTerms": [{"matchExpressions": [expression]}]}
                }
            },
        }
    )


def local_pv(name: str, host: str) -> Any:
    return pinned_pv(name, "kubernetes.io/hostname", host)


def zonal_pv(name: str, zone: str) -> Any:
    return pinned_pv(name, "topology.kubernetes.io/zone", zone)


# ---- stuck? ----------------------------------------------------------------------------


def test_a_pod_refused_by_the_groups_node_is_stuck_after_the_grace() -> None:
    pod = pending(MESSAGES["cpu on the group's node"])
    found, wait = stuck.find_stuck([pod], T0 + 10, 30)
    assert found is None
    assert wait == pytest.approx(20)
    assert stuck.find_stuck([pod], T0 + 30, 30) == (pod, None)


def test_a_pod_waiting_for_its_placeholder_is_not_stuck() -> None:
    pod = pending(MESSAGES["waiting for the placeholder (not stuck on a node)"])
    assert stuck.find_stuck([pod], T0 + 3600, 30) == (None, None)


def test_a_scheduled_or_finished_pod_is_not_pending() -> None:
    pod = marked_pod("tekton-taskrun", node="n1")
    assert stuck.pending_pod(SLIM(pod)) is None
    done = marked_pod("tekton-taskrun", phase="Succeeded")
    assert stuck.pending_pod(SLIM(done)) is None


def test_the_longest_stuck_pod_is_chosen() -> None:
    late = pending(MESSAGES["pod cap"], since=T0 + 5, name="late")
    early = pending(MESSAGES["cpu on the group's node"], since=T0, name="early")
    assert stuck.find_stuck([late, early], T0 + 60, 30)[0] == early


def test_bound_pods_keep_no_scheduling_facts_in_the_cache() -> None:
    pod = marked_pod("tekton-taskrun", node="n1")
    assert stuck.FACTS not in SLIM(pod)


# ---- why (diagnose) ------------------------------------------------------------------


def test_diagnose_cpu_names_request_and_free() -> None:
    pod = pending(MESSAGES["cpu on the group's node"], cpu="1")
    found = stuck.diagnose(pod, node("n1"), usage(cpu="1501m", pods="2"))
    assert [f.cause for f in found] == [Cause.RESOURCES]
    assert "requests 1 cpu" in found[0].text
    assert "0.499 of 2 free" in found[0].text
    assert "n1" in found[0].option


def test_diagnose_pod_cap() -> None:
    pod = pending(MESSAGES["pod cap"], cpu="100m")
    found = stuck.diagnose(pod, node("n1", pods="4"), usage(cpu="1", pods="4"))
    assert [f.cause for f in found] == [Cause.PODS]
    assert "pod cap (4 pods)" in found[0].text
    assert "maxPods" in found[0].option


def test_diagnose_taint_and_cordon() -> None:
    pod = pending(MESSAGES["untolerated taint"], cpu="100m")
    tainted = node("n1", taints=[{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}])
    found = stuck.diagnose(pod, tainted, usage(pods="1"))
    assert [f.cause for f in found] == [Cause.TAINT]
    assert "{dedicated: gpu}:NoSchedule" in found[0].text
    cordoned = stuck.diagnose(pod, node("n1", unschedulable=True), usage(pods="1"))
    assert [f.cause for f in cordoned] == [Cause.UNSCHEDULABLE]


def test_diagnose_volume_pinned_to_another_node() -> None:
    pod = pending(MESSAGES["volume pinned elsewhere"], cpu="100m")
    claims = [stuck.ClaimState("data", True, local_pv("pv-data", "n2"))]
    found = stuck.diagnose(pod, node("n1"), usage(pods="1"), claims)
    assert [f.cause for f in found] == [Cause.VOLUME]
    assert "pv-data" in found[0].text
    assert "node n2" in found[0].text


def test_diagnose_finds_nothing_when_the_pod_fits() -> None:
    pod = pending(MESSAGES["cpu on the group's node"], cpu="100m")
    assert stuck.diagnose(pod, node("n1"), usage(cpu="1", pods="2")) == []
    facts = stuck.from_message(pod, "n1")
    assert facts[0].cause is Cause.RESOURCES
    assert "Insufficient cpu" in facts[0].text


# ---- safe? where to? ------------------------------------------------------------------


def test_a_running_pod_of_the_run_forbids_a_move() -> None:
    assert stuck.unsafe([]) == []
    (why,) = stuck.unsafe([stuck.Running("pr-build-pod", "n1")])
    assert "pr-build-pod" in why
    assert "n1" in why


def _candidates(
    pod: stuck.PendingPod,
    nodes: list[Node],
    claims: list[stuck.ClaimState] | None = None,
    *,
    key: str = "kubernetes.io/hostname",
    left: tuple[str, ...] = (),
    excluded: tuple[str, ...] = (),
) -> stuck.Candidates:
    return stuck.static_candidates(
        pod,
        nodes,
        topology_key=key,
        current=nodes[0],
        left=left,
        claims=claims or [],
        excluded=excluded,
    )


def test_candidates_skip_left_cordoned_tainted_excluded_and_unselected_nodes() -> None:
    pod = pending(
        MESSAGES["cpu on the group's node"], cpu="1", node_selector={"kubernetes.io/arch": "amd64"}
    )
    nodes = [
        node("here"),
        node("left-before"),
        node("cordoned", unschedulable=True),
        node("tainted", taints=[{"key": "x", "value": "", "effect": "NoExecute"}]),
        node("isolated"),
        node("arm", arch="arm64"),
        node("free"),
    ]
    found = _candidates(pod, nodes, left=("left-before",), excluded=("isolated",))
    assert [n.name for n in found.nodes] == ["free"]
    assert set(found.rejected) == {"left-before", "cordoned", "tainted", "isolated", "arm"}
    assert "already left" in found.rejected["left-before"]


def test_a_node_local_volume_pins_the_run_and_says_so() -> None:
    pod = pending(MESSAGES["cpu on the group's node"], cpu="1")
    claims = [stuck.ClaimState("data", True, local_pv("pv-data", "here"))]
    found = _candidates(pod, [node("here"), node("other")], claims)
    assert found.nodes == []
    assert found.volume_blocked == ["claim data (volume pv-data, usable on node here)"]


def test_a_zonal_volume_allows_its_zone_only() -> None:
    pod = pending(MESSAGES["cpu on the group's node"], cpu="1")
    claims = [
        stuck.ClaimState("data", True, zonal_pv("pv-data", "zone-a")),
        stuck.ClaimState("cache", False, None),  # unbound: provisioned where the run goes
    ]
    nodes = [node("here"), node("same-zone"), node("far", zone="zone-b")]
    found = _candidates(pod, nodes, claims)
    assert [n.name for n in found.nodes] == ["same-zone"]
    assert "data" in found.rejected["far"]


def test_zone_topology_moves_to_another_zone_never_within_the_same() -> None:
    pod = pending(MESSAGES["cpu on the group's node"], cpu="1")
    nodes = [node("here"), node("same-zone"), node("far", zone="zone-b")]
    found = _candidates(pod, nodes, key="topology.kubernetes.io/zone")
    assert [n.name for n in found.nodes] == ["far"]
    again = _candidates(pod, nodes, key="topology.kubernetes.io/zone", left=("zone-b",))
    assert again.nodes == []


def test_target_is_where_the_pod_and_the_placeholder_fit() -> None:
    pod = pending(MESSAGES["cpu on the group's node"], cpu="1")
    placeholder = resources({"cpu": "1m", "pods": "1"})
    full, roomy, roomier = node("full"), node("roomy"), node("roomier", cpu="4")
    use = {
        "full": usage(cpu="1500m", pods="1"),
        "roomy": usage(cpu="500m", pods="1"),
        "roomier": usage(cpu="1", pods="3"),
    }
    target, rejected = stuck.choose_target(pod, [full, roomy, roomier], use, placeholder)
    assert target == roomier  # most free cpu
    assert "cpu (0.5 free, 1.001 needed)" in rejected["full"]
    # Another run's placeholder there: prefer a node without one.
    target, _ = stuck.choose_target(pod, [roomy, roomier], use, placeholder, busy={"roomier"})
    assert target == roomy


def test_no_target_when_nothing_fits() -> None:
    pod = pending(MESSAGES["pod cap"], cpu="100m")
    capped = node("capped", pods="4")
    target, rejected = stuck.choose_target(
        pod, [capped], {"capped": usage(pods="4")}, resources({"pods": "1"})
    )
    assert target is None
    assert "pods" in rejected["capped"]


def test_explanation_names_node_cause_blockers_and_options() -> None:
    pod = pending(MESSAGES["cpu on the group's node"], cpu="1")
    findings = stuck.diagnose(pod, node("n1"), usage(cpu="1501m", pods="2"))
    text = stuck.explanation(
        pod,
        "PipelineRun pr-1",
        "n1",
        findings,
        stuck.unsafe([stuck.Running("pr-1-build-pod", "n1")]),
        ["wait for the running task to finish"],
    )
    assert text.startswith(f"pod {pod.name} of PipelineRun pr-1 cannot be scheduled on node n1")
    assert "0.499 of 2 free" in text
    assert "pr-1-build-pod" in text
    assert "free cpu on node n1" in text
    assert "wait for the running task" in text
