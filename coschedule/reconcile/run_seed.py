"""A PipelineRun's placeholder made when the run is created, before its first pod: planned
``seed(run, namespace_labels, settings, now) -> Seed | None``. Pure.

Made from the first pod, a run's placeholder is created, scheduled and started while that
pod waits behind the placeholder's gate. Made from the run, it is bound before Tekton
creates the first TaskRun's pod, so the webhook pins that pod at admission. The seed is the
pod Tekton will make, as far as the run says (its labels, which Tekton copies onto every
pod, and its ``taskRunTemplate.podTemplate``'s node constraints), decided by the webhook's
own ``decide``: the same placeholder name, mode, topology key, isolation scope and
constraints the first pod gets.

No seed (the placeholder waits for the first pod, as before) when:
- the run is held (``spec.status`` set: pending, by its author or by concurrency control,
  or cancelled), done, or being deleted;
- a ``taskRunSpecs`` entry has its own podTemplate that limits where its pods go
  (``engines.tekton_per_task_placement``, which the webhook's wait reads too): the first
  pod's constraints depend on which task comes first;
- ``rewrite-claims`` is on: the placeholder's volumeClaimTemplates are fixed when it is
  created, and only the first pod's admission knows them;
- the webhook would not give the run a per-run placeholder (namespace not enabled, mode
  ``workspaces`` or ``disabled``, a refusal);
- the run began more than ``idle-grace-seconds`` ago: a run that made no pod within the
  idle grace holds no placeholder (``plan`` tears a seeded one down then), so a run that
  never makes a pod, or is deleted at once, costs at most one idle placeholder pod for that
  long. A run begins at its creation, or when coschedule started it (a run held by
  concurrency control, started by the reconciler with its stamp, ``run_begun``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from coschedule.config.settings import Settings
from coschedule.engines import (
    SLIM_PER_TASK_PLACEMENT,
    tekton_per_task_placement,
    tekton_placement,
)
from coschedule.k8s.timefmt import parse_time
from coschedule.marks import (
    ANNOTATION_MODE,
    ANNOTATION_RUN,
    ANNOTATION_RUN_ADMITTED,
    ANNOTATION_RUN_LABEL,
    BadMark,
    Mode,
    NamespaceInfo,
    run_identity,
    run_placeholder,
)
from coschedule.mutate.decision import AdmissionContext, decide
from coschedule.reconcile.model import MarkedPod, Obj, OwnerRef
from coschedule.reconcile.shapes import parse_marked, slim_marked_pod
from coschedule.wire import jsonpatch
from coschedule.wire import pod_fields as podview

API_VERSION = "tekton.dev/v1"
KIND = "PipelineRun"
PLURAL = "pipelineruns"
LABEL_PIPELINE_RUN = "tekton.dev/pipelineRun"
_DONE = ("True", "False")  # the Succeeded condition of a finished run
# What kube-apiserver's DefaultTolerationSeconds plugin adds to a pod that tolerates neither
# taint (before webhooks see it): the seed gets them too, so that the first pod's
# tolerations, and the placeholder's template, are the seed's.
_DEFAULT_TOLERATED = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
_DEFAULT_TOLERATION_SECONDS = 300


@dataclass(frozen=True, slots=True)
class Seed:
    """The run's first pod as far as its placeholder reads it, and the run (its owner)."""

    pod: MarkedPod
    root: OwnerRef
    expires: float  # when the seed stops holding a placeholder without any pod of the run


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def slim_run(obj: Obj) -> Obj:
    """Informer transform: what a seed reads of a PipelineRun (every PipelineRun of the
    cluster is cached, so nothing else is kept)."""
    meta = _dict(obj.get("metadata"))
    spec = _dict(obj.get("spec"))
    template = _dict(_dict(spec.get("taskRunTemplate")).get("podTemplate"))
    per_task = tekton_per_task_placement(spec)
    claims = sorted(
        {
            str(claim)
            for ws in _list(spec.get("workspaces"))
            if (claim := _dict(_dict(ws).get("persistentVolumeClaim")).get("claimName"))
        }
    )
    done = any(
        isinstance(c, dict) and c.get("type") == "Succeeded" and c.get("status") in _DONE
        for c in _list(_dict(obj.get("status")).get("conditions"))
    )
    slim_meta: Obj = {
        k: meta.get(k) for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
    }
    slim_meta["labels"] = _dict(meta.get("labels"))
    stamp = _dict(meta.get("annotations")).get(ANNOTATION_RUN_ADMITTED)
    if isinstance(stamp, str):
        slim_meta["admitted"] = stamp
    if meta.get("deletionTimestamp"):
        slim_meta["deletionTimestamp"] = meta["deletionTimestamp"]
    slim_spec: Obj = {"status": spec.get("status") or "", "podTemplate": tekton_placement(template)}
    if per_task:
        slim_spec[SLIM_PER_TASK_PLACEMENT] = True
    if claims:
        slim_spec["claims"] = claims
    return {"metadata": slim_meta, "spec": slim_spec, "status": {"done": done}}


def ended(root: OwnerRef, run: Mapping[str, Any] | None) -> str | None:
    """Why the PipelineRun ``root`` names is done as the runs' cache says (``run``: its slim
    form, None once deleted), or None while it may still make pods."""
    if run is not None and _dict(run.get("metadata")).get("uid") not in (root.uid, None, ""):
        run = None  # another run under its name: it was deleted
    return orphan_done(root.name, run)


def same_for_seed(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two slim versions of a run differ in nothing a seed reads (its version aside:
    most of a run's updates are its status, which the slim form leaves out)."""
    meta_a, meta_b = dict(_dict(a.get("metadata"))), dict(_dict(b.get("metadata")))
    meta_a.pop("resourceVersion", None)
    meta_b.pop("resourceVersion", None)
    return (
        meta_a == meta_b and a.get("spec") == b.get("spec") and a.get("status") == b.get("status")
    )


def candidate(run: Mapping[str, Any]) -> bool:
    """Whether a (slim) run could hold a seed now: started, not done, not being deleted."""
    meta = _dict(run.get("metadata"))
    spec = _dict(run.get("spec"))
    return not (
        meta.get("deletionTimestamp")
        or spec.get("status")
        or spec.get(SLIM_PER_TASK_PLACEMENT)
        or _dict(run.get("status")).get("done")
    )


def namespace_changed(event: str, obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> bool:
    """Whether a namespace's event may change which of its runs hold a seed: its labels
    changed (enabled, disabled, its mode), or it is new to the cache (the namespaces' watch
    may list it after its runs were looked at without it). Not a delete: its runs go too."""
    if event == "DELETED":
        return False
    if event == "ADDED" or old is None:
        return True
    labels = _dict(obj.get("metadata")).get("labels")
    return bool(labels != _dict(old.get("metadata")).get("labels"))


def orphan_run(annotations: Mapping[str, str]) -> str | None:
    """The PipelineRun a placeholder StatefulSet was made for, by its annotations (its run
    and the group label that gave it); None for any other engine's run or a claim's group:
    the reconciler watches PipelineRuns only, so only theirs can be known done."""
    mode = Mode.parse(annotations.get(ANNOTATION_MODE, ""))
    if mode is None or not mode.per_run:
        return None
    if annotations.get(ANNOTATION_RUN_LABEL) != LABEL_PIPELINE_RUN:
        return None
    return annotations.get(ANNOTATION_RUN) or None


def orphan_done(name: str, run: Mapping[str, Any] | None) -> str | None:
    """Why a PipelineRun's placeholder with no owner reference and no pod left can go now
    (``run`` its slim form as read, None: gone), or None while the run may still make pods
    (then the idle grace stands, as for any quiet group)."""
    if run is None:
        return f"PipelineRun {name} is gone"
    if _dict(run.get("metadata")).get("deletionTimestamp"):
        return f"PipelineRun {name} is being deleted"
    if _dict(run.get("status")).get("done"):
        return f"PipelineRun {name} is done"
    return None


def pod_labels(run: Mapping[str, Any]) -> dict[str, str]:
    """The labels Tekton puts on the run's pods that the webhook reads: the run's own
    (copied onto every TaskRun and pod) and the run's name."""
    meta = _dict(run.get("metadata"))
    labels = {str(k): str(v) for k, v in _dict(meta.get("labels")).items()}
    labels[LABEL_PIPELINE_RUN] = str(meta.get("name") or "")
    return labels


def placeholder_key(run: Mapping[str, Any], settings: Settings) -> str | None:
    """``namespace/placeholder`` of the run's per-run placeholder (its run identity as the
    webhook reads it from the pods' labels); None when its pods would not be in a run."""
    namespace = str(_dict(run.get("metadata")).get("namespace") or "")
    identity = run_identity(pod_labels(run), settings.group_labels)
    if identity is None:
        return None
    return f"{namespace}/{run_placeholder(namespace, identity[1])}"


def seed_pod(run: Mapping[str, Any]) -> Obj:
    """The pod Tekton will make for the run's first TaskRun, as far as the run says."""
    meta = _dict(run.get("metadata"))
    spec = _dict(run.get("spec"))
    name = str(meta.get("name") or "")
    pod_spec: Obj = {
        "containers": [{"name": "step", "image": "seed"}],
        **{k: v for k, v in _dict(spec.get("podTemplate")).items()},
    }
    pod_spec.setdefault("schedulerName", "default-scheduler")  # the API server's default
    pod_spec["tolerations"] = _with_default_tolerations(_list(pod_spec.get("tolerations")))
    claims = [str(c) for c in _list(spec.get("claims"))]
    if claims:
        pod_spec["volumes"] = [
            {"name": f"ws-{i}", "persistentVolumeClaim": {"claimName": c}}
            for i, c in enumerate(claims)
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{name}-seed",
            "namespace": meta.get("namespace"),
            "creationTimestamp": meta.get("creationTimestamp"),
            "labels": pod_labels(run),
            "annotations": {},
            # A TaskRun's pod (its engine recreates a deleted, never-started one).
            "ownerReferences": [
                {
                    "apiVersion": API_VERSION,
                    "kind": "TaskRun",
                    "name": f"{name}-seed",
                    "uid": str(meta.get("uid") or ""),
                    "controller": True,
                }
            ],
        },
        "spec": pod_spec,
    }


def _with_default_tolerations(tolerations: list[Any]) -> list[Any]:
    """``tolerations`` with the defaults the API server adds, as it adds them: one per
    taint key no NoExecute (or effect-less) toleration covers already."""
    result = list(tolerations)
    for key in _DEFAULT_TOLERATED:
        covered = any(
            isinstance(t, dict)
            and t.get("effect") in (None, "", "NoExecute")
            and (t.get("key") == key or (not t.get("key") and t.get("operator") == "Exists"))
            for t in tolerations
        )
        if not covered:
            result.append(
                {
                    "key": key,
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": _DEFAULT_TOLERATION_SECONDS,
                }
            )
    return result


def seed(
    run: Mapping[str, Any],
    namespace_labels: Mapping[str, str] | None,
    settings: Settings,
    now: float,
) -> Seed | None:
    """The run's seed (see the module's doc), or None."""
    meta = _dict(run.get("metadata"))
    begun = run_begun(run, now)
    if namespace_labels is None or begun is None or not candidate(run):
        return None
    if settings.rewrite_claims:
        return None
    expires = begun + float(settings.idle_grace_seconds)
    if now >= expires:
        return None
    pod = seed_pod(run)
    namespace = str(meta.get("namespace") or "")
    info = NamespaceInfo(dict(namespace_labels))
    ctx = AdmissionContext(settings, namespace, info, explain=False)
    try:
        decision = decide(pod, ctx)
        if not decision.allowed or decision.mode is None or not decision.mode.per_run:
            return None
        marked = parse_marked(slim_marked_pod(jsonpatch.apply(pod, decision.ops)))
    except (podview.MalformedPod, jsonpatch.PatchTestFailed):
        return None
    if isinstance(marked, BadMark):
        return None
    root = OwnerRef(API_VERSION, KIND, str(meta.get("name") or ""), str(meta.get("uid") or ""))
    # Not a pod of the cluster: never gated, pinned or recreated by anyone.
    pod_view = replace(marked, uid="", gated=None, recreated=False, owner=root, live=True)
    return Seed(pod_view, root, expires)


def run_begun(run: Mapping[str, Any], now: float) -> float | None:
    """When a (slim) run began, for its idle grace: its creation, or its stamp when later
    (coschedule started it after holding it). A stamp older than the run was copied with
    it; one later than ``now`` is not trusted (it would hold an idle placeholder as long as
    it says): both are left to the creation."""
    meta = _dict(run.get("metadata"))
    created = parse_time(meta.get("creationTimestamp"))
    stamp = parse_time(meta.get("admitted"))
    if created is None or stamp is None or stamp > now:
        return created
    return max(created, stamp)
