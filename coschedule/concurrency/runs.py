"""What a run is to concurrency control, per engine: Tekton PipelineRuns and Argo Workflows.

Pending, started, stopping and done are read from the fields each engine's own controller
reads and writes; the patches that start or cancel a run write those same fields.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from coschedule.k8s.timefmt import parse_time
from coschedule.marks import ANNOTATION_PENDING_BY, LABEL_CONCURRENCY_PREFIX, PENDING_BY_CONCURRENCY


class Kind(enum.StrEnum):
    PIPELINE_RUN = "PipelineRun"
    WORKFLOW = "Workflow"


@dataclass(frozen=True, slots=True)
class Engine:
    kind: Kind
    group: str
    version: str
    plural: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"


ENGINES: dict[Kind, Engine] = {
    Kind.PIPELINE_RUN: Engine(Kind.PIPELINE_RUN, "tekton.dev", "v1", "pipelineruns"),
    Kind.WORKFLOW: Engine(Kind.WORKFLOW, "argoproj.io", "v1alpha1", "workflows"),
}

TEKTON_PENDING = "PipelineRunPending"
# Tekton's spec.status values that stop a run (the last one is the pre-v1 spelling).
TEKTON_STOPPING = frozenset(
    {"Cancelled", "CancelledRunFinally", "StoppedRunFinally", "PipelineRunCancelled"}
)
ARGO_DONE = frozenset({"Succeeded", "Failed", "Error"})


class Strategy(enum.StrEnum):
    CANCEL = "Cancel"
    GRACEFULLY_CANCEL = "GracefullyCancel"
    GRACEFULLY_STOP = "GracefullyStop"
    QUEUE = "Queue"


# The value each engine's controller understands, per cancelling strategy.
CANCEL_VALUES: dict[Kind, dict[Strategy, str]] = {
    Kind.PIPELINE_RUN: {
        Strategy.CANCEL: "Cancelled",
        Strategy.GRACEFULLY_CANCEL: "CancelledRunFinally",
        Strategy.GRACEFULLY_STOP: "StoppedRunFinally",
    },
    Kind.WORKFLOW: {
        Strategy.CANCEL: "Terminate",
        Strategy.GRACEFULLY_CANCEL: "Stop",
        Strategy.GRACEFULLY_STOP: "Stop",
    },
}


class State(enum.Enum):
    PENDING_BY_US = "pending by coschedule"
    PENDING_BY_AUTHOR = "pending by its author"
    RUNNING = "running"
    STOPPING = "stopping"  # cancel or stop requested, not done yet
    DONE = "done"


def kind_of(group: str, kind: str) -> Kind | None:
    for engine in ENGINES.values():
        if engine.group == group and engine.kind.value == kind:
            return engine.kind
    return None


def _spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = obj.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _status(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    status = obj.get("status")
    return status if isinstance(status, Mapping) else {}


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def is_pending(kind: Kind, obj: Mapping[str, Any]) -> bool:
    spec = _spec(obj)
    if kind is Kind.PIPELINE_RUN:
        return spec.get("status") == TEKTON_PENDING
    return spec.get("suspend") is True


def start_state_set(kind: Kind, obj: Mapping[str, Any]) -> bool:
    """The author set the run's start state at all (pending, cancelled, stopped)."""
    spec = _spec(obj)
    if kind is Kind.PIPELINE_RUN:
        return bool(spec.get("status"))
    return spec.get("suspend") is True or bool(spec.get("shutdown"))


def is_stopping(kind: Kind, obj: Mapping[str, Any]) -> bool:
    spec = _spec(obj)
    if kind is Kind.PIPELINE_RUN:
        return spec.get("status") in TEKTON_STOPPING
    return bool(spec.get("shutdown"))


def is_done(kind: Kind, obj: Mapping[str, Any]) -> bool:
    """Tekton: the Succeeded condition is True or False; Argo: a final phase."""
    status = _status(obj)
    if kind is Kind.PIPELINE_RUN:
        for condition in status.get("conditions") or ():
            if isinstance(condition, Mapping) and condition.get("type") == "Succeeded":
                return condition.get("status") in ("True", "False")
        return False
    return status.get("phase") in ARGO_DONE


def params(kind: Kind, obj: Mapping[str, Any]) -> dict[str, Any]:
    """Tekton ``spec.params``, Argo ``spec.arguments.parameters``: name -> value."""
    spec = _spec(obj)
    if kind is Kind.PIPELINE_RUN:
        items = spec.get("params")
    else:
        arguments = spec.get("arguments")
        items = arguments.get("parameters") if isinstance(arguments, Mapping) else None
    found: dict[str, Any] = {}
    if isinstance(items, list):
        for item in items:
            if isinstance(item, Mapping) and isinstance(item.get("name"), str):
                found.setdefault(item["name"], item.get("value"))
    return found


# Labels an engine's controller adds to a run after admission, from the run's spec.
TEKTON_PIPELINE_LABEL = "tekton.dev/pipeline"
ARGO_TEMPLATE_LABEL = "workflows.argoproj.io/workflow-template"
ARGO_CLUSTER_TEMPLATE_LABEL = "workflows.argoproj.io/cluster-workflow-template"


def engine_labels(kind: Kind, obj: Mapping[str, Any]) -> dict[str, str]:
    """The labels the engine's controller will add to this run from its spec, as it does.

    Tekton (v1.x ``propagatePipelineNameLabelToPipelineRun``) sets ``tekton.dev/pipeline``
    on its first reconcile, after admission: ``spec.pipelineRef.name``; for an embedded
    ``pipelineSpec`` the run's own name; for a resolver ref the ``name`` parameter when the
    ``kind`` parameter is ``pipeline`` (the cluster resolver), else the run's name. Argo's
    submit paths set ``workflows.argoproj.io/workflow-template`` (or
    ``cluster-workflow-template`` with ``clusterScope``) to ``spec.workflowTemplateRef.name``.
    A name the API server has not generated yet (``generateName``) is unknown: no label.
    Labels the engine copies from the Pipeline or template object are not known here.
    """
    spec = _spec(obj)
    own_name = str(_meta(obj).get("name") or "")
    found = ""
    key = TEKTON_PIPELINE_LABEL
    if kind is Kind.PIPELINE_RUN:
        ref = spec.get("pipelineRef")
        ref = ref if isinstance(ref, Mapping) else None
        if ref is not None and isinstance(ref.get("name"), str) and ref["name"]:
            found = ref["name"]
        elif isinstance(spec.get("pipelineSpec"), Mapping):
            found = own_name
        elif ref is not None and ref.get("resolver"):
            ref_params = {
                p.get("name"): p.get("value")
                for p in ref.get("params") or ()
                if isinstance(p, Mapping)
            }
            named = ref_params.get("name")
            if ref_params.get("kind") == "pipeline" and isinstance(named, str):
                found = named
            else:
                found = own_name
    else:
        ref = spec.get("workflowTemplateRef")
        if isinstance(ref, Mapping) and isinstance(ref.get("name"), str):
            found = ref["name"]
            key = ARGO_CLUSTER_TEMPLATE_LABEL if ref.get("clusterScope") else ARGO_TEMPLATE_LABEL
    return {key: found} if found else {}


def run_labels(kind: Kind, obj: Mapping[str, Any]) -> dict[str, str]:
    """The labels a user sees on the run once its engine has reconciled it: its own (which
    win, as the engines only add a label that is absent) and those the engine will add."""
    labels = engine_labels(kind, obj)
    labels.update(_str_map(_meta(obj).get("labels")))
    return labels


@dataclass(frozen=True, slots=True)
class Run:
    """A run as the reconciler sees it: identity, labels, and where it stands."""

    kind: Kind
    namespace: str
    name: str
    uid: str
    resource_version: str
    created: str  # RFC 3339 as stored; orders runs (with the name as tie-break)
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    state: State
    created_at: float = 0.0  # ``created`` parsed once: plans sort by it
    # Unique within a namespace (a PipelineRun and a Workflow may share a name); computed
    # once, since plans use it as a set member.
    ident: str = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ident", f"{self.kind.value}/{self.name}")

    @property
    def order(self) -> tuple[float, str]:
        return (self.created_at, self.name)

    @property
    def pending_by_us(self) -> bool:
        return self.state is State.PENDING_BY_US

    def groups(self) -> dict[str, str]:
        """control name -> label value, from the run's concurrency labels."""
        return {
            key[len(LABEL_CONCURRENCY_PREFIX) :]: value
            for key, value in self.labels.items()
            if key.startswith(LABEL_CONCURRENCY_PREFIX)
        }

    def key_of(self, control: str) -> str:
        """The key as written at admission: the annotation when the label is a hash."""
        return self.annotations.get(LABEL_CONCURRENCY_PREFIX + control) or self.labels.get(
            LABEL_CONCURRENCY_PREFIX + control, ""
        )


def state_of(kind: Kind, obj: Mapping[str, Any]) -> State:
    if is_done(kind, obj):
        return State.DONE
    if is_stopping(kind, obj):
        return State.STOPPING
    if is_pending(kind, obj):
        annotations = _meta(obj).get("annotations") or {}
        if isinstance(annotations, Mapping) and annotations.get(ANNOTATION_PENDING_BY) == (
            PENDING_BY_CONCURRENCY
        ):
            return State.PENDING_BY_US
        return State.PENDING_BY_AUTHOR
    return State.RUNNING


def _str_map(value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        return {}
    return {str(k): str(v) for k, v in value.items() if isinstance(v, str)}


def parse_run(kind: Kind, obj: Mapping[str, Any]) -> Run:
    meta = _meta(obj)
    created = str(meta.get("creationTimestamp") or "")
    return Run(
        kind=kind,
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        resource_version=str(meta.get("resourceVersion") or ""),
        created=created,
        labels=run_labels(kind, obj),
        annotations=_str_map(meta.get("annotations")),
        state=state_of(kind, obj),
        created_at=parse_time(created) or 0.0,
    )


def start_patch(run: Run) -> dict[str, Any]:
    """JSON merge patch: pending mark and our annotation off, only if the run is unchanged."""
    spec: dict[str, Any] = {"status": None} if run.kind is Kind.PIPELINE_RUN else {"suspend": False}
    return {
        "metadata": {
            "resourceVersion": run.resource_version,
            "annotations": {ANNOTATION_PENDING_BY: None},
        },
        "spec": spec,
    }


def cancel_patch(run: Run, value: str) -> dict[str, Any]:
    """JSON merge patch: the engine's cancel value; a run we held loses our annotation (it is
    no longer ours to start) and, on Argo, its suspension (so the shutdown is acted on)."""
    spec: dict[str, Any] = (
        {"status": value} if run.kind is Kind.PIPELINE_RUN else {"shutdown": value}
    )
    metadata: dict[str, Any] = {"resourceVersion": run.resource_version}
    if run.state is State.PENDING_BY_US:
        metadata["annotations"] = {ANNOTATION_PENDING_BY: None}
        if run.kind is Kind.WORKFLOW:
            spec["suspend"] = False
    return {"metadata": metadata, "spec": spec}
