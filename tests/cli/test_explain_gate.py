"""``explain --pod``'s judgement (``gate_report``) and the reconciler's report of pods that
waited behind the gate while no reconciler led (``gated_too_long``): pure, no cluster."""

from __future__ import annotations

from typing import Any

from coschedule.cli.explain_gate import gate_report
from coschedule.k8s.timefmt import parse_time
from coschedule.reconcile.controller import gated_too_long

NOW = parse_time("2026-11-27T01:00:00Z") or 0.0
GATE = {"name": "coschedule.dev/placeholder"}


def pod(labels: dict[str, str], gated: bool = True, created: str = "2026-11-27T00:55:00Z") -> Any:
    return {
        "metadata": {
            "name": "p",
            "namespace": "ci",
            "labels": labels,
            "creationTimestamp": created,
        },
        "spec": {"schedulingGates": [GATE] if gated else []},
    }


def lease(renewed: str) -> Any:
    return {"spec": {"holderIdentity": "coschedule-reconciler-abc", "renewTime": renewed}}


MARKED = {"coschedule.dev/placeholder": "affinity-assistant-0123456789"}


def test_a_gated_pod_with_no_reconciler_leading_says_what_lifts_it() -> None:
    report = gate_report(pod(MARKED), lease("2026-11-27T00:50:00.000000Z"), NOW)
    assert report["gated"] is True
    assert report["waitedSeconds"] == 300
    assert report["reconcilerLeading"] is False
    assert report["leaseRenewedSecondsAgo"] == 600
    assert "release-held" in report["lines"][-1]
    assert "affinity-assistant-0123456789" in report["lines"][0]


def test_no_lease_at_all_is_an_uninstall() -> None:
    report = gate_report(pod({"coschedule.dev/gated-by": "admission-policy"}), None, NOW)
    assert report["leaseHolder"] is None
    assert "admission policy" in report["lines"][0]
    assert report["lines"][-1].startswith("no coschedule reconciler Lease exists")


def test_a_leading_reconciler_is_named() -> None:
    report = gate_report(pod(MARKED), lease("2026-11-27T00:59:58.000000Z"), NOW)
    assert report["reconcilerLeading"] is True
    assert "coschedule-reconciler-abc" in report["lines"][-1]


def test_an_ungated_pod_says_so() -> None:
    report = gate_report(pod(MARKED, gated=False), None, NOW)
    assert report["gated"] is False
    assert report["lines"] == ["not behind the coschedule.dev/placeholder gate"]


def test_only_pods_gated_for_over_a_minute_are_reported_on_taking_the_lead() -> None:
    old = pod(MARKED, created="2026-11-27T00:58:00Z")
    fresh = pod(MARKED, created="2026-11-27T00:59:30Z")
    released = pod(MARKED, gated=False, created="2026-11-27T00:50:00Z")
    bound = pod(MARKED, created="2026-11-27T00:50:00Z")
    bound["spec"]["nodeName"] = "node-a"
    found = gated_too_long([old, fresh, released, bound], NOW)
    assert [(p is old, round(s)) for p, s in found] == [(True, 120)]
