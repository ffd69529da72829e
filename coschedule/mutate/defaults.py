"""Scheduling defaults merged into a pod at admission, the Shipwright way. Pure.

The rules (``coschedule.config.scheduling_defaults``) are parsed once at config load; this
runs on the admission hot path and copies nothing of the pod. The pod always wins.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from coschedule.config.scheduling_defaults import DEFAULT_SCHEDULER, DefaultsRule
from coschedule.wire import jsonpatch
from coschedule.wire import pod_fields as podview
from coschedule.wire.jsonpatch import Op


class Contribution(NamedTuple):
    """One default that a rule put into a pod: for reasons and ``explain``. (NamedTuples:
    built per admission, and a frozen dataclass is several times slower to build.)"""

    rule: int
    rule_label: str
    field: str  # nodeSelector | tolerations | schedulerName
    value: str  # "kubernetes.io/arch=arm64", "arch=arm64:NoSchedule", "arm-scheduler"


class MergedScheduling(NamedTuple):
    """The pod's scheduling fields as they will be stored. When nothing was merged these are
    the pod's own objects (not copies): read them, never change them. With no rules
    configured, ``scheduler_name`` is not read (None) and nodeSelector values are not
    checked: nothing uses them then."""

    node_selector: Mapping[str, str]
    tolerations: Sequence[Mapping[str, Any]]
    scheduler_name: str | None
    contributions: tuple[Contribution, ...] = ()


# --- merging (admission hot path) ---------------------------------------------------------


def _pod_node_selector(pod_spec: Mapping[str, Any]) -> Mapping[str, str] | None:
    value = podview.sub_object(pod_spec, "nodeSelector", "pod.spec")
    if value is not None:
        for k, v in value.items():
            if not isinstance(v, str):
                raise podview.MalformedPod(f"pod.spec.nodeSelector[{k!r}] must be a string")
    return value


def pod_tolerations(pod_spec: Mapping[str, Any]) -> list[Mapping[str, Any]] | None:
    """``spec.tolerations``, each an object whose ``key`` is a string or absent."""
    value = podview.sub_list(pod_spec, "tolerations", "pod.spec")
    if value is not None:
        for i, toleration in enumerate(value):
            if not isinstance(toleration, dict):
                raise podview.MalformedPod(f"pod.spec.tolerations[{i}] must be an object")
            key = toleration.get("key")
            if key is not None and not isinstance(key, str):
                raise podview.MalformedPod(f"pod.spec.tolerations[{i}].key must be a string")
    return value


_NO_SELECTOR: Mapping[str, str] = {}
_NO_TOLERATIONS: Sequence[Mapping[str, Any]] = ()


def merge_defaults(
    pod: Mapping[str, Any],
    namespace: str,
    rules: Sequence[DefaultsRule],
    *,
    spec_created: bool = False,
    labels: Mapping[str, str] | None = None,
    pod_spec: Mapping[str, Any] | None = None,
) -> tuple[list[Op], list[str], MergedScheduling]:
    """The ops that merge the matching rules into ``pod``, a reason per contributing rule,
    and the scheduling fields as they will be stored.

    ``spec_created``: an earlier op of the same patch already adds ``/spec`` (the pod had
    none), so fields go under it instead of creating it again. ``labels`` and ``pod_spec``:
    the pod's labels and spec when the caller has already read them.
    """
    if pod_spec is None:
        pod_spec = podview.spec(pod)
    own_tolerations = pod_tolerations(pod_spec)
    tolerations = own_tolerations if own_tolerations is not None else _NO_TOLERATIONS
    if not rules:  # the common case, on every admission: read only what the policy needs
        selector = podview.sub_object(pod_spec, "nodeSelector", "pod.spec")
        return [], [], MergedScheduling(selector or _NO_SELECTOR, tolerations, None)
    spec_value = pod.get("spec")
    own_selector = _pod_node_selector(pod_spec)
    scheduler = pod_spec.get("schedulerName")
    if scheduler is not None and not isinstance(scheduler, str):
        raise podview.MalformedPod("pod.spec.schedulerName must be a string")
    node_selector = own_selector if own_selector is not None else _NO_SELECTOR
    unchanged = MergedScheduling(node_selector, tolerations, scheduler)
    if labels is None:
        labels = podview.string_map(podview.metadata(pod), "labels")
    matching = [rule for rule in rules if rule.matches(namespace, labels)]
    if not matching:
        return [], [f"scheduling-defaults: none of the {len(rules)} rule(s) matches"], unchanged

    added = _contributions(matching, node_selector, tolerations, scheduler)
    if not added.contributions:
        return [], added.reasons, unchanged
    ops = _merge_ops(
        added,
        whole_spec=not isinstance(spec_value, dict) and not spec_created,
        own_selector=own_selector is not None,
        own_tolerations=own_tolerations is not None,
    )
    merged = MergedScheduling(
        {**node_selector, **added.node_selector} if added.node_selector else node_selector,
        [*tolerations, *added.tolerations] if added.tolerations else tolerations,
        added.scheduler_name if added.scheduler_name is not None else scheduler,
        tuple(added.contributions),
    )
    return ops, added.reasons, merged


class _Added(NamedTuple):
    """What the matching rules add to a pod, and a reason per rule."""

    node_selector: dict[str, str]
    tolerations: list[dict[str, Any]]
    scheduler_name: str | None
    contributions: list[Contribution]
    reasons: list[str]


def _contributions(
    matching: Sequence[DefaultsRule],
    node_selector: Mapping[str, str],
    tolerations: Sequence[Mapping[str, Any]],
    scheduler: str | None,
) -> _Added:
    """Apply the matching rules in order: each fills only what the pod and earlier rules
    left (nodeSelector by key, tolerations by key, schedulerName if unset or default)."""
    added_selector: dict[str, str] = {}
    added_tolerations: list[dict[str, Any]] = []
    tolerated = {t.get("key") or "" for t in tolerations}
    scheduler_taken = scheduler not in (None, "", DEFAULT_SCHEDULER)
    new_scheduler: str | None = None
    contributions: list[Contribution] = []
    reasons: list[str] = []
    for rule in matching:
        mine: list[Contribution] = []
        for key, value in rule.node_selector:
            if key not in node_selector and key not in added_selector:
                added_selector[key] = value
                mine.append(Contribution(rule.index, rule.label, "nodeSelector", f"{key}={value}"))
        keys_now: set[str] = set()
        for toleration in rule.tolerations:
            if toleration.key not in tolerated:
                added_tolerations.append(toleration.to_json())
                keys_now.add(toleration.key)
                mine.append(
                    Contribution(rule.index, rule.label, "tolerations", toleration.describe())
                )
        tolerated |= keys_now
        if rule.scheduler_name is not None and not scheduler_taken:
            scheduler_taken = True
            if rule.scheduler_name != scheduler:
                new_scheduler = rule.scheduler_name
                mine.append(
                    Contribution(rule.index, rule.label, "schedulerName", rule.scheduler_name)
                )
        if mine:
            what = "; ".join(f"{c.field} {c.value}" for c in mine)
            reasons.append(f"scheduling-defaults {rule.label}: merged {what}")
        else:
            reasons.append(
                f"scheduling-defaults {rule.label}: matches; the pod (or an earlier rule) "
                "already sets all it gives"
            )
        contributions.extend(mine)
    return _Added(added_selector, added_tolerations, new_scheduler, contributions, reasons)


def _merge_ops(
    added: _Added, *, whole_spec: bool, own_selector: bool, own_tolerations: bool
) -> list[Op]:
    """The JSONPatch ops adding ``added``: the whole spec when the pod has none, else each
    field, creating only what is absent."""
    ops: list[Op] = []
    if whole_spec:
        whole: dict[str, Any] = {}
        if added.node_selector:
            whole["nodeSelector"] = added.node_selector
        if added.tolerations:
            whole["tolerations"] = added.tolerations
        if added.scheduler_name is not None:
            whole["schedulerName"] = added.scheduler_name
        return [jsonpatch.add("/spec", whole)]
    if added.node_selector:
        if not own_selector:
            ops.append(jsonpatch.add("/spec/nodeSelector", dict(added.node_selector)))
        else:
            for key, value in added.node_selector.items():
                ops.append(jsonpatch.add(jsonpatch.pointer("spec", "nodeSelector", key), value))
    if added.tolerations:
        if not own_tolerations:
            ops.append(jsonpatch.add("/spec/tolerations", list(added.tolerations)))
        else:
            ops.extend(jsonpatch.add("/spec/tolerations/-", t) for t in added.tolerations)
    if added.scheduler_name is not None:
        ops.append(jsonpatch.add("/spec/schedulerName", added.scheduler_name))
    return ops
