"""The workflow engines coschedule knows, one entry each: pure data and functions.

Tekton PipelineRun and TaskRun, Argo Workflow, Shipwright BuildRun, plain Job. Each entry
says where the engine's objects live (group, version, plural), which pod label names its
run (a default of ``group-labels``), how a pod's owner walk reaches it, and when it is
done. The run engines (PipelineRun, Workflow) also say how concurrency control holds,
starts and cancels a run, and where its params are.

A new engine is one entry here plus YAML: the ConcurrencyControl CRD's ``kinds`` enum (a
run engine), RBAC to read (and, for a run engine, patch) it, and a webhook rule (a run
engine). Nothing here talks to the API.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

Obj = Mapping[str, Any]


class Kind(enum.StrEnum):
    """The run engines' kinds: what a ConcurrencyControl's ``kinds`` may name."""

    PIPELINE_RUN = "PipelineRun"
    WORKFLOW = "Workflow"


class Strategy(enum.StrEnum):
    """How a ConcurrencyControl makes room (each run engine says its cancel value)."""

    CANCEL = "Cancel"
    GRACEFULLY_CANCEL = "GracefullyCancel"
    GRACEFULLY_STOP = "GracefullyStop"
    QUEUE = "Queue"
    REPLACE = "Replace"


# Strategies that bound how many runs of a group run at once (spec.maxRunning).
SLOTTED = frozenset({Strategy.QUEUE, Strategy.REPLACE})


class Overflow(enum.StrEnum):
    """Which waiting run a Queue cancels when more than ``maxPending`` wait (spec.overflow)."""

    CANCEL_NEWEST = "CancelNewest"  # the arrival (GitHub Actions' queue: max)
    CANCEL_OLDEST = "CancelOldest"  # the one that waited longest


class KueueRuns(enum.StrEnum):
    """What a control does with a run Kueue admits (spec.kueue): one that carries
    ``kueue.x-k8s.io/queue-name``, which tekton-kueue holds pending until its quota admits it."""

    IGNORE = "Ignore"  # not selected at all: Kueue alone decides when it starts
    GROUP = "Group"  # grouped (counted, superseded) but never held or started by coschedule
    HOLD = "Hold"  # held like any other run (only where Kueue does not hold it too)


KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


class Order(enum.StrEnum):
    """Which runs pending by us a Queue starts first (spec.order)."""

    OLDEST_FIRST = "oldest-first"
    NEWEST_FIRST = "newest-first"


def _map(value: Any) -> Obj:
    return value if isinstance(value, Mapping) else {}


def _conditions(obj: Obj) -> list[Obj]:
    found = _map(obj.get("status")).get("conditions")
    return [c for c in found if isinstance(c, Mapping)] if isinstance(found, list) else []


def succeeded_condition(obj: Obj) -> str | None:
    """Knative's ``Succeeded`` condition (Tekton, Shipwright): done once True or False."""
    for condition in _conditions(obj):
        if condition.get("type") == "Succeeded":
            status = condition.get("status")
            if status in ("True", "False"):
                return f"Succeeded={status} ({condition.get('reason')})"
            return None
    return None


ARGO_DONE_PHASES = frozenset({"Succeeded", "Failed", "Error"})


def argo_phase(obj: Obj) -> str | None:
    phase = _map(obj.get("status")).get("phase")
    return f"phase {phase}" if phase in ARGO_DONE_PHASES else None


def job_condition(obj: Obj) -> str | None:
    for condition in _conditions(obj):
        if condition.get("type") in ("Complete", "Failed") and condition.get("status") == "True":
            return f"condition {condition.get('type')}"
    return None


# ---- how concurrency control holds, starts and cancels a run ---------------------------

TEKTON_PENDING = "PipelineRunPending"
# Tekton's spec.status values that stop a run (the last one is the pre-v1 spelling).
TEKTON_STOPPING = frozenset(
    {"Cancelled", "CancelledRunFinally", "StoppedRunFinally", "PipelineRunCancelled"}
)


def _named_values(items: Any) -> dict[str, Any]:
    found: dict[str, Any] = {}
    if isinstance(items, list):
        for item in items:
            if isinstance(item, Mapping) and isinstance(item.get("name"), str):
                found.setdefault(item["name"], item.get("value"))
    return found


def tekton_params(spec: Obj) -> dict[str, Any]:
    return _named_values(spec.get("params"))


def argo_params(spec: Obj) -> dict[str, Any]:
    return _named_values(_map(spec.get("arguments")).get("parameters"))


# What of a Tekton podTemplate limits where a pod may go (and which scheduler places it).
TEKTON_PLACEMENT_FIELDS = ("nodeSelector", "tolerations", "affinity", "schedulerName")
TEKTON_SPREAD = "topologySpreadConstraints"


def tekton_placement(template: Obj) -> dict[str, Any]:
    """A Tekton podTemplate's fields that decide where its pods may go."""
    kept: dict[str, Any] = {k: template[k] for k in TEKTON_PLACEMENT_FIELDS if template.get(k)}
    if "affinity" in kept:
        node_affinity = _map(kept["affinity"]).get("nodeAffinity")
        if node_affinity:
            kept["affinity"] = {"nodeAffinity": node_affinity}
        else:
            kept.pop("affinity")
    spread = template.get(TEKTON_SPREAD)
    spread = [s for s in spread if isinstance(s, Mapping)] if isinstance(spread, list) else []
    if spread:
        kept[TEKTON_SPREAD] = spread
    return kept


# The key under which a cached, slim PipelineRun (the reconciler keeps no ``taskRunSpecs``)
# records ``tekton_per_task_placement``'s answer in its spec.
SLIM_PER_TASK_PLACEMENT = "perTaskPlacement"


def tekton_per_task_placement(spec: Obj) -> bool:
    """Whether a PipelineRun's ``taskRunSpecs`` entry has a podTemplate that limits where
    its pods go: then its first pod's constraints depend on which task comes first. Fields
    that do not (a securityContext, env) leave the run's pods placed alike. One rule for the
    reconciler's seed and the webhook's wait for it: the webhook never holds a first pod
    for a placeholder the reconciler does not seed."""
    specs = spec.get("taskRunSpecs")
    return isinstance(specs, list) and any(
        tekton_placement(_map(_map(entry).get("podTemplate"))) for entry in specs
    )


# Labels an engine's controller adds to a run after admission, from the run's spec.
TEKTON_PIPELINE_LABEL = "tekton.dev/pipeline"
ARGO_TEMPLATE_LABEL = "workflows.argoproj.io/workflow-template"
ARGO_CLUSTER_TEMPLATE_LABEL = "workflows.argoproj.io/cluster-workflow-template"


def tekton_added_labels(spec: Obj, own_name: str) -> dict[str, str]:
    """Tekton (v1.x ``propagatePipelineNameLabelToPipelineRun``) sets ``tekton.dev/pipeline``
    on its first reconcile, after admission: ``spec.pipelineRef.name``; for an embedded
    ``pipelineSpec`` the run's own name; for a resolver ref the ``name`` parameter when the
    ``kind`` parameter is ``pipeline`` (the cluster resolver), else the run's name. A name
    the API server has not generated yet (``generateName``) is unknown: no label. Labels
    the engine copies from the Pipeline object are not known here."""
    ref = spec.get("pipelineRef")
    ref = ref if isinstance(ref, Mapping) else None
    found = ""
    if ref is not None and isinstance(ref.get("name"), str) and ref["name"]:
        found = ref["name"]
    elif isinstance(spec.get("pipelineSpec"), Mapping):
        found = own_name
    elif ref is not None and ref.get("resolver"):
        ref_params = {
            p.get("name"): p.get("value") for p in ref.get("params") or () if isinstance(p, Mapping)
        }
        named = ref_params.get("name")
        if ref_params.get("kind") == "pipeline" and isinstance(named, str):
            found = named
        else:
            found = own_name
    return {TEKTON_PIPELINE_LABEL: found} if found else {}


def argo_added_labels(spec: Obj, own_name: str) -> dict[str, str]:
    """Argo's submit paths set ``workflows.argoproj.io/workflow-template`` (or
    ``cluster-workflow-template`` with ``clusterScope``) to ``spec.workflowTemplateRef.name``.
    Labels the engine copies from the template object are not known here."""
    ref = spec.get("workflowTemplateRef")
    if isinstance(ref, Mapping) and isinstance(ref.get("name"), str) and ref["name"]:
        key = ARGO_CLUSTER_TEMPLATE_LABEL if ref.get("clusterScope") else ARGO_TEMPLATE_LABEL
        return {key: ref["name"]}
    return {}


@dataclass(frozen=True, slots=True)
class RunControl:
    """How concurrency control reads and writes a run engine's start state (``spec``)."""

    kind: Kind
    pending: Mapping[str, Any]  # the spec fields that hold a run (admission sets them)
    start: Mapping[str, Any]  # the merge patch of spec that lets a held run start
    cancel_field: str  # the spec field a cancel value goes in
    cancel_values: Mapping[Strategy, str]  # per cancelling strategy
    held_cancel: Mapping[str, Any]  # also in the cancel patch of a run we held
    is_pending: Callable[[Obj], bool]  # of spec
    start_state_set: Callable[[Obj], bool]  # the author set the start state at all
    is_stopping: Callable[[Obj], bool]  # a cancel or stop was asked
    params: Callable[[Obj], dict[str, Any]]  # of spec: name -> value
    # The labels the engine's controller adds to a run after admission: (spec, run name).
    added_labels: Callable[[Obj, str], dict[str, str]]
    spec_fields: tuple[str, ...]  # what the three predicates read of spec


PIPELINE_RUN_CONTROL = RunControl(
    kind=Kind.PIPELINE_RUN,
    pending={"status": TEKTON_PENDING},
    start={"status": None},
    cancel_field="status",
    cancel_values={
        Strategy.CANCEL: "Cancelled",
        Strategy.GRACEFULLY_CANCEL: "CancelledRunFinally",
        Strategy.GRACEFULLY_STOP: "StoppedRunFinally",
        # Replace cancels only runs that never started (pending by us): the plain cancel.
        Strategy.REPLACE: "Cancelled",
    },
    held_cancel={},
    is_pending=lambda spec: spec.get("status") == TEKTON_PENDING,
    start_state_set=lambda spec: bool(spec.get("status")),
    is_stopping=lambda spec: spec.get("status") in TEKTON_STOPPING,
    params=tekton_params,
    added_labels=tekton_added_labels,
    spec_fields=("status",),
)

WORKFLOW_CONTROL = RunControl(
    kind=Kind.WORKFLOW,
    pending={"suspend": True},
    start={"suspend": False},
    cancel_field="shutdown",
    cancel_values={
        Strategy.CANCEL: "Terminate",
        Strategy.GRACEFULLY_CANCEL: "Stop",
        Strategy.GRACEFULLY_STOP: "Stop",
        Strategy.REPLACE: "Terminate",
    },
    # A held Workflow is suspended: the shutdown is acted on only once it is not.
    held_cancel={"suspend": False},
    is_pending=lambda spec: spec.get("suspend") is True,
    start_state_set=lambda spec: spec.get("suspend") is True or bool(spec.get("shutdown")),
    is_stopping=lambda spec: bool(spec.get("shutdown")),
    params=argo_params,
    added_labels=argo_added_labels,
    spec_fields=("suspend", "shutdown"),
)


# ---- the engines -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Engine:
    kind: str
    group: str
    version: str
    plural: str
    done: Callable[[Obj], str | None]  # why the object is done ("Succeeded=True (...)"), or None
    run_label: str | None = None  # the label naming the run on its pods (group-labels default)
    # The kinds whose owner walk goes on up to this kind (a TaskRun's PipelineRun).
    above: frozenset[str] = frozenset()
    run: RunControl | None = None  # a run engine: concurrency control holds and starts it
    # The engine recreates a pod of its own that was deleted before it started (Tekton's
    # TaskRun reconciler does; Argo fails the step; the Job controller counts a failure), so
    # its pods may be pinned by node name: one left pending on a node its placeholder left is
    # deleted, and comes back pinned to the new node.
    recreates_pods: bool = False

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


ENGINES: tuple[Engine, ...] = (
    Engine(
        "PipelineRun",
        "tekton.dev",
        "v1",
        "pipelineruns",
        succeeded_condition,
        run_label="tekton.dev/pipelineRun",
        above=frozenset({"TaskRun"}),
        run=PIPELINE_RUN_CONTROL,
    ),
    Engine(
        "Workflow",
        "argoproj.io",
        "v1alpha1",
        "workflows",
        argo_phase,
        run_label="workflows.argoproj.io/workflow",
        run=WORKFLOW_CONTROL,
    ),
    Engine(
        "BuildRun",
        "shipwright.io",
        "v1beta1",
        "buildruns",
        succeeded_condition,
        run_label="buildrun.shipwright.io/name",
        above=frozenset({"TaskRun"}),
    ),
    Engine("TaskRun", "tekton.dev", "v1", "taskruns", succeeded_condition, recreates_pods=True),
    # A Job's own owner (a CronJob) never completes: the walk stops at the Job.
    Engine("Job", "batch", "v1", "jobs", job_condition),
)

BY_KIND: Mapping[str, Engine] = {engine.kind: engine for engine in ENGINES}
RUN_ENGINES: Mapping[Kind, Engine] = {
    engine.run.kind: engine for engine in ENGINES if engine.run is not None
}
# What follows from the entries, computed once.
RUN_LABELS: tuple[str, ...] = tuple(e.run_label for e in ENGINES if e.run_label)
# A claim owned by one of these, of the run's name, is the run's (engines name them so).
CLAIM_OWNER_KINDS: frozenset[str] = frozenset(BY_KIND)
# kind -> the kinds its owner walk goes on up to.
WALK_UP: Mapping[str, frozenset[str]] = {
    below: frozenset(e.kind for e in ENGINES if below in e.above)
    for below in sorted({k for e in ENGINES for k in e.above})
}
RUN_SPEC_FIELDS: tuple[str, ...] = tuple(
    dict.fromkeys(f for e in RUN_ENGINES.values() if e.run for f in e.run.spec_fields)
)


# (API group, kind) of the pod owners that recreate a deleted, never-started pod.
RECREATING_OWNERS: frozenset[tuple[str, str]] = frozenset(
    (e.group, e.kind) for e in ENGINES if e.recreates_pods
)


def pod_recreated_by_owner(owner_references: Any) -> bool:
    """Whether the pod's controller (its ownerReference with ``controller: true``) is an
    engine that recreates it when it is deleted before it starts."""
    if not isinstance(owner_references, list):
        return False
    for ref in owner_references:
        if not isinstance(ref, dict) or ref.get("controller") is not True:
            continue
        group, slash, _ = str(ref.get("apiVersion", "")).partition("/")
        return (group if slash else "", ref.get("kind")) in RECREATING_OWNERS
    return False


def run_kind_of(group: str, kind: str) -> Kind | None:
    """The run engine of an object's API group and kind, or None."""
    for engine in RUN_ENGINES.values():
        if engine.group == group and engine.kind == kind:
            return Kind(engine.kind)
    return None


def run_control(kind: Kind) -> RunControl:
    control = RUN_ENGINES[kind].run
    assert control is not None  # RUN_ENGINES holds only engines with one
    return control
