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
"""

from __future__ import annotations

from dataclasses import dataclass

# How long after its creation a placeholder (StatefulSet, or its pod) still counts as on its
# way to being bound. The seed's chain takes about a second on a quiet cluster (see
# docs/benchmarks.md); past this it is waiting for something (a node, a quota, a
# controller) that an admission's wait will not see arrive.
ON_ITS_WAY_SECONDS = 5.0


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


def on_its_way(
    progress: PlaceholderProgress, now: float, young: float = ON_ITS_WAY_SECONDS
) -> bool:
    """Whether the placeholder is likely to be bound within a short wait: one of its pods is
    young and not reported Unschedulable, or, with no pod yet, its StatefulSet is young."""
    if progress.pods:
        return any(
            not pod.unschedulable and pod.created is not None and now - pod.created <= young
            for pod in progress.pods
        )
    created = progress.statefulset_created
    return created is not None and now - created <= young
