"""The scheduler's fit arithmetic: quantities, a pod's request, what a node has free."""

from __future__ import annotations

from decimal import Decimal

import pytest

from coschedule.k8s import fit
from coschedule.k8s.quantity import quantity, resources, show
from tests.fixtures import load_pod


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("500m", Decimal("0.5")),
        ("2", Decimal(2)),
        ("1.5", Decimal("1.5")),
        ("1Gi", Decimal(2**30)),
        ("512Mi", Decimal(2**29)),
        ("1G", Decimal(10**9)),
        ("1e3", Decimal(1000)),
        (4, Decimal(4)),
        ("110", Decimal(110)),
        ("1.5E2", Decimal(150)),
        ("1E", Decimal(10**18)),
    ],
)
def test_quantities(text: object, value: Decimal) -> None:
    assert quantity(text) == value


@pytest.mark.parametrize("text", ["", "abc", "1Qi", "--1", True, None, "1e3Ki", "2mi", "1e"])
def test_bad_quantities_are_none(text: object) -> None:
    assert quantity(text) is None


def test_a_tekton_pods_request_sums_its_steps_and_takes_a_pod_slot() -> None:
    spec = load_pod("tekton-taskrun")["spec"]
    requests = fit.pod_requests(spec)
    expected_cpu = sum(
        quantity(((c.get("resources") or {}).get("requests") or {}).get("cpu", "0")) or 0
        for c in spec["containers"]
    )
    assert requests["cpu"] == expected_cpu
    assert requests[fit.PODS] == 1


def test_init_containers_count_as_their_peak_and_sidecars_add_up() -> None:
    spec = {
        "initContainers": [
            {"name": "big-init", "resources": {"requests": {"cpu": "3"}}},
            {"name": "proxy", "restartPolicy": "Always", "resources": {"requests": {"cpu": "1"}}},
            {"name": "late-init", "resources": {"requests": {"cpu": "2500m"}}},
        ],
        "containers": [{"name": "app", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}],
        "overhead": {"cpu": "100m"},
    }
    requests = fit.pod_requests(spec)
    # app 1 + sidecar 1 = 2 < init peaks max(3, 2.5 + 1) = 3.5; plus overhead
    assert requests["cpu"] == Decimal("3.6")
    assert requests["memory"] == Decimal(2**30)


def test_shortfalls_name_the_resource_the_request_and_what_is_free() -> None:
    allocatable = resources({"cpu": "2", "memory": "4Gi", "pods": "4"})
    in_use = fit.used(
        [
            resources({"cpu": "1500m", "pods": "1"}),
            resources({"cpu": "1m", "pods": "1"}),
        ]
    )
    requests = resources({"cpu": "1", "memory": "1Gi", "pods": "1"})
    assert fit.shortfalls(requests, allocatable, in_use) == [("cpu", Decimal(1), Decimal("0.499"))]
    full = fit.used([in_use, resources({"pods": "2"})])
    assert ("pods", Decimal(1), Decimal(0)) in fit.shortfalls(requests, allocatable, full)


def test_show_reads_like_kubectl() -> None:
    assert show("cpu", Decimal("0.499")) == "0.499"
    assert show("memory", Decimal(3 * 2**29)) == "1.5Gi"
    assert show("pods", Decimal(4)) == "4"
