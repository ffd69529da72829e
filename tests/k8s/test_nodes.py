"""One Node: read from the API's shape or a cache's slim copy, tolerant of odd shapes."""

from __future__ import annotations

from decimal import Decimal

from coschedule.k8s.nodes import Node, Taint, parse_node


def test_a_node_reads_labels_cordon_taints_and_allocatable() -> None:
    node = parse_node(
        {
            "metadata": {"name": "worker-1", "labels": {"topology.kubernetes.io/zone": "z1"}},
            "spec": {
                "unschedulable": True,
                "taints": [
                    {"key": "dedicated", "value": "ci", "effect": "NoSchedule"},
                    {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"},
                    "not a taint",
                ],
            },
            "status": {"allocatable": {"cpu": "3500m", "memory": "2Gi", "pods": "110"}},
        }
    )
    assert node.name == "worker-1"
    assert node.unschedulable
    assert node.taints == (
        Taint("dedicated", "ci", "NoSchedule"),
        Taint("node.kubernetes.io/unreachable", "", "NoExecute"),
    )
    assert node.domain("topology.kubernetes.io/zone") == "z1"
    assert node.domain("kubernetes.io/hostname") is None
    assert node.allocatable == {
        "cpu": Decimal("3.5"),
        "memory": Decimal(2 * 2**30),
        "pods": Decimal(110),
    }


def test_odd_shapes_give_an_empty_schedulable_node() -> None:
    assert parse_node({"metadata": None, "spec": {"taints": {}}, "status": []}) == Node("")
