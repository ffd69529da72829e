"""``coschedule explain``: what the webhook would do to a pod, offline, and why."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import orjson
import yaml

from coschedule.cli import manifests
from coschedule.config.settings import Settings
from coschedule.marks import (
    GATE_PLACEHOLDER,
    LABEL_ENABLED,
    LABEL_MODE,
    Mode,
    NamespaceInfo,
    Placement,
)
from coschedule.mutate.claim_rewrite import ClaimView, StaticClaims
from coschedule.mutate.decision import AdmissionContext, Decision, decide
from coschedule.placement import anti_affinity
from coschedule.placement.node_pin import gate_index, pinned_node
from coschedule.wire import jsonpatch
from coschedule.wire import pod_fields as podview


class UnreadablePod(ValueError):
    """The input is not a pod manifest (exit code 2)."""


def read_pod(doc: Any) -> dict[str, Any]:
    """A Pod from a parsed manifest (``manifests.one_document``); an AdmissionReview's
    ``request.object`` is taken too."""
    if isinstance(doc, dict) and doc.get("kind") == "AdmissionReview":
        request = doc.get("request")
        doc = request.get("object") if isinstance(request, dict) else None
    if not isinstance(doc, dict):
        raise UnreadablePod("expected a Pod manifest (a mapping)")
    if doc.get("kind", "Pod") != "Pod":
        raise UnreadablePod(f"expected kind Pod, not {doc.get('kind')!r}")
    return doc


def read_cluster_objects(text: str) -> list[dict[str, Any]]:
    """PVCs and StatefulSets for ``explain --claims``: YAML documents or a ``List``."""
    try:
        docs = manifests.documents(text)
    except manifests.Unreadable as exc:
        raise UnreadablePod(f"claims file: {exc}") from None
    objects: list[Any] = []
    lists = 0
    for doc in docs:
        if isinstance(doc, dict) and str(doc.get("kind", "")).endswith("List"):
            lists += 1
            items = doc.get("items")
            objects += items if isinstance(items, list) else [items]
        else:
            objects.append(doc)
    if not objects and not lists:
        raise UnreadablePod(f"claims file has no objects; expected {_CLAIM_FILE_KINDS}")
    for index, obj in enumerate(objects):
        kind = obj.get("kind") if isinstance(obj, dict) else None
        if kind not in CLAIM_FILE_KINDS:
            # Taking it anyway would answer for a cluster without the claims the user meant
            # to show: a misleading "retry" denial.
            what = f"kind {kind!r}" if isinstance(obj, dict) else f"a {type(obj).__name__}"
            raise UnreadablePod(
                f"claims file object {index + 1} is {what}; expected {_CLAIM_FILE_KINDS}"
            )
    return objects


CLAIM_FILE_KINDS = ("PersistentVolumeClaim", "StatefulSet", "Pod")
_CLAIM_FILE_KINDS = (
    "PersistentVolumeClaims, StatefulSets or Pods (kubectl get pvc,sts,pods -o yaml)"
)


def static_claims(text: str, namespace: str) -> StaticClaims:
    return StaticClaims.from_objects(read_cluster_objects(text), namespace)


# Where the namespace explained came from, in the report's ``namespaceFrom``.
FROM_FLAG = "--namespace"
FROM_MANIFEST = "metadata.namespace"
ASSUMED = "assumed: the manifest names none and no -n was given"


def namespace_of(obj: Mapping[str, Any], given: str | None) -> tuple[str, str]:
    """The namespace to explain ``obj`` in and where it came from: ``-n``, the manifest's
    own, else ``default``, as kubectl would create it, said as assumed."""
    if given:
        return given, FROM_FLAG
    meta = obj.get("metadata")
    own = meta.get("namespace") if isinstance(meta, Mapping) else None
    if isinstance(own, str) and own:
        return own, FROM_MANIFEST
    return "default", ASSUMED


def namespace_text(report: Mapping[str, Any]) -> str:
    """``ci`` or ``default (assumed: ...)``: the report's namespace as a person reads it."""
    namespace = str(report["namespace"])
    return f"{namespace} ({ASSUMED})" if report.get("namespaceFrom") == ASSUMED else namespace


class PlaceholderBoundTo:
    """``--placeholder-node``: the pod's placeholder is taken as bound to this node."""

    def __init__(self, node: str) -> None:
        self.bound = node

    def node(self, namespace: str, placeholder: str) -> str | None:
        return self.bound


def explain(
    pod: Mapping[str, Any],
    settings: Settings,
    *,
    mode: Mode | None = None,
    namespace_mode: str | None = None,
    namespace: str | None = None,
    claims: ClaimView | None = None,
    namespace_labels: Mapping[str, str] | None = None,
    placement: Placement | None = None,
    placeholder_node: str | None = None,
) -> tuple[Decision, dict[str, Any]]:
    """The decision and a machine-readable report (the text form is rendered from it).
    Offline, no placeholder is bound (a pod placed by node name is gated) unless
    ``placeholder_node`` says where it is."""
    if mode is not None:
        settings = replace(settings, mode=mode, mode_reason=f"--mode {mode.value}")
    if placement is not None:
        settings = replace(settings, placement=placement)
    placeholders = PlaceholderBoundTo(placeholder_node) if placeholder_node else None
    ns, ns_from = namespace_of(pod, namespace)
    info = None
    if namespace_mode is not None or namespace_labels:
        labels = {**(namespace_labels or {}), LABEL_ENABLED: "true"}
        if namespace_mode is not None:
            labels[LABEL_MODE] = namespace_mode
        info = NamespaceInfo(labels)
    decision = decide(pod, AdmissionContext(settings, ns, info, claims, placeholders=placeholders))
    report: dict[str, Any] = {
        "allowed": decision.allowed,
        "namespace": ns,
        "namespaceFrom": ns_from,
        "mode": decision.mode_label,
        "placeholder": decision.placeholder,
        "reasons": decision.reasons,
        "patch": decision.ops,
    }
    if decision.warnings:
        report["warnings"] = decision.warnings
    scheduling = decision.scheduling
    if scheduling is not None and scheduling.contributions:
        report["schedulingDefaults"] = [
            {"rule": c.rule, "ruleScope": c.rule_label, "field": c.field, "value": c.value}
            for c in scheduling.contributions
        ]
    if decision.findings:
        report["policy"] = [
            {"rule": f.rule, "mode": f.mode.value, "field": f.field, "message": f.message}
            for f in decision.findings
        ]
    if decision.scope is not None and decision.allowed:
        scope = decision.scope.scope
        report["isolation"] = {
            "scope": scope.value,
            "from": decision.scope.reason,
            "tenant": decision.tenant or None,
            "keepsOff": anti_affinity.describe(scope, decision.tenant),
            "placeholderAntiAffinity": anti_affinity.required_terms(
                scope, decision.tenant, settings.topology_key
            ),
        }
    if not decision.allowed:
        report["rule"] = decision.rule
        report["message"] = decision.message
        return decision, report
    patched = jsonpatch.apply(pod, decision.ops) if decision.ops else pod
    if decision.placeholder is not None:
        report["placement"] = placement_of(patched)
    if decision.ops:
        patched_spec = patched.get("spec") or {}
        report["affinity"] = patched_spec.get("affinity")
        if patched_spec.get("schedulingGates"):
            report["schedulingGates"] = patched_spec["schedulingGates"]
        if "schedulingDefaults" in report:
            report["scheduling"] = {
                key: patched_spec[key]
                for key in ("nodeSelector", "tolerations", "schedulerName")
                if key in patched_spec
            }
    return decision, report


def placement_of(pod: Mapping[str, Any]) -> dict[str, Any]:
    """How the admitted pod is tied to its placeholder: by node name (pinned, or gated until
    the reconciler pins it) or by pod affinity."""
    if gate_index(podview.spec(pod)) is not None:
        return {"by": "node-name", "gated": True, "node": None}
    node = pinned_node(podview.metadata(pod))
    if node is not None:
        return {"by": "node-name", "gated": False, "node": node}
    return {"by": "pod-affinity", "gated": False, "node": None}


def _placement_text(placement: Mapping[str, Any]) -> str:
    if placement["by"] == "pod-affinity":
        return "pod affinity (a required pod-affinity term to the placeholder)"
    if placement["gated"]:
        return (
            f"by node name: held behind the {GATE_PLACEHOLDER} scheduling gate until the "
            "reconciler pins it to the placeholder's node"
        )
    return f"by node name: pinned to {placement['node']}"


def render_text(report: Mapping[str, Any]) -> str:
    lines = [
        f"decision:    {'allowed' if report['allowed'] else 'DENIED'}",
        f"namespace:   {namespace_text(report)}",
        f"mode:        {report['mode']}",
        f"placeholder: {report['placeholder'] or '-'}",
        *(
            [f"placement:   {_placement_text(report['placement'])}"]
            if "placement" in report
            else []
        ),
        "why:",
        *(f"  - {reason}" for reason in report["reasons"]),
    ]
    if not report["allowed"]:
        lines += ["message:", f"  {report['message']}"]
    for warning in report.get("warnings", ()):
        lines.append(f"warning:     {warning}")
    if report.get("schedulingDefaults"):
        lines.append("scheduling defaults merged:")
        lines += [
            f"  - {c['field']} {c['value']}  <- scheduling-defaults {c['ruleScope']}"
            for c in report["schedulingDefaults"]
        ]
    if report.get("policy"):
        lines.append("policy rules fired:")
        lines += [f"  - policy-{f['rule']} ({f['mode']}): {f['message']}" for f in report["policy"]]
    if (isolated := report.get("isolation")) is not None:
        tenant = f", tenant {isolated['tenant']!r}" if isolated["tenant"] else ""
        lines += [
            f"isolation:   scope {isolated['scope']}{tenant} (from the {isolated['from']}): "
            f"{isolated['keepsOff']}",
            "placeholder anti-affinity (required):",
        ]
        rendered = yaml.safe_dump(
            isolated["placeholderAntiAffinity"], sort_keys=False, default_flow_style=False
        )
        lines += [f"  {line}" for line in rendered.rstrip().splitlines()]
    if report["patch"]:
        lines.append("patch (JSONPatch):")
        lines += [f"  {orjson.dumps(op).decode()}" for op in report["patch"]]
    if report.get("affinity") is not None:
        lines.append("resulting affinity:")
        rendered = yaml.safe_dump(report["affinity"], sort_keys=False, default_flow_style=False)
        lines += [f"  {line}" for line in rendered.rstrip().splitlines()]
    if report.get("schedulingGates"):
        lines.append("resulting scheduling gates:")
        lines += [f"  - {gate.get('name')}" for gate in report["schedulingGates"]]
    if report.get("scheduling"):
        lines.append("resulting scheduling fields:")
        rendered = yaml.safe_dump(report["scheduling"], sort_keys=False, default_flow_style=False)
        lines += [f"  {line}" for line in rendered.rstrip().splitlines()]
    return "\n".join(lines)
