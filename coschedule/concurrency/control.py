"""A ``ConcurrencyControl`` object -> a frozen ``Control``, with the CRD schema's checks.

The API server validates controls with the CRD's schema and CEL rules; these checks mirror
them so that ``explain`` (offline) and a cache fed by an older CRD refuse what the API server
would, with the same field names in the message.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from coschedule.concurrency.names import API_VERSION, KIND, MAX_CONTROL_NAME
from coschedule.concurrency.selector import BadSelector, parse_selector
from coschedule.concurrency.template import BadTemplate, Template, parse_template
from coschedule.engines import (
    KUEUE_QUEUE_LABEL,
    RUN_ENGINES,
    SLOTTED,
    Kind,
    KueueRuns,
    Order,
    Overflow,
    Strategy,
)
from coschedule.k8s.selectors import Selector

DEFAULT_KINDS = frozenset(RUN_ENGINES)  # every run engine
SPEC_FIELDS = frozenset(
    {
        "selector",
        "kinds",
        "key",
        "strategy",
        "maxRunning",
        "order",
        "maxPending",
        "overflow",
        "maxWaitSeconds",
        "priority",
        "kueue",
    }
)
MAX_PENDING = 100_000
MAX_WAIT_SECONDS = 31_536_000  # a year


class BadControl(ValueError):
    """The control is invalid; the message names the field."""


# The CRD's bound (its schema's maximum): the parser refuses what the API server would.
MAX_RUNNING = 1000


@dataclass(frozen=True, slots=True)
class Control:
    namespace: str
    name: str
    selector: Selector
    kinds: frozenset[Kind]
    key: Template
    strategy: Strategy
    max_running: int = 1
    order: Order = Order.OLDEST_FIRST
    max_pending: int | None = None  # Queue: how many runs of a group may wait
    overflow: Overflow = Overflow.CANCEL_NEWEST  # which waiting run goes past maxPending
    max_wait_seconds: int | None = None  # Queue, Replace: a waiting run is cancelled after
    priority: Template | None = None  # Queue: a run's priority (an integer; else 0)
    kueue: KueueRuns = KueueRuns.IGNORE  # runs Kueue admits (kueue.x-k8s.io/queue-name)

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    def holds(self, kind: Kind, labels: Mapping[str, str]) -> bool:
        """This control applies to a run of ``kind`` with ``labels`` (a run Kueue admits
        only when the control says ``kueue: Group`` or ``Hold``)."""
        if self.kueue is KueueRuns.IGNORE and KUEUE_QUEUE_LABEL in labels:
            return False
        return kind in self.kinds and self.selector.matches(labels)


def parse_control(obj: Mapping[str, Any], namespace: str | None = None) -> Control:
    if obj.get("kind", KIND) != KIND:
        raise BadControl(f"kind must be {KIND}, not {obj.get('kind')!r}")
    if obj.get("apiVersion", API_VERSION) != API_VERSION:
        raise BadControl(f"apiVersion must be {API_VERSION}, not {obj.get('apiVersion')!r}")
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str) or not meta["name"]:
        raise BadControl("metadata.name is required")
    name = str(meta["name"])
    if len(name) > MAX_CONTROL_NAME:
        raise BadControl(
            f"metadata.name must be at most {MAX_CONTROL_NAME} characters: it becomes the "
            "name part of the label concurrency.coschedule.dev/<name>"
        )
    ns = str(meta.get("namespace") or namespace or "default")
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise BadControl("spec is required")
    unknown = set(spec) - SPEC_FIELDS
    if unknown:
        raise BadControl(f"spec has unknown field(s) {sorted(unknown)}")
    if "selector" not in spec:
        raise BadControl("spec.selector is required ({} selects every run in the namespace)")
    try:
        selector = parse_selector(spec["selector"])
    except BadSelector as exc:
        raise BadControl(str(exc)) from None
    kinds = _kinds(spec.get("kinds"))
    key_text = spec.get("key", "")
    if not isinstance(key_text, str):
        raise BadControl("spec.key must be a string")
    try:
        key = parse_template(key_text)
    except BadTemplate as exc:
        raise BadControl(str(exc)) from None
    raw_strategy = spec.get("strategy")
    if raw_strategy is None:
        raise BadControl(f"spec.strategy is required: one of {_choices(Strategy)}")
    try:
        strategy = Strategy(raw_strategy)
    except ValueError:
        raise BadControl(
            f"spec.strategy: {raw_strategy!r} is not one of {_choices(Strategy)}"
        ) from None
    max_running = spec.get("maxRunning", 1)
    if (
        not isinstance(max_running, int)
        or isinstance(max_running, bool)
        or not 1 <= max_running <= MAX_RUNNING
    ):
        raise BadControl(
            f"spec.maxRunning must be an integer from 1 to {MAX_RUNNING}, not {max_running!r}"
        )
    raw_order = spec.get("order")
    order = Order.OLDEST_FIRST
    if raw_order is not None:
        if strategy is not Strategy.QUEUE:
            raise BadControl("spec.order applies to strategy Queue only: remove it or use Queue")
        try:
            order = Order(raw_order)
        except ValueError:
            raise BadControl(f"spec.order: {raw_order!r} is not one of {_choices(Order)}") from None
    max_pending = _bounded(spec, "maxPending", 0, MAX_PENDING)
    if max_pending is not None and strategy is not Strategy.QUEUE:
        raise BadControl(
            "spec.maxPending applies to strategy Queue only (Replace keeps one run waiting): "
            "remove it or use strategy: Queue"
        )
    raw_overflow = spec.get("overflow")
    overflow = Overflow.CANCEL_NEWEST
    if raw_overflow is not None:
        if max_pending is None:
            raise BadControl("spec.overflow needs spec.maxPending: set both, or remove overflow")
        try:
            overflow = Overflow(raw_overflow)
        except ValueError:
            raise BadControl(
                f"spec.overflow: {raw_overflow!r} is not one of {_choices(Overflow)}"
            ) from None
    max_wait = _bounded(spec, "maxWaitSeconds", 1, MAX_WAIT_SECONDS)
    if max_wait is not None and strategy not in SLOTTED:
        raise BadControl(
            "spec.maxWaitSeconds applies to strategies Queue and Replace only (the others "
            "never keep a run waiting): remove it or use strategy: Queue or Replace"
        )
    priority = None
    if "priority" in spec:
        if strategy is not Strategy.QUEUE:
            raise BadControl(
                "spec.priority applies to strategy Queue only (the others start the newest "
                "or the oldest): remove it or use strategy: Queue"
            )
        if not isinstance(spec["priority"], str):
            raise BadControl("spec.priority must be a string (a template)")
        try:
            priority = parse_template(spec["priority"], "spec.priority")
        except BadTemplate as exc:
            raise BadControl(str(exc)) from None
    raw_kueue = spec.get("kueue", KueueRuns.IGNORE.value)
    try:
        kueue = KueueRuns(raw_kueue)
    except ValueError:
        raise BadControl(f"spec.kueue: {raw_kueue!r} is not one of {_choices(KueueRuns)}") from None
    return Control(
        ns,
        name,
        selector,
        kinds,
        key,
        strategy,
        max_running,
        order,
        max_pending,
        overflow,
        max_wait,
        priority,
        kueue,
    )


def _bounded(spec: Mapping[str, Any], name: str, low: int, high: int) -> int | None:
    value = spec.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise BadControl(f"spec.{name} must be an integer from {low} to {high}, not {value!r}")
    return value


def _kinds(raw: Any) -> frozenset[Kind]:
    if raw is None:
        return DEFAULT_KINDS
    if not isinstance(raw, list) or not raw:
        raise BadControl(f"spec.kinds must be a non-empty list of {_choices(Kind)}")
    kinds: set[Kind] = set()
    for i, item in enumerate(raw):
        try:
            kinds.add(Kind(item))
        except ValueError:
            raise BadControl(f"spec.kinds[{i}]: {item!r} is not one of {_choices(Kind)}") from None
    return frozenset(kinds)


def _choices(enum_type: Any) -> str:
    return ", ".join(member.value for member in enum_type)
