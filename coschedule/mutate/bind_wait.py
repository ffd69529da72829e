"""Whether a run's pod, held only because its placeholder is not bound yet, is worth holding
at admission until it is (then pinned there, not gated). Pure.

A PipelineRun's placeholder is made when the run is (``reconcile.run_seed``); Tekton makes
the run's first pod 0.3-2.3 s later, and the seed's chain (the StatefulSet, its pod made by
kube-controller-manager, bound by kube-scheduler, seen by the webhook's watch) takes about
as long. A pod that comes first is worth a short wait when that chain is under way: the
StatefulSet was made a moment ago, or its pod was and the scheduler has not said it cannot
place it. A placeholder the scheduler cannot place, or one that has been unbound for
longer than a placeholder takes to be bound, is not coming soon: the pod is gated at once
and the reconciler pins it, as without the wait.

A pod may also come before the reconciler has made the StatefulSet (0.1-0.3 s after the
run): nothing of the placeholder is seen yet. When the pod's run was admitted a moment ago
(``/mutate-runs``), and the reconciler seeds a placeholder for such a run (``seeded_run``,
``seedable_run``), the placeholder counts as on its way too: admitted by this webhook
replica (``server.young_runs``), or by any, as the run's stamp says (``admitted_op``; Tekton
copies it onto the run's pods, ``run_admitted`` reads it there).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from coschedule.config.settings import Settings
from coschedule.engines import tekton_per_task_placement
from coschedule.k8s.timefmt import micro_time, parse_time
from coschedule.marks import ANNOTATION_RUN_ADMITTED, Mode
from coschedule.mutate.mode_choice import ModeChoice, choose_mode, cluster_choice
from coschedule.wire.jsonpatch import Op, add, pointer

# How long after its creation a placeholder (StatefulSet, or its pod) still counts as on its
# way to being bound. The seed's chain takes about a second on a quiet cluster (see
# docs/benchmarks.md); past this it is waiting for something (a node, a quota, a
# controller) that an admission's wait will not see arrive.
ON_ITS_WAY_SECONDS = 5.0

# The label Tekton puts on every pod of a PipelineRun: the run's name. Only PipelineRuns get
# a placeholder seeded at their creation (``reconcile.run_seed``).
PIPELINE_RUN_LABEL = "tekton.dev/pipelineRun"
# kube-apiserver makes a name from ``generateName`` as the prefix (cut to 58 characters)
# and 5 random characters (apiserver's ``names.SimpleNameGenerator``).
GENERATED_SUFFIX = 5
GENERATE_PREFIX_MAX = 63 - GENERATED_SUFFIX


@dataclass(frozen=True, slots=True)
class PendingPod:
    """A placeholder's pod that is live (not terminating nor finished) and not bound."""

    created: float | None  # creationTimestamp, seconds since the epoch (None: unreadable)
    unschedulable: bool  # PodScheduled=False with reason Unschedulable


@dataclass(frozen=True, slots=True)
class PlaceholderProgress:
    """What the webhook's watches know of an unbound placeholder."""

    # Its StatefulSet's creationTimestamp (None: not in the cache, or unreadable).
    statefulset_created: float | None = None
    pods: tuple[PendingPod, ...] = ()
    # When this webhook admitted the pod's run, if a moment ago and the reconciler seeds a
    # placeholder for it (None: not known here).
    run_admitted: float | None = None


def on_its_way(
    progress: PlaceholderProgress, now: float, young: float = ON_ITS_WAY_SECONDS
) -> bool:
    """Whether the placeholder is likely to be bound within a short wait: one of its pods is
    young and not reported Unschedulable, or, with no pod yet, its StatefulSet is young, or,
    with nothing of it seen yet, its run was admitted a moment ago (the reconciler is about
    to make it)."""
    if progress.pods:
        return any(
            not pod.unschedulable and pod.created is not None and now - pod.created <= young
            for pod in progress.pods
        )
    created = progress.statefulset_created
    if created is None:
        created = progress.run_admitted
    return created is not None and now - created <= young


def seeded_run(mode: Mode | None, labels: Mapping[str, str], rewrite_claims: bool) -> str | None:
    """The PipelineRun whose placeholder the reconciler makes at the run's creation, of a
    pod with these labels in this mode; None when none is (another engine's run, a claim's
    placeholder, or ``rewrite-claims`` on: then the placeholder waits for the first pod)."""
    if mode is None or not mode.per_run or rewrite_claims:
        return None
    return labels.get(PIPELINE_RUN_LABEL) or None


def seedable_run(run: Mapping[str, Any], started: bool = False) -> bool:
    """Whether the reconciler seeds a placeholder for a PipelineRun as created: not held
    (``spec.status``, unless ``started``: cleared at this admission) and no ``taskRunSpecs``
    entry whose podTemplate limits where its pods go (the seed's own rule)."""
    spec = run.get("spec")
    if not isinstance(spec, Mapping) or (spec.get("status") and not started):
        return False
    return not tekton_per_task_placement(spec)


def seeded_mode(
    run: Mapping[str, Any], namespace_labels: Mapping[str, str], settings: Settings
) -> bool:
    """Whether a PipelineRun's pods get a mode whose placeholder the reconciler seeds (a
    per-run mode, ``rewrite-claims`` off), by the run's labels (Tekton copies them onto its
    pods), its namespace's and the cluster's: ``seeded_run``'s rule, read at the run's
    admission."""
    meta = run.get("metadata")
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    own = (
        {k: v for k, v in labels.items() if isinstance(v, str)}
        if isinstance(labels, Mapping)
        else {}
    )
    cluster = cluster_choice(settings.mode, settings.mode_reason)
    choice = choose_mode(own, namespace_labels, cluster)
    return isinstance(choice, ModeChoice) and choice.mode.per_run and not settings.rewrite_claims


_ANNOTATIONS_PATH = pointer("metadata", "annotations")
_ADMITTED_PATH = pointer("metadata", "annotations", ANNOTATION_RUN_ADMITTED)


def admitted_op(run: Mapping[str, Any], ops: list[Op], now: float) -> Op | None:
    """The op that stamps a seedable run with when it was admitted (``now``), after the
    admission's other ``ops`` (which may create the annotations map themselves). None when
    the run bears a stamp of this moment already (a reinvocation: the patch stays the same);
    a copied run's older stamp is replaced."""
    meta = run.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    if isinstance(annotations, Mapping):
        stamped = parse_time(annotations.get(ANNOTATION_RUN_ADMITTED))
        if stamped is not None and 0.0 <= now - stamped <= ON_ITS_WAY_SECONDS:
            return None
        return add(_ADMITTED_PATH, micro_time(now))
    if any(op.get("path") == _ANNOTATIONS_PATH for op in ops):
        return add(_ADMITTED_PATH, micro_time(now))
    return add(_ANNOTATIONS_PATH, {ANNOTATION_RUN_ADMITTED: micro_time(now)})


def run_admitted(annotations: Mapping[str, str]) -> float | None:
    """When a pod's run was admitted as seedable, as its engine copied the run's stamp onto
    the pod (``admitted_op``); None without one."""
    return parse_time(annotations.get(ANNOTATION_RUN_ADMITTED))


def generated_prefix(name: str) -> str:
    """The ``generateName`` a generated name may have been made from (its last 5 cut)."""
    return name[:-GENERATED_SUFFIX] if len(name) > GENERATED_SUFFIX else ""
