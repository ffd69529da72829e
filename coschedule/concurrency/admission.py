"""Run admission: (run, the namespace's controls) -> labels and, usually, pending.

Per matching control the run gets ``concurrency.coschedule.dev/<control>: <label value>``
(and, when the key had to be hashed, an annotation of the same name with the key itself).
Unless its author set its start state, the run is made pending (Tekton ``spec.status:
PipelineRunPending``, Argo ``spec.suspend: true``) and annotated ``coschedule.dev/pending-by:
concurrency``: the reconciler starts it. Idempotent: a reinvocation adds nothing.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from coschedule.concurrency.control import Control
from coschedule.concurrency.runs import is_pending, params, run_labels, start_state_set
from coschedule.concurrency.template import label_value, priority_value
from coschedule.engines import KUEUE_QUEUE_LABEL, Kind, KueueRuns, run_control
from coschedule.marks import (
    ANNOTATION_HELD_BY,
    ANNOTATION_PENDING_BY,
    ANNOTATION_PRIORITY_PREFIX,
    CONCURRENCY_GROUPED,
    HELD_BY_POLICY,
    LABEL_CONCURRENCY_GROUPED,
    LABEL_CONCURRENCY_PREFIX,
    PENDING_BY_CONCURRENCY,
)
from coschedule.wire.jsonpatch import Op, add, pointer, remove


class Outcome(enum.Enum):
    UNTOUCHED = "untouched: no ConcurrencyControl selects it"
    MADE_PENDING = "made pending: the reconciler starts it when its group lets it"
    AUTHOR_PENDING = "left pending by its author: grouped, never started by coschedule"
    AUTHOR_STATE = "left as its author set it (spec start state given): grouped only"
    ALREADY_PENDING = "already pending by coschedule (reinvocation): nothing to add"
    RELEASED = "held by the admission policy, started again: no ConcurrencyControl selects it"
    KUEUE = (
        "grouped only: Kueue admits it (kueue.x-k8s.io/queue-name) and not every control "
        "that selects it says kueue: Hold"
    )


@dataclass(frozen=True, slots=True)
class Match:
    control: Control
    key: str
    value: str  # the label value: the key, or its hash
    priority: int | None = None  # the control's priority of the run (None: it has none)

    @property
    def hashed(self) -> bool:
        return self.value != self.key


@dataclass(frozen=True, slots=True)
class RunAdmission:
    outcome: Outcome
    matches: tuple[Match, ...] = ()
    ops: list[Op] = field(default_factory=list)


def _str_map(value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        return {}
    return {str(k): v for k, v in value.items() if isinstance(v, str)}


def match_controls(
    kind: Kind, run: Mapping[str, Any], namespace: str, controls: Iterable[Control]
) -> tuple[Match, ...]:
    meta = run.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    # Selected on the labels users see on their runs, including those the engine adds
    # after admission (tekton.dev/pipeline of a pipelineRef): the same the reconciler reads.
    labels = run_labels(kind, run)
    annotations = _str_map(meta.get("annotations"))
    run_params: dict[str, Any] | None = None
    found: list[Match] = []
    for control in sorted(controls, key=lambda c: c.name):
        if not control.holds(kind, labels):
            continue
        if run_params is None:
            run_params = params(kind, run)
        key = control.key.expand(namespace, labels, annotations, run_params)
        priority = None
        if control.priority is not None:
            expanded = control.priority.expand(namespace, labels, annotations, run_params)
            priority = priority_value(expanded)
        found.append(Match(control, key, label_value(key), priority))
    return tuple(found)


def admit_run(
    kind: Kind, run: Mapping[str, Any], namespace: str, controls: Iterable[Control]
) -> RunAdmission:
    matches = match_controls(kind, run, namespace, controls)
    meta = run.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    labels = meta.get("labels")
    annotations = meta.get("annotations")
    held = policy_held(run)
    if not matches:
        if held:
            return RunAdmission(Outcome.RELEASED, (), release_ops(kind, run))
        return RunAdmission(Outcome.UNTOUCHED)
    ops: list[Op] = []

    wanted = {LABEL_CONCURRENCY_GROUPED: CONCURRENCY_GROUPED}
    wanted.update({LABEL_CONCURRENCY_PREFIX + m.control.name: m.value for m in matches})
    _merge_map(ops, "labels", labels, wanted, stale_prefix=LABEL_CONCURRENCY_PREFIX)

    notes = {LABEL_CONCURRENCY_PREFIX + m.control.name: m.key for m in matches if m.hashed}
    # A priority already on the run (a reinvocation, or a user's) is kept.
    given = annotations if isinstance(annotations, Mapping) else {}
    notes.update(
        (ANNOTATION_PRIORITY_PREFIX + m.control.name, str(m.priority))
        for m in matches
        if m.priority is not None and ANNOTATION_PRIORITY_PREFIX + m.control.name not in given
    )
    pending = is_pending(kind, run)
    ours = isinstance(annotations, Mapping) and (
        annotations.get(ANNOTATION_PENDING_BY) == PENDING_BY_CONCURRENCY
    )
    # Kueue holds and starts it (tekton-kueue makes it pending): holding it too would let
    # whichever starts it first override the other.
    kueue = KUEUE_QUEUE_LABEL in _str_map(labels) and any(
        m.control.kueue is not KueueRuns.HOLD for m in matches
    )
    unpend = False
    if pending and ours and held and kueue:
        # The admission policy held it before anyone could tell Kueue's: as submitted.
        outcome, unpend = Outcome.KUEUE, True
    elif pending and ours:
        outcome = Outcome.ALREADY_PENDING
    elif pending:
        outcome = Outcome.AUTHOR_PENDING
    elif start_state_set(kind, run):
        outcome = Outcome.AUTHOR_STATE
    elif kueue:
        outcome = Outcome.KUEUE
    else:
        outcome = Outcome.MADE_PENDING
        notes[ANNOTATION_PENDING_BY] = PENDING_BY_CONCURRENCY
    _merge_map(ops, "annotations", annotations, notes)
    if held:  # decided now: the policy's mark goes
        ops.append(remove(pointer("metadata", "annotations", ANNOTATION_HELD_BY)))
    if unpend:
        ops += _unpend_ops(kind, run)
    if outcome is Outcome.MADE_PENDING:
        ops += _pending_ops(kind, run)
    return RunAdmission(outcome, matches, ops)


def policy_held(run: Any) -> bool:
    """Whether the admission policy held the run and no one has decided on it yet."""
    meta = run.get("metadata") if isinstance(run, Mapping) else None
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    return isinstance(annotations, Mapping) and (
        annotations.get(ANNOTATION_HELD_BY) == HELD_BY_POLICY
    )


def release_ops(kind: Kind, run: Mapping[str, Any]) -> list[Op]:
    """Undo what the admission policy did to a run no control selects: its marks, and the
    pending state it set (only when it set it: then the pending-by annotation is ours)."""
    meta = run.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    labels = meta.get("labels")
    labels = labels if isinstance(labels, Mapping) else {}
    annotations = meta.get("annotations")
    annotations = annotations if isinstance(annotations, Mapping) else {}
    ops: list[Op] = []
    if LABEL_CONCURRENCY_GROUPED in labels:
        ops.append(remove(pointer("metadata", "labels", LABEL_CONCURRENCY_GROUPED)))
    if ANNOTATION_HELD_BY in annotations:
        ops.append(remove(pointer("metadata", "annotations", ANNOTATION_HELD_BY)))
    if annotations.get(ANNOTATION_PENDING_BY) == PENDING_BY_CONCURRENCY:
        ops += _unpend_ops(kind, run)
    return ops


def _unpend_ops(kind: Kind, run: Mapping[str, Any]) -> list[Op]:
    """Undo the pending state the policy set: the pending-by mark and the spec fields."""
    ops = [remove(pointer("metadata", "annotations", ANNOTATION_PENDING_BY))]
    spec = run.get("spec")
    for name in run_control(kind).pending:
        if isinstance(spec, Mapping) and name in spec:
            ops.append(remove(pointer("spec", name)))
    return ops


def _merge_map(
    ops: list[Op],
    name: str,
    current: Any,
    wanted: Mapping[str, str],
    *,
    stale_prefix: str | None = None,
) -> None:
    """Ops that make ``metadata.<name>`` hold ``wanted`` (and drop stale keys with the
    prefix, e.g. a copied run's label for a control that no longer selects it)."""
    if not isinstance(current, Mapping):
        if wanted:
            ops.append(add(pointer("metadata", name), dict(wanted)))
        return
    for key, value in wanted.items():
        if current.get(key) != value:
            ops.append(add(pointer("metadata", name, key), value))
    if stale_prefix is not None:
        for key in sorted(current):
            if str(key).startswith(stale_prefix) and key not in wanted:
                ops.append(remove(pointer("metadata", name, str(key))))


def _pending_ops(kind: Kind, run: Mapping[str, Any]) -> list[Op]:
    """Hold the run: the engine's pending fields of ``spec`` (Tekton ``status:
    PipelineRunPending``, Argo ``suspend: true``)."""
    pending = run_control(kind).pending
    if not isinstance(run.get("spec"), Mapping):
        return [add("/spec", dict(pending))]
    return [add(pointer("spec", name), value) for name, value in pending.items()]
