"""What a run is to concurrency control: its identity, labels and state, and the patches
that start or cancel it.

Pending, started, stopping and done are read from the fields each engine's own controller
reads and writes (``coschedule.engines`` says which, per engine); the patches that start
or cancel a run write those same fields.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from coschedule.concurrency.template import priority_value
from coschedule.engines import (
    RUN_ENGINES,
    SLIM_PER_TASK_PLACEMENT,
    Kind,
    run_control,
    tekton_per_task_placement,
)
from coschedule.k8s.timefmt import micro_time, parse_time
from coschedule.marks import (
    ANNOTATION_PENDING_BY,
    ANNOTATION_PRIORITY_PREFIX,
    ANNOTATION_RUN_ADMITTED,
    ANNOTATION_WAITING,
    ANNOTATION_WAITING_DATA,
    LABEL_CONCURRENCY_PREFIX,
    PENDING_BY_CONCURRENCY,
)


class State(enum.Enum):
    PENDING_BY_US = "pending by coschedule"
    PENDING_BY_AUTHOR = "pending by its author"
    RUNNING = "running"
    STOPPING = "stopping"  # cancel or stop requested, not done yet
    DONE = "done"


def _spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = obj.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def is_pending(kind: Kind, obj: Mapping[str, Any]) -> bool:
    return run_control(kind).is_pending(_spec(obj))


def start_state_set(kind: Kind, obj: Mapping[str, Any]) -> bool:
    """The author set the run's start state at all (pending, cancelled, stopped)."""
    return run_control(kind).start_state_set(_spec(obj))


def is_stopping(kind: Kind, obj: Mapping[str, Any]) -> bool:
    return run_control(kind).is_stopping(_spec(obj))


def is_done(kind: Kind, obj: Mapping[str, Any]) -> bool:
    return RUN_ENGINES[kind].done(obj) is not None


def params(kind: Kind, obj: Mapping[str, Any]) -> dict[str, Any]:
    """The run's params (Tekton ``spec.params``, Argo ``spec.arguments.parameters``)."""
    return run_control(kind).params(_spec(obj))


def engine_labels(kind: Kind, obj: Mapping[str, Any]) -> dict[str, str]:
    """The labels the engine's controller will add to this run from its spec, as it does
    (``coschedule.engines`` says which, per engine)."""
    return run_control(kind).added_labels(_spec(obj), str(_meta(obj).get("name") or ""))


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
    # A PipelineRun the reconciler seeds a placeholder for once started (no ``taskRunSpecs``
    # podTemplate that places its pods: ``engines.tekton_per_task_placement``).
    seedable: bool = False
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

    def priority_of(self, control: str) -> int:
        """The run's priority in ``control`` (annotation ``priority.coschedule.dev/<control>``,
        written at admission; 0 when absent or not an integer)."""
        return priority_value(self.annotations.get(ANNOTATION_PRIORITY_PREFIX + control, ""))

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


def seedable(kind: Kind, obj: Mapping[str, Any]) -> bool:
    """Whether the reconciler seeds this run's placeholder when it starts: a PipelineRun
    without a per-task podTemplate that places its pods, read from the whole run or its
    slim form."""
    spec = _spec(obj)
    return (
        kind is Kind.PIPELINE_RUN
        and not spec.get(SLIM_PER_TASK_PLACEMENT)
        and not tekton_per_task_placement(spec)
    )


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
        seedable=seedable(kind, obj),
    )


def start_patch(run: Run, now: float | None = None) -> dict[str, Any]:
    """JSON merge patch: pending mark and our annotations off, only if the run is unchanged.
    A seedable run started at ``now`` is stamped with it (``ANNOTATION_RUN_ADMITTED``), as
    the run webhook stamps one admitted started: its placeholder is seeded from then, and
    its first pod, which Tekton gives the run's annotations, waits for that placeholder."""
    spec: dict[str, Any] = dict(run_control(run.kind).start)
    annotations: dict[str, str | None] = {
        ANNOTATION_PENDING_BY: None,
        ANNOTATION_WAITING: None,
        ANNOTATION_WAITING_DATA: None,
    }
    if now is not None and run.seedable:
        annotations[ANNOTATION_RUN_ADMITTED] = micro_time(now)
    return {
        "metadata": {"resourceVersion": run.resource_version, "annotations": annotations},
        "spec": spec,
    }


def cancel_patch(run: Run, value: str) -> dict[str, Any]:
    """JSON merge patch: the engine's cancel value; a run we held loses our annotation (it is
    no longer ours to start) and, on Argo, its suspension (so the shutdown is acted on)."""
    control = run_control(run.kind)
    spec: dict[str, Any] = {control.cancel_field: value}
    metadata: dict[str, Any] = {"resourceVersion": run.resource_version}
    if run.state is State.PENDING_BY_US:
        metadata["annotations"] = {
            ANNOTATION_PENDING_BY: None,
            ANNOTATION_WAITING: None,
            ANNOTATION_WAITING_DATA: None,
        }
        spec.update(control.held_cancel)
    return {"metadata": metadata, "spec": spec}


def waiting_patch(run: Run, why: str, data: str | None = None) -> dict[str, Any]:
    """JSON merge patch: why the run waits (text, and data when given), only if the run is
    unchanged."""
    notes = {ANNOTATION_WAITING: why}
    if data is not None:
        notes[ANNOTATION_WAITING_DATA] = data
    return {"metadata": {"resourceVersion": run.resource_version, "annotations": notes}}
