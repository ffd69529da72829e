"""Scheduling defaults (config key ``scheduling-defaults``), merged the Shipwright way. Pure.

Admins give, per namespace list and/or pod label selector, defaults for ``nodeSelector``,
``tolerations`` and ``schedulerName``. The pod always wins:

- ``nodeSelector`` merges by key; a key the pod (or an earlier rule) sets is kept.
- ``tolerations`` merge by key; a key the pod (or an earlier rule) tolerates is kept, with
  all of the pod's tolerations of that key. The empty key (``operator: Exists``, "tolerate
  everything") is a key of its own: it neither blocks nor is blocked by a named key.
- ``schedulerName`` applies only where the pod has none or ``default-scheduler``.

Matching rules apply in order; later rules fill only what earlier ones (and the pod) left.
Rules are parsed here once, at config load, into frozen objects; ``merge_defaults``
(``coschedule.mutate.defaults``) runs on the admission hot path and copies nothing of the pod.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from coschedule.config import ConfigError
from coschedule.k8s.names import (
    valid_dns_label,
    valid_dns_subdomain,
    valid_label_key,
    valid_label_value,
)
from coschedule.k8s.selectors import OPERATORS, Requirement, Selector
from coschedule.marks import LABEL_PLACEHOLDER

KEY = "scheduling-defaults"
DEFAULT_SCHEDULER = "default-scheduler"

RULE_FIELDS = ("namespaces", "selector", "nodeSelector", "tolerations", "schedulerName")
SELECTOR_FIELDS = ("matchLabels", "matchExpressions")
EXPRESSION_FIELDS = ("key", "operator", "values")
TOLERATION_FIELDS = ("key", "operator", "value", "effect", "tolerationSeconds")
TOLERATION_OPERATORS = ("Equal", "Exists")
TOLERATION_EFFECTS = ("", "NoSchedule", "PreferNoSchedule", "NoExecute")


# --- the parsed rules ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""
    toleration_seconds: int | None = None

    def to_json(self) -> dict[str, Any]:
        """A fresh dict each time: patch values must not share state with the config."""
        out: dict[str, Any] = {}
        if self.key:
            out["key"] = self.key
        out["operator"] = self.operator
        if self.value:
            out["value"] = self.value
        if self.effect:
            out["effect"] = self.effect
        if self.toleration_seconds is not None:
            out["tolerationSeconds"] = self.toleration_seconds
        return out

    def describe(self) -> str:
        text = self.key or "*"
        if self.operator == "Equal":
            text += f"={self.value}"
        if self.effect:
            text += f":{self.effect}"
        if self.toleration_seconds is not None:
            text += f" for {self.toleration_seconds}s"
        return text


@dataclass(frozen=True, slots=True)
class DefaultsRule:
    """One entry of ``scheduling-defaults``; ``index`` is its position in the list."""

    index: int
    namespaces: tuple[str, ...] | None = None
    selector: Selector | None = None
    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    scheduler_name: str | None = None
    # ``rule 0 (namespaces ci,build; selector team=ml)``: how reasons name it (computed).
    label: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        scope = []
        if self.namespaces is not None:
            scope.append("namespaces " + ",".join(self.namespaces))
        if self.selector is not None:
            scope.append("selector " + self.selector.describe())
        label = f"rule {self.index} ({'; '.join(scope) or 'every pod'})"
        object.__setattr__(self, "label", label)

    def matches(self, namespace: str, labels: Mapping[str, str]) -> bool:
        if self.namespaces is not None and namespace not in self.namespaces:
            return False
        return self.selector is None or self.selector.matches(labels)


# --- parsing (config load only) -------------------------------------------------------------


def _fail(where: str, message: str) -> ConfigError:
    return ConfigError(f'config key "{KEY}": {where}: {message}')


def _check_fields(where: str, value: Mapping[Any, Any], allowed: tuple[str, ...]) -> None:
    unknown = [str(k) for k in value if k not in allowed]
    if unknown:
        raise _fail(where, f"unknown field(s) {', '.join(unknown)}; allowed: {', '.join(allowed)}")


def _string(where: str, value: Any) -> str:
    if not isinstance(value, str):
        raise _fail(where, f"must be a string, not {_yaml_type(value)} (quote it in YAML)")
    return value


def _yaml_type(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "a number", float: "a number", list: "a list"}.get(
        type(value), "a mapping" if isinstance(value, dict) else type(value).__name__
    )


def _label_key(where: str, value: Any) -> str:
    key = _string(where, value)
    if not valid_label_key(key):
        raise _fail(where, f"{key!r} is not a valid label key")
    return key


def _label_value(where: str, value: Any) -> str:
    text = _string(where, value)
    if not valid_label_value(text):
        raise _fail(where, f"{text!r} is not a valid label value")
    return text


def _string_map(where: str, value: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, dict):
        raise _fail(where, f"must be a mapping of label keys to values, not {_yaml_type(value)}")
    return tuple(
        (_label_key(f"{where} key", k), _label_value(f"{where}[{k}]", v)) for k, v in value.items()
    )


def parse_selector(where: str, value: Any) -> Selector:
    """A Kubernetes LabelSelector, validated as the API server would."""
    if not isinstance(value, dict):
        raise _fail(where, f"must be a LabelSelector mapping, not {_yaml_type(value)}")
    _check_fields(where, value, SELECTOR_FIELDS)
    labels = value.get("matchLabels")
    match_labels = () if labels is None else _string_map(f"{where}.matchLabels", labels)
    raw_expressions = value.get("matchExpressions")
    if raw_expressions is None:
        raw_expressions = []
    if not isinstance(raw_expressions, list):
        raise _fail(f"{where}.matchExpressions", "must be a list")
    expressions = []
    for i, expression in enumerate(raw_expressions):
        at = f"{where}.matchExpressions[{i}]"
        if not isinstance(expression, dict):
            raise _fail(at, "must be a mapping with key, operator and values")
        _check_fields(at, expression, EXPRESSION_FIELDS)
        key = _label_key(f"{at}.key", expression.get("key"))
        operator = expression.get("operator")
        if operator not in OPERATORS:
            raise _fail(
                f"{at}.operator",
                f"{operator!r} is not a selector operator; use {', '.join(OPERATORS)}",
            )
        values = expression.get("values")
        if values is None:
            values = []
        if not isinstance(values, list):
            raise _fail(f"{at}.values", "must be a list")
        if operator in ("In", "NotIn") and not values:
            raise _fail(f"{at}.values", f"operator {operator} needs at least one value")
        if operator in ("Exists", "DoesNotExist") and values:
            raise _fail(f"{at}.values", f"operator {operator} takes no values")
        expressions.append(
            Requirement(
                key,
                operator,
                tuple(_label_value(f"{at}.values[{j}]", v) for j, v in enumerate(values)),
            )
        )
    for key in [k for k, _ in match_labels] + [e.key for e in expressions]:
        if key == LABEL_PLACEHOLDER:
            # The webhook sets it itself: selecting on it would change the outcome between
            # an admission and its reinvocation.
            raise _fail(where, f"cannot select on {LABEL_PLACEHOLDER}: coschedule sets it")
    return Selector(match_labels, tuple(expressions))


def parse_toleration(where: str, value: Any) -> Toleration:
    """A Kubernetes toleration, validated as the API server would."""
    if not isinstance(value, dict):
        raise _fail(where, f"must be a toleration mapping, not {_yaml_type(value)}")
    _check_fields(where, value, TOLERATION_FIELDS)
    key = value.get("key")
    key = "" if key is None else _string(f"{where}.key", key)
    if key and not valid_label_key(key):
        raise _fail(f"{where}.key", f"{key!r} is not a valid taint key")
    operator = value.get("operator")
    operator = "Equal" if operator is None or operator == "" else operator
    if operator not in TOLERATION_OPERATORS:
        raise _fail(
            f"{where}.operator",
            f"{operator!r} is not valid; use {' or '.join(TOLERATION_OPERATORS)}",
        )
    raw_value = value.get("value")
    text = "" if raw_value is None else _label_value(f"{where}.value", raw_value)
    if operator == "Exists" and text:
        raise _fail(f"{where}.value", "must be empty when operator is Exists")
    if not key and operator != "Exists":
        raise _fail(f"{where}.operator", "must be Exists when key is empty (tolerate everything)")
    effect = value.get("effect")
    effect = "" if effect is None else effect
    if effect not in TOLERATION_EFFECTS:
        raise _fail(
            f"{where}.effect",
            f"{effect!r} is not a taint effect; use NoSchedule, PreferNoSchedule, NoExecute or "
            "leave it empty (all effects)",
        )
    seconds = value.get("tolerationSeconds")
    if seconds is not None:
        if isinstance(seconds, bool) or not isinstance(seconds, int):
            raise _fail(f"{where}.tolerationSeconds", "must be a whole number of seconds")
        if effect != "NoExecute":
            raise _fail(f"{where}.tolerationSeconds", "is only valid with effect NoExecute")
    return Toleration(key, operator, text, effect, seconds)


def _parse_rule(index: int, value: Any) -> DefaultsRule:
    where = f"rule {index}"
    if not isinstance(value, dict):
        raise _fail(where, f"must be a mapping, not {_yaml_type(value)}")
    _check_fields(where, value, RULE_FIELDS)
    namespaces: tuple[str, ...] | None = None
    if "namespaces" in value:
        raw = value["namespaces"]
        if not isinstance(raw, list) or not raw:
            raise _fail(f"{where}.namespaces", "must be a non-empty list (or left out: any)")
        for i, name in enumerate(raw):
            if not isinstance(name, str) or not valid_dns_label(name):
                raise _fail(f"{where}.namespaces[{i}]", f"{name!r} is not a namespace name")
        namespaces = tuple(raw)
    selector = (
        parse_selector(f"{where}.selector", value["selector"]) if "selector" in value else None
    )
    node_selector: tuple[tuple[str, str], ...] = ()
    if value.get("nodeSelector") is not None:
        node_selector = _string_map(f"{where}.nodeSelector", value["nodeSelector"])
    tolerations: tuple[Toleration, ...] = ()
    if value.get("tolerations") is not None:
        raw = value["tolerations"]
        if not isinstance(raw, list):
            raise _fail(f"{where}.tolerations", "must be a list of tolerations")
        tolerations = tuple(
            parse_toleration(f"{where}.tolerations[{i}]", t) for i, t in enumerate(raw)
        )
    scheduler_name: str | None = None
    if value.get("schedulerName") is not None:
        scheduler_name = _string(f"{where}.schedulerName", value["schedulerName"])
        if not valid_dns_subdomain(scheduler_name):
            raise _fail(f"{where}.schedulerName", f"{scheduler_name!r} is not a valid name")
    if not node_selector and not tolerations and scheduler_name is None:
        raise _fail(where, "sets none of nodeSelector, tolerations, schedulerName")
    return DefaultsRule(index, namespaces, selector, node_selector, tolerations, scheduler_name)


def parse_scheduling_defaults(text: str) -> tuple[DefaultsRule, ...]:
    """The rules of ``scheduling-defaults`` (a YAML list); ConfigError on any bad rule."""
    import yaml  # config load only, never on the admission path

    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f'config key "{KEY}": not YAML: {exc}') from None
    if loaded is None:
        return ()
    if not isinstance(loaded, list):
        raise ConfigError(
            f'config key "{KEY}": expected a YAML list of rules such as '
            '"- namespaces: [ci]\\n  nodeSelector: {kubernetes.io/arch: arm64}"'
        )
    return tuple(_parse_rule(i, rule) for i, rule in enumerate(loaded))
