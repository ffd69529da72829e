"""Run owners: which kinds are a run's root, how to walk to it, when it is done. Pure.

Pod -> TaskRun -> PipelineRun (Tekton), Pod -> TaskRun -> BuildRun (Shipwright),
Pod -> Workflow (Argo), Pod -> Job. A Job's own owner (a CronJob) never completes, so the
walk stops at the Job; it continues above a TaskRun only to a PipelineRun or a BuildRun.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from coschedule.reconcile.observed import ObservedSet, OwnerRef

# kind -> resource plural, for the kinds whose objects we GET.
PLURALS: Mapping[str, str] = {
    "TaskRun": "taskruns",
    "PipelineRun": "pipelineruns",
    "BuildRun": "buildruns",
    "Workflow": "workflows",
    "Job": "jobs",
}
# kinds above which the walk continues, and to which parents.
WALK_UP: Mapping[str, frozenset[str]] = {"TaskRun": frozenset({"PipelineRun", "BuildRun"})}

ARGO_DONE_PHASES = frozenset({"Succeeded", "Failed", "Error"})


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


def _conditions(obj: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    status = obj.get("status")
    conds = status.get("conditions") if isinstance(status, dict) else None
    return [c for c in conds if isinstance(c, dict)] if isinstance(conds, list) else []


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
    if ref.kind == "Workflow":
        status = obj.get("status")
        phase = status.get("phase") if isinstance(status, dict) else None
        return f"Workflow {ref.name} phase {phase}" if phase in ARGO_DONE_PHASES else None
    if ref.kind == "Job":
        for cond in _conditions(obj):
            if cond.get("type") in ("Complete", "Failed") and cond.get("status") == "True":
                return f"Job {ref.name} condition {cond.get('type')}"
        return None
    # Tekton PipelineRun/TaskRun and Shipwright BuildRun: condition Succeeded not Unknown.
    for cond in _conditions(obj):
        if cond.get("type") == "Succeeded" and cond.get("status") in ("True", "False"):
            return f"{ref.kind} {ref.name} Succeeded={cond.get('status')} ({cond.get('reason')})"
    return None


def root_from_statefulset(sts: ObservedSet) -> OwnerRef | None:
    """The owner we set on a StatefulSet (found again after a restart with no pods left)."""
    for ref in sts.owner_references:
        found = _ref(ref)
        if found is not None and found.kind in PLURALS:
            return found
    return None
