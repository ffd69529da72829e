"""Cache shapes: informer transforms that keep only what decisions read, and their parsers.

Transforms run on every listed or watched object, so the caches hold small plain dicts
(20,000 pods must fit in the RSS budget). Parsers turn those dicts into the frozen model;
a pod with malformed marks parses to ``BadMark`` instead of raising.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

import orjson

from coschedule.contract import (
    ANNOTATION_CLAIM_TEMPLATES,
    ANNOTATION_CLAIMS,
    ANNOTATION_MODE,
    ANNOTATION_RUN,
    ANNOTATION_RUN_LABEL,
    ANNOTATION_TOPOLOGY_KEY,
    COMPONENT_AFFINITY_ASSISTANT,
    LABEL_COMPONENT,
    LABEL_INSTANCE,
    LABEL_MANAGED_BY,
    LABEL_PLACEHOLDER,
    MANAGED_BY,
)
from coschedule.decide.claims import statefulset_templates
from coschedule.decide.modes import Mode
from coschedule.decide.names import claim_placeholder, run_placeholder
from coschedule.reconcile.model import (
    BadMark,
    ClaimTemplate,
    MarkedPod,
    NodeInfo,
    Obj,
    ObservedSet,
    OwnerRef,
    PlaceholderPod,
    Taint,
)

_MARK_ANNOTATIONS = (
    ANNOTATION_MODE,
    ANNOTATION_RUN,
    ANNOTATION_RUN_LABEL,
    ANNOTATION_CLAIMS,
    ANNOTATION_TOPOLOGY_KEY,
)
_DONE_PHASES = frozenset({"Succeeded", "Failed"})
_PLACEHOLDER_LABELS = frozenset({LABEL_COMPONENT, LABEL_INSTANCE, LABEL_MANAGED_BY})


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _controller_ref(meta: Mapping[str, Any]) -> dict[str, Any] | None:
    for ref in _list(meta.get("ownerReferences")):
        if isinstance(ref, dict) and ref.get("controller") is True:
            return {k: ref.get(k) for k in ("apiVersion", "kind", "name", "uid", "controller")}
    return None


def _finished_at(status: Mapping[str, Any]) -> str | None:
    latest: str | None = None
    for cs in _list(status.get("containerStatuses")):
        ended = _dict(_dict(_dict(cs).get("state")).get("terminated")).get("finishedAt")
        if isinstance(ended, str) and (latest is None or ended > latest):
            latest = ended
    return latest


def slim_marked_pod(obj: Obj) -> Obj:
    """Informer transform for marked pods: metadata we read, scheduling inputs, phase."""
    meta = _dict(obj.get("metadata"))
    spec = _dict(obj.get("spec"))
    status = _dict(obj.get("status"))
    labels = _dict(meta.get("labels"))
    annotations = _dict(meta.get("annotations"))
    slim_meta: Obj = {
        "name": meta.get("name"),
        "namespace": meta.get("namespace"),
        "uid": meta.get("uid"),
        "resourceVersion": meta.get("resourceVersion"),
        "creationTimestamp": meta.get("creationTimestamp"),
        "labels": {LABEL_PLACEHOLDER: labels.get(LABEL_PLACEHOLDER)},
        "annotations": {
            k: annotations[k]
            for k in (*_MARK_ANNOTATIONS, ANNOTATION_CLAIM_TEMPLATES)
            if k in annotations
        },
    }
    if meta.get("deletionTimestamp"):
        slim_meta["deletionTimestamp"] = meta["deletionTimestamp"]
    ref = _controller_ref(meta)
    if ref is not None:
        slim_meta["ownerReferences"] = [ref]
    slim_spec: Obj = {"nodeName": spec.get("nodeName") or ""}
    if spec.get("nodeSelector"):
        slim_spec["nodeSelector"] = spec["nodeSelector"]
    if spec.get("tolerations"):
        slim_spec["tolerations"] = spec["tolerations"]
    if spec.get("schedulerName"):
        slim_spec["schedulerName"] = spec["schedulerName"]
    slim_status: Obj = {"phase": status.get("phase") or ""}
    finished = _finished_at(status)
    if finished:
        slim_status["finishedAt"] = finished
    return {"metadata": slim_meta, "spec": slim_spec, "status": slim_status}


def slim_placeholder_pod(obj: Obj) -> Obj:
    meta = _dict(obj.get("metadata"))
    spec = _dict(obj.get("spec"))
    slim_meta: Obj = {
        "name": meta.get("name"),
        "namespace": meta.get("namespace"),
        "resourceVersion": meta.get("resourceVersion"),
        "labels": {k: v for k, v in _dict(meta.get("labels")).items() if k in _PLACEHOLDER_LABELS},
    }
    if meta.get("deletionTimestamp"):
        slim_meta["deletionTimestamp"] = meta["deletionTimestamp"]
    slim_spec: Obj = {"nodeName": spec.get("nodeName") or ""}
    if spec.get("tolerations"):
        slim_spec["tolerations"] = spec["tolerations"]
    return {"metadata": slim_meta, "spec": slim_spec}


def slim_node(obj: Obj) -> Obj:
    meta = _dict(obj.get("metadata"))
    spec = _dict(obj.get("spec"))
    slim_spec: Obj = {}
    if spec.get("unschedulable"):
        slim_spec["unschedulable"] = True
    taints = [
        {k: t.get(k) for k in ("key", "value", "effect") if t.get(k) is not None}
        for t in _list(spec.get("taints"))
        if isinstance(t, dict)
    ]
    if taints:
        slim_spec["taints"] = taints
    return {
        "metadata": {
            "name": meta.get("name"),
            "resourceVersion": meta.get("resourceVersion"),
            "labels": _dict(meta.get("labels")),
        },
        "spec": slim_spec,
    }


def slim_statefulset(obj: Obj) -> Obj:
    meta = _dict(obj.get("metadata"))
    spec = _dict(obj.get("spec"))
    slim_meta: Obj = {
        k: meta.get(k)
        for k in ("name", "namespace", "uid", "resourceVersion", "labels", "annotations")
    }
    if meta.get("ownerReferences"):
        slim_meta["ownerReferences"] = meta["ownerReferences"]
    if meta.get("deletionTimestamp"):
        slim_meta["deletionTimestamp"] = meta["deletionTimestamp"]
    strategy = _dict(spec.get("updateStrategy")).get("type")
    slim_spec: Obj = {"replicas": spec.get("replicas"), "strategy": strategy}
    templates = statefulset_templates(obj)
    if templates:
        slim_spec["templates"] = templates
    return {"metadata": slim_meta, "spec": slim_spec}


def parse_time(text: Any) -> float | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def parse_marked(obj: Mapping[str, Any]) -> MarkedPod | BadMark:
    """A slim marked pod -> ``MarkedPod``; malformed marks -> ``BadMark`` with the reason."""
    meta = _dict(obj.get("metadata"))
    spec = _dict(obj.get("spec"))
    status = _dict(obj.get("status"))
    namespace = str(meta.get("namespace") or "")
    name = str(meta.get("name") or "")
    placeholder = _dict(meta.get("labels")).get(LABEL_PLACEHOLDER)
    annotations = _dict(meta.get("annotations"))

    def bad(reason: str) -> BadMark:
        return BadMark(namespace, name, str(placeholder or ""), reason)

    if not isinstance(placeholder, str) or not placeholder:
        return bad(f"label {LABEL_PLACEHOLDER} is empty")
    missing = [k for k in _MARK_ANNOTATIONS if not isinstance(annotations.get(k), str)]
    if missing:
        return bad(f"annotation(s) missing: {', '.join(missing)}")
    mode = Mode.parse(annotations[ANNOTATION_MODE])
    if mode is None or mode is Mode.DISABLED:
        return bad(f"annotation {ANNOTATION_MODE}={annotations[ANNOTATION_MODE]!r} is not a mode")
    run = annotations[ANNOTATION_RUN]
    if not run or not annotations[ANNOTATION_RUN_LABEL] or not annotations[ANNOTATION_TOPOLOGY_KEY]:
        return bad(f"annotations {ANNOTATION_RUN}, run-label and topology-key must not be empty")
    claims = tuple(c.strip() for c in annotations[ANNOTATION_CLAIMS].split(",") if c.strip())
    if mode is Mode.WORKSPACES:
        if len(claims) != 1:
            return bad(f"mode workspaces needs exactly one claim, {ANNOTATION_CLAIMS} has {claims}")
        expected = claim_placeholder(namespace, claims[0])
    else:
        expected = run_placeholder(namespace, run)
    if placeholder != expected:
        return bad(f"placeholder {placeholder!r} is not {expected!r}, the name its marks give")
    templates = _claim_templates(annotations.get(ANNOTATION_CLAIM_TEMPLATES))
    if isinstance(templates, str):
        return bad(templates)
    ref = _controller_ref(meta)
    owner = None
    if ref is not None and all(
        isinstance(ref.get(k), str) and ref[k] for k in ("apiVersion", "kind", "name", "uid")
    ):
        owner = OwnerRef(ref["apiVersion"], ref["kind"], ref["name"], ref["uid"])
    selector = _dict(spec.get("nodeSelector"))
    return MarkedPod(
        namespace=namespace,
        name=name,
        uid=str(meta.get("uid") or ""),
        created=str(meta.get("creationTimestamp") or ""),
        placeholder=placeholder,
        mode=mode,
        run=run,
        run_label=annotations[ANNOTATION_RUN_LABEL],
        claims=claims,
        topology_key=annotations[ANNOTATION_TOPOLOGY_KEY],
        node_selector={str(k): str(v) for k, v in selector.items()},
        tolerations=tuple(t for t in _list(spec.get("tolerations")) if isinstance(t, dict)),
        owner=owner,
        live=status.get("phase") not in _DONE_PHASES and not meta.get("deletionTimestamp"),
        finished_at=parse_time(status.get("finishedAt")),
        claim_templates=templates,
        scheduler_name=str(spec.get("schedulerName") or ""),
    )


def _claim_templates(text: Any) -> tuple[ClaimTemplate, ...] | str | None:
    """The webhook's ``claim-templates`` annotation; a str is the reason it is malformed."""
    if text is None:
        return None
    try:
        doc = orjson.loads(text)
    except (orjson.JSONDecodeError, TypeError):
        return f"annotation {ANNOTATION_CLAIM_TEMPLATES} is not JSON"
    if not isinstance(doc, dict):
        return f"annotation {ANNOTATION_CLAIM_TEMPLATES} is not a JSON object"
    result = []
    for name, entry in sorted(doc.items()):
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("claim"), str)
            or not isinstance(entry.get("spec"), dict)
        ):
            return f"annotation {ANNOTATION_CLAIM_TEMPLATES}: entry {name!r} needs claim and spec"
        result.append(ClaimTemplate(name=str(name), spec=entry["spec"], claim=entry["claim"]))
    return tuple(result)


def parse_placeholder_pod(obj: Mapping[str, Any]) -> PlaceholderPod:
    meta = _dict(obj.get("metadata"))
    spec = _dict(obj.get("spec"))
    return PlaceholderPod(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        node_name=str(spec.get("nodeName") or ""),
        tolerations=tuple(t for t in _list(spec.get("tolerations")) if isinstance(t, dict)),
        deleting=bool(meta.get("deletionTimestamp")),
    )


def placeholder_instance(obj: Mapping[str, Any]) -> str:
    """The placeholder a pod belongs to if it is a placeholder pod we manage, else ""."""
    found = _dict(_dict(obj.get("metadata")).get("labels"))
    if found.get(LABEL_COMPONENT) != COMPONENT_AFFINITY_ASSISTANT:
        return ""
    if found.get(LABEL_MANAGED_BY) != MANAGED_BY:
        return ""
    return str(found.get(LABEL_INSTANCE) or "")


def marked_placeholder(obj: Mapping[str, Any]) -> str:
    """The placeholder label of a marked pod ("" if absent)."""
    value = _dict(_dict(obj.get("metadata")).get("labels")).get(LABEL_PLACEHOLDER)
    return value if isinstance(value, str) else ""


def parse_node(obj: Mapping[str, Any]) -> NodeInfo:
    meta = _dict(obj.get("metadata"))
    spec = _dict(obj.get("spec"))
    taints = tuple(
        Taint(str(t.get("key") or ""), str(t.get("value") or ""), str(t.get("effect") or ""))
        for t in _list(spec.get("taints"))
        if isinstance(t, dict)
    )
    return NodeInfo(str(meta.get("name") or ""), bool(spec.get("unschedulable")), taints)


def parse_statefulset(obj: Mapping[str, Any]) -> ObservedSet:
    meta = _dict(obj.get("metadata"))
    spec = _dict(obj.get("spec"))
    replicas = spec.get("replicas")
    return ObservedSet(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        resource_version=str(meta.get("resourceVersion") or ""),
        replicas=replicas if isinstance(replicas, int) else None,
        update_strategy=str(spec.get("strategy") or "RollingUpdate"),
        labels={str(k): str(v) for k, v in _dict(meta.get("labels")).items()},
        annotations={str(k): str(v) for k, v in _dict(meta.get("annotations")).items()},
        owner_references=tuple(
            r for r in _list(meta.get("ownerReferences")) if isinstance(r, dict)
        ),
        deleting=bool(meta.get("deletionTimestamp")),
        templates={str(k): str(v) for k, v in _dict(spec.get("templates")).items()},
    )
