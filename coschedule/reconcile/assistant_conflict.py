"""Tekton's own Affinity Assistant on as well: ``plan_assistant_conflict(observed) -> Plan``.
Pure.

With Tekton's ``coschedule`` feature flag not ``disabled``, Tekton pins each TaskRun pod to
its own placeholder (a required pod-affinity term to ``app.kubernetes.io/instance:
affinity-assistant-<hash>``, ``app.kubernetes.io/component: affinity-assistant``) and the
webhook pins it to ours: when the two land on different nodes, the pod never schedules. The
webhook's admission warning reaches Tekton's controller, which creates the pods, and no
person; so for each live pod of the group pinned to another placeholder too, a Warning
Event on the pod and one on its run (the Executor tells each once) and a metric.
"""

from __future__ import annotations

from coschedule.engines import ENGINES
from coschedule.reconcile.model import (
    MarkedPod,
    Observed,
    OwnerRef,
    Plan,
    RecordEvent,
    ReportAssistantConflict,
)

REASON = "TektonAffinityAssistantConflict"
FIX = (
    "turn Tekton's own assistant off (coschedule: disabled in the feature-flags ConfigMap in "
    "tekton-pipelines); see coschedule's docs/migrating-from-tekton.md"
)


def plan_assistant_conflict(observed: Observed) -> Plan:
    """One report per live pod pinned to another placeholder too, and one per run of them."""
    actions: list[ReportAssistantConflict] = []
    runs: set[str] = set()
    namespace, ours = observed.namespace, observed.name
    for pod in observed.pods:
        if not pod.live or not pod.other_assistants:
            continue
        theirs = ", ".join(pod.other_assistants)
        both = (
            f"pinned both to coschedule's placeholder {ours} and to Tekton's own Affinity "
            f"Assistant {theirs}: if the two land on different nodes, it never schedules"
        )
        event = RecordEvent(
            namespace,
            ours,
            REASON,
            f"pod {pod.name} is {both}; {FIX}",
            "Warning",
            OwnerRef("v1", "Pod", pod.name, pod.uid),
        )
        actions.append(
            ReportAssistantConflict(
                namespace, ours, f"pod {pod.uid or pod.name}", pod.name, pod.other_assistants, event
            )
        )
        run = run_of(observed, pod)
        subject = f"run {run.kind}/{run.name}" if run is not None else ""
        if run is None or subject in runs:
            continue
        runs.add(subject)
        message = f"pods of this run are {both} (pod {pod.name} first); {FIX}"
        event = RecordEvent(namespace, ours, REASON, message, "Warning", run)
        actions.append(
            ReportAssistantConflict(namespace, ours, subject, pod.name, pod.other_assistants, event)
        )
    return Plan(tuple(actions))


def run_of(observed: Observed, pod: MarkedPod) -> OwnerRef | None:
    """The run the pod belongs to: its resolved root owner (per-run modes), else the run its
    engine's run label names (its uid unknown: the Event names it by kind and name)."""
    owner = observed.owner
    if owner is not None and owner.root is not None:
        return owner.root
    for engine in ENGINES:
        if engine.run_label and engine.run_label == pod.marks.run_label and pod.marks.run:
            return OwnerRef(engine.api_version, engine.kind, pod.marks.run, "")
    return None
