"""Run owners: which kinds are a run's root, how to walk to it, when it is done. Pure.

Pod -> TaskRun -> PipelineRun (Tekton), Pod -> TaskRun -> BuildRun (Shipwright),
Pod -> Workflow (Argo), Pod -> Job. The kinds, where the walk goes on up (``WALK_UP``) and
when each is done are ``coschedule.engines``' entries.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from coschedule.engines import BY_KIND, ENGINES, WALK_UP, succeeded_condition
from coschedule.reconcile.model import ObservedSet, OwnerRef

# kind -> resource plural, for the kinds whose objects we GET.
PLURALS: Mapping[str, str] = {engine.kind: engine.plural for engine in ENGINES}


def known(ref: OwnerRef) -> bool:
    return ref.kind in PLURALS


def _ref(ref: Mapping[str, Any]) -> OwnerRef | None:
    parts = [ref.get(k) for k in ("apiVersion", "kind", "name", "uid")]
    if all(isinstance(p, str) and p for p in parts):
        return OwnerRef(*(str(p) for p in parts))
    return None


def controller_ref(obj: Mapping[str, Any]) -> OwnerRef | None:
    meta = obj.get("metadata")
    refs = meta.get("ownerReferences") if isinstance(meta, dict) else None
    for ref in refs if isinstance(refs, list) else ():
        if isinstance(ref, dict) and ref.get("controller") is True:
            found = _ref(ref)
            if found is not None:
                return found
    return None


def parent_to_follow(ref: OwnerRef, obj: Mapping[str, Any]) -> OwnerRef | None:
    """The next owner up from ``obj`` (of kind ``ref.kind``), or None if ``obj`` is the root."""
    parents = WALK_UP.get(ref.kind)
    if not parents:
        return None
    parent = controller_ref(obj)
    return parent if parent is not None and parent.kind in parents else None


def completion(ref: OwnerRef, obj: Mapping[str, Any] | None) -> str | None:
    """Why the run whose root is ``ref`` is done (``obj`` is its current state, None when
    404), or None while it still runs."""
    if obj is None:
        return f"{ref.kind} {ref.name} was deleted"
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    if ref.uid and meta.get("uid") and meta.get("uid") != ref.uid:
        return f"{ref.kind} {ref.name} was deleted (a new object now has its name)"
    if meta.get("deletionTimestamp"):
        return f"{ref.kind} {ref.name} is being deleted"
    engine = BY_KIND.get(ref.kind)
    why = (engine.done if engine is not None else succeeded_condition)(obj)
    return f"{ref.kind} {ref.name} {why}" if why is not None else None


def root_from_statefulset(sts: ObservedSet) -> OwnerRef | None:
    """The owner we set on a StatefulSet (found again after a restart with no pods left)."""
    for ref in sts.owner_references:
        found = _ref(ref)
        if found is not None and found.kind in PLURALS:
            return found
    return None
