"""``coschedule explain --pod NAME``: why a live pod waits behind coschedule's scheduling gate,
and whether anything will lift it: who marked it (the webhook, or only the admission policy
while the webhook was away), how long it has waited, and whether a reconciler holds the
Lease (only the reconciler lifts the gate; after an uninstall, ``release-held`` does).

Reads only (GET): the pod and the reconciler's Lease. The judgement is pure
(``gate_report``), tested without a cluster.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from coschedule.k8s.timefmt import parse_time
from coschedule.kube.leader import ElectionConfig
from coschedule.marks import GATE_PLACEHOLDER, GATED_BY_POLICY, LABEL_GATED_BY, LABEL_PLACEHOLDER
from coschedule.placement.node_pin import gate_index, pinned_node

# A Lease not renewed for this long: no reconciler leads (it renews every 2 s, holds 15 s).
LEASE_STALE_SECONDS = 30.0


def gate_report(
    pod: Mapping[str, Any], lease: Mapping[str, Any] | None, now: float
) -> dict[str, Any]:
    """What the pod's gate means, as a dict (``--output json``) with ``lines`` for people."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    labels = meta.get("labels") or {}
    created = parse_time(meta.get("creationTimestamp"))
    waited = max(0.0, now - created) if created is not None else None
    gated = gate_index(spec) is not None
    report: dict[str, Any] = {
        "pod": f"{meta.get('namespace')}/{meta.get('name')}",
        "gated": gated,
        "placeholder": labels.get(LABEL_PLACEHOLDER),
        "pinnedNode": pinned_node(meta),
        "node": spec.get("nodeName"),
        "waitedSeconds": round(waited) if waited is not None and gated else None,
    }
    holder, renewed = _lease(lease)
    report["leaseHolder"] = holder
    report["leaseRenewedSecondsAgo"] = round(now - renewed) if renewed is not None else None
    leading = holder is not None and renewed is not None and now - renewed < LEASE_STALE_SECONDS
    report["reconcilerLeading"] = leading
    lines: list[str] = []
    if not gated:
        where = spec.get("nodeName") or report["pinnedNode"]
        lines.append(
            f"not behind the {GATE_PLACEHOLDER} gate" + (f"; placed on {where}" if where else "")
        )
        report["lines"] = lines
        return report
    if labels.get(LABEL_PLACEHOLDER):
        lines.append(
            f"behind the {GATE_PLACEHOLDER} gate for {report['waitedSeconds']}s, marked for "
            f"placeholder {labels[LABEL_PLACEHOLDER]}: the reconciler pins it to the "
            "placeholder's node and lifts the gate once the placeholder is bound"
        )
    elif labels.get(LABEL_GATED_BY) == GATED_BY_POLICY:
        lines.append(
            f"behind the {GATE_PLACEHOLDER} gate for {report['waitedSeconds']}s, put there by "
            "the admission policy while the webhook did not answer; the reconciler marks and "
            "places it"
        )
    else:
        lines.append(f"behind the {GATE_PLACEHOLDER} gate for {report['waitedSeconds']}s")
    if leading:
        lines.append(
            f"a reconciler leads ({holder}, Lease renewed {report['leaseRenewedSecondsAgo']}s ago)"
        )
    else:
        why = (
            "no coschedule reconciler Lease exists"
            if lease is None
            else f"the reconciler Lease was last renewed {report['leaseRenewedSecondsAgo']}s ago"
        )
        lines.append(
            f"{why}: nothing lifts this gate until a reconciler leads again. If coschedule was "
            "uninstalled, `coschedule release-held` lifts every such gate (placing nothing)"
        )
    report["lines"] = lines
    return report


def _lease(lease: Mapping[str, Any] | None) -> tuple[str | None, float | None]:
    if lease is None:
        return None, None
    spec = lease.get("spec") or {}
    holder = spec.get("holderIdentity")
    return (str(holder) if holder else None), parse_time(spec.get("renewTime"))


def lease_path(namespace: str) -> str:
    from coschedule.kube.client import object_path

    return object_path(
        "coordination.k8s.io/v1", "leases", namespace, ElectionConfig(namespace).name
    )
