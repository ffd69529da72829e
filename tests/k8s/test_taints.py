"""Kubernetes' toleration rules: which taints a pod's tolerations tolerate, and when a
pod must leave its node."""

from __future__ import annotations

from coschedule.k8s.nodes import Node, Taint
from coschedule.k8s.taints import eviction_reason, tolerates, untolerated


def test_toleration_matching_rules() -> None:
    taint = Taint("dedicated", "ci", "NoSchedule")
    assert tolerates({"operator": "Exists"}, taint)  # empty key + Exists tolerates all
    assert tolerates({"key": "dedicated", "operator": "Exists"}, taint)
    assert tolerates({"key": "dedicated", "value": "ci"}, taint)  # operator defaults to Equal
    assert not tolerates({"key": "dedicated", "operator": "Equal", "value": "gpu"}, taint)
    assert not tolerates({"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}, taint)
    assert not tolerates({"key": "other", "operator": "Exists"}, taint)
    assert not tolerates({"operator": "Equal", "value": "ci"}, taint)  # Equal needs a key
    evicting = Taint("node.kubernetes.io/unreachable", "", "NoExecute")
    assert tolerates({"operator": "Exists", "effect": "NoExecute"}, evicting)
    assert not tolerates({"operator": "Exists", "tolerationSeconds": 30}, evicting)


def test_cordon_wins_over_taint_as_the_reason() -> None:
    node = Node("n", True, (Taint("node.kubernetes.io/unschedulable", "", "NoSchedule"),))
    assert eviction_reason(node, ())[0] == "cordoned"


def test_only_repelling_untolerated_taints_count_and_the_reason_names_them() -> None:
    node = Node(
        "worker-1",
        False,
        (
            Taint("dedicated", "gpu", "NoSchedule"),
            Taint("busy", "", "PreferNoSchedule"),
            Taint("spot", "", "NoExecute"),
        ),
    )
    assert untolerated(node, [{"key": "spot", "operator": "Exists"}]) == [node.taints[0]]
    reason, why = eviction_reason(node, [])
    assert reason == "tainted"
    assert "dedicated=gpu:NoSchedule" in why
    assert "spot:NoExecute" in why
    assert "busy" not in why
    assert eviction_reason(Node("worker-2"), []) == ("", "")


def test_lifecycle_taints_count_only_while_the_node_is_not_ready_again() -> None:
    """The node lifecycle controller's taints: a reason to leave while its Ready condition
    says Unknown, False or nothing; on a node Ready again they are on their way out."""
    for key in ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready"):
        taints = (Taint(key, "", "NoSchedule"), Taint(key, "", "NoExecute"))
        for ready in ("Unknown", "False", ""):
            reason, why = eviction_reason(Node("n", False, taints, ready=ready), [])
            assert (reason, key in why) == ("tainted", True), ready
        assert eviction_reason(Node("n", False, taints, ready="True"), []) == ("", "")
    # Any other taint still counts on a Ready node.
    other = (
        Taint("node.kubernetes.io/unreachable", "", "NoSchedule"),
        Taint("x", "", "NoSchedule"),
    )
    reason, why = eviction_reason(Node("n", False, other, ready="True"), [])
    assert reason == "tainted"
    assert "x:NoSchedule" in why
    assert "unreachable" not in why
