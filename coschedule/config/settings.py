"""The cluster-wide configuration: one frozen object, built from the config folder and env.

Every key of the ``coschedule-config`` ConfigMap is a file in the config folder (that is how
a ConfigMap volume looks) and can also come from ``COSCHEDULE_<KEY>``; the folder wins.
Parsing is pure: ``parse_settings(raw)`` takes the merged ``{key: text}`` mapping, so the
Tekton flag matrix and every key's validation are tested without touching the disk.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TypeVar

from coschedule.config import ConfigError as ConfigError
from coschedule.config.policy import (
    POLICY_KEYS,
    PolicyMode,
    PolicySettings,
    check_policy,
    parse_policy,
)
from coschedule.config.scheduling_defaults import DefaultsRule, parse_scheduling_defaults
from coschedule.k8s.constants import HOSTNAME
from coschedule.k8s.names import valid_dns_subdomain, valid_label_key
from coschedule.k8s.quantity import quantity
from coschedule.marks import (
    LABEL_GROUP,
    PLACEMENT_CHOICES,
    SCOPE_CHOICES,
    IsolationScope,
    Mode,
    Placement,
)

# Ours first, then each engine's run label: config shares a floor with coschedule.engines
# and does not import it; tests/test_engines.py holds these equal to its run_label entries.
DEFAULT_GROUP_LABELS: tuple[str, ...] = (
    LABEL_GROUP,
    "tekton.dev/pipelineRun",
    "workflows.argoproj.io/workflow",
    "buildrun.shipwright.io/name",
)
DEFAULT_TOPOLOGY_KEY = HOSTNAME
DEFAULT_PLACEHOLDER_IMAGE = "registry.k8s.io/pause:3.10"
DEFAULT_PLACEHOLDER_RESOURCES: Mapping[str, Mapping[str, str]] = {
    "requests": {"cpu": "1m", "memory": "8Mi"},
    "limits": {"memory": "16Mi"},
}
DEFAULT_IDLE_GRACE_SECONDS = 300
DEFAULT_STUCK_GRACE_SECONDS = 30
# How long a run's first pod's admission may wait for its placeholder, made a moment ago,
# to be bound (then it is pinned at admission, not gated). The seed's chain (StatefulSet ->
# its pod -> bound -> the webhook's watch) measured on the quiet real stack: see
# docs/benchmarks.md "The first pod sooner". The cap keeps it well inside the webhook's
# 5 s timeoutSeconds, beside the other wait a request may have instead (caches, claims: 2 s).
DEFAULT_PLACEHOLDER_BIND_WAIT_SECONDS = 2.0
MAX_PLACEHOLDER_BIND_WAIT_SECONDS = 3.0

# The keys this version understands. An unknown key is an error rather than silently
# ignored: a typo in a ConfigMap must not fall back to a default nobody asked for.
KNOWN_KEYS: frozenset[str] = frozenset(
    {
        "coschedule",
        "disable-affinity-assistant",
        "topology-key",
        "placement",
        "group-labels",
        "placeholder-image",
        "placeholder-resources",
        "placeholder-priority-class",
        "idle-grace-seconds",
        "stuck-grace-seconds",
        "placeholder-bind-wait-seconds",
        "rewrite-claims",
        "group-shared-claims",
        "scheduling-defaults",
        "isolation-scope",
        "isolation-tenant-label",
        *POLICY_KEYS,
    }
)

ENV_PREFIX = "COSCHEDULE_"
# Where read_raw_config puts the COSCHEDULE_* variables that name no key, for parse_settings
# to refuse as it refuses an unknown key in the folder (no file can have this name).
_UNKNOWN_ENV = "/unknown-variables"

_T = TypeVar("_T")

# An image reference as the container runtime parses it (distribution's reference grammar):
# [registry[:port]/]path[:tag][@digest], the path in lower case.
_IMAGE_PATH = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE_HOST_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_IMAGE_RE = re.compile(
    rf"^(?:(?:{_IMAGE_HOST_PART}(?:\.{_IMAGE_HOST_PART})*|\[[0-9a-fA-F:]+\])(?::[0-9]+)?/)?"
    rf"{_IMAGE_PATH}(?:/{_IMAGE_PATH})*"
    r"(?::[\w][\w.-]{0,127})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$"
)
# Resource names a pod may request: the standard ones, hugepages-<size>, and extended
# resources (a domain-qualified name such as example.com/device).
_STANDARD_RESOURCES = ("cpu", "memory", "ephemeral-storage")
_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_EXTENDED_RESOURCE_RE = re.compile(rf"^[a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?/{_LABEL_NAME}$")
# COSCHEDULE_* variables that are not config keys and never a typo: the links Kubernetes
# injects for the Services of the namespace (coschedule-webhook: COSCHEDULE_WEBHOOK_SERVICE_HOST,
# COSCHEDULE_WEBHOOK_PORT_443_TCP, ...), and the project's own test and benchmark switches.
_SERVICE_LINK_RE = re.compile(
    r"^COSCHEDULE(_[A-Z0-9_]+)?_(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?"
    r"|PORT(_\d+_(TCP|UDP|SCTP)(_(PROTO|PORT|ADDR))?)?)$"
)
TOOL_VARIABLE_PREFIXES = (
    "COSCHEDULE_E2E_",
    "COSCHEDULE_REAL",
    "COSCHEDULE_BENCH_",
    "COSCHEDULE_STUCK_FIGURES",
    "COSCHEDULE_FAULTS_",
    "COSCHEDULE_ARTIFACT_",
    "COSCHEDULE_IMAGEKIT",
)


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the webhook and the reconciler read from the cluster configuration."""

    mode: Mode = Mode.WORKSPACES
    topology_key: str = DEFAULT_TOPOLOGY_KEY
    # How pods are tied to their placeholder: by node name where that is safe (`auto`), or
    # by a required pod-affinity term (`pod-affinity`, the only way before issue 20).
    placement: Placement = Placement.AUTO
    group_labels: tuple[str, ...] = DEFAULT_GROUP_LABELS
    placeholder_image: str = DEFAULT_PLACEHOLDER_IMAGE
    placeholder_resources: Mapping[str, Mapping[str, str]] = field(
        default_factory=lambda: DEFAULT_PLACEHOLDER_RESOURCES
    )
    placeholder_priority_class: str = ""
    idle_grace_seconds: int = DEFAULT_IDLE_GRACE_SECONDS
    # How long a run's pod may stay Unschedulable because of the run's node before the
    # reconciler moves the run (when that loses nothing) or explains why not.
    stuck_grace_seconds: int = DEFAULT_STUCK_GRACE_SECONDS
    # How long the webhook may hold a run's pod's admission for its placeholder, on its way
    # but not bound yet, to be bound (then pinned at admission); 0: never, gate at once.
    placeholder_bind_wait_seconds: float = DEFAULT_PLACEHOLDER_BIND_WAIT_SECONDS
    # Claim rewrite (opt-in): the run's engine-made unbound claims become the placeholder's
    # volumeClaimTemplates. Off (the default), the placeholder mounts the engine's claims:
    # one volume per workspace whatever the binding mode. It needs the reconciler to build
    # the StatefulSet that owns the new claims; without a cluster ``serve`` turns it off.
    rewrite_claims: bool = False
    # ReadWriteMany/ReadOnlyMany claims (shared caches) are not grouped unless this is on.
    group_shared_claims: bool = False
    # Why the mode is what it is, for ``explain`` and the startup log.
    mode_reason: str = "default"
    # Admins' nodeSelector/tolerations/schedulerName defaults, merged into matching pods.
    scheduling_defaults: tuple[DefaultsRule, ...] = ()
    # The mode (off, warn, deny) of each hardening policy rule.
    policy: PolicySettings = field(default_factory=PolicySettings)
    # Which other runs an isolate-pipelinerun run keeps off its node (overridable by the
    # label coschedule.dev/isolation-scope on a namespace or a run), and the namespace label
    # whose value names a namespace's tenant ("" when not configured).
    isolation_scope: IsolationScope = IsolationScope.NAMESPACE
    isolation_tenant_label: str = ""


def _parse_bool(key: str, text: str) -> bool:
    value = text.strip().lower()
    if value in ("true", "1", "yes", "on"):
        return True
    if value in ("false", "0", "no", "off", ""):
        return False
    raise ConfigError(f'config key "{key}": {text.strip()!r} is not a boolean (true or false)')


def resolve_mode(raw: Mapping[str, str]) -> tuple[Mode, str]:
    """Tekton's flag matrix: ``disable-affinity-assistant`` present selects the migration column.

    Returns the effective mode and a sentence saying which keys decided it.
    """
    coschedule_text = raw.get("coschedule")
    if coschedule_text is None or not coschedule_text.strip():
        coschedule = Mode.WORKSPACES
        coschedule_given = False
    else:
        parsed = Mode.parse(coschedule_text)
        if parsed is None:
            raise ConfigError(
                f'config key "coschedule": {coschedule_text.strip()!r} is not a mode; '
                f"use one of {', '.join(m.value for m in Mode)}"
            )
        coschedule = parsed
        coschedule_given = True

    disable_text = raw.get("disable-affinity-assistant")
    if disable_text is None or not disable_text.strip():  # empty: absent, as every key
        source = 'key "coschedule"' if coschedule_given else "default"
        return coschedule, f"{source}: {coschedule.value}"

    disable = _parse_bool("disable-affinity-assistant", disable_text)
    pair = (
        f'"disable-affinity-assistant: {str(disable).lower()}" '
        f'with "coschedule: {coschedule.value}"'
    )
    if not disable:
        if coschedule is Mode.WORKSPACES:
            return coschedule, f"{pair} (migration column): workspaces"
        raise ConfigError(
            f"invalid combination {pair}: while the deprecated key "
            f'"disable-affinity-assistant" is set, "coschedule: {coschedule.value}" needs '
            '"disable-affinity-assistant: true"; better, remove "disable-affinity-assistant"'
        )
    if coschedule is Mode.WORKSPACES:
        return Mode.DISABLED, f"{pair} (migration column): disabled"
    return coschedule, f"{pair} (migration column): {coschedule.value}"


def _parse_group_labels(text: str) -> tuple[str, ...]:
    labels = tuple(part.strip() for part in text.split(",") if part.strip())
    if not labels:
        raise ConfigError('config key "group-labels": empty; list at least one label key')
    for label in labels:
        if not valid_label_key(label):
            raise ConfigError(f'config key "group-labels": {label!r} is not a valid label key')
    if len(set(labels)) != len(labels):
        raise ConfigError('config key "group-labels": a label key is listed twice')
    return labels


def _parse_resources(text: str) -> Mapping[str, Mapping[str, str]]:
    import yaml  # only at config load, never on the admission path

    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f'config key "placeholder-resources": not YAML: {exc}') from None
    if not isinstance(loaded, dict) or not loaded:
        raise ConfigError(
            'config key "placeholder-resources": expected a mapping such as '
            '"requests: {cpu: 1m, memory: 8Mi}"'
        )
    result: dict[str, dict[str, str]] = {}
    for section, values in loaded.items():
        if section not in ("requests", "limits"):
            raise ConfigError(
                f'config key "placeholder-resources": unknown section {section!r} '
                "(use requests and limits)"
            )
        if not isinstance(values, dict):
            raise ConfigError(f'config key "placeholder-resources": {section} must be a mapping')
        parsed: dict[str, str] = {}
        for name, amount in values.items():
            _check_resource_name(section, str(name))
            quantity_text = str(amount).strip()
            amount_value = quantity(quantity_text)
            if amount_value is None:
                raise ConfigError(
                    f'config key "placeholder-resources": {section}.{name}: '
                    f"{quantity_text!r} is not a Kubernetes quantity"
                )
            if amount_value < 0:
                raise ConfigError(
                    f'config key "placeholder-resources": {section}.{name}: '
                    f"{quantity_text!r} is negative"
                )
            parsed[str(name)] = quantity_text
        result[section] = parsed
    _check_requests_within_limits(result)
    return result


def _overcommit_allowed(name: str) -> bool:
    """The API server's rule: only native resources other than hugepages may be overcommitted."""
    return "/" not in name and not name.startswith("hugepages-")


def _check_requests_within_limits(resources: Mapping[str, Mapping[str, str]]) -> None:
    """What the API server would refuse in every placeholder pod, refused once at load."""
    requests, limits = resources.get("requests", {}), resources.get("limits", {})
    for section, values in resources.items():
        for name, text in values.items():
            amount = quantity(text)
            if "/" in name and amount is not None and amount != amount.to_integral_value():
                raise ConfigError(
                    f'config key "placeholder-resources": {section}.{name}: {text!r} is not '
                    "a whole number (an extended resource counts devices)"
                )
    named = set(requests) | set(limits)
    if any(n.startswith("hugepages-") for n in named) and not named & {"cpu", "memory"}:
        raise ConfigError(
            'config key "placeholder-resources": hugepages need a cpu or memory request or limit '
            "beside them (the API server refuses the pod)"
        )
    for name, text in requests.items():
        limit_text = limits.get(name)
        if limit_text is None:
            if not _overcommit_allowed(name):
                raise ConfigError(
                    f'config key "placeholder-resources": requests.{name}: {text!r} needs '
                    f"limits.{name} equal to it ({name} cannot be overcommitted)"
                )
            continue
        request, limit = quantity(text), quantity(limit_text)
        assert request is not None  # each quantity is checked by _parse_resources
        assert limit is not None
        if request > limit:
            raise ConfigError(
                f'config key "placeholder-resources": limits.{name}: {limit_text!r} is below '
                f"requests.{name} {text!r}; a limit must be at least the request"
            )
        if request != limit and not _overcommit_allowed(name):
            raise ConfigError(
                f'config key "placeholder-resources": requests.{name}: {text!r} must equal '
                f"limits.{name} {limit_text!r} ({name} cannot be overcommitted)"
            )


def _parse_image(text: str) -> str:
    image = text.strip()
    if len(image) > 512 or not _IMAGE_RE.match(image):
        raise ConfigError(
            f'config key "placeholder-image": {image[:100]!r} is not an image reference '
            "(registry/path:tag or @sha256:..., the path in lower case)"
        )
    return image


def _check_resource_name(section: str, name: str) -> None:
    if (
        name in _STANDARD_RESOURCES
        or (name.startswith("hugepages-") and quantity(name.removeprefix("hugepages-")) is not None)
        or (_EXTENDED_RESOURCE_RE.match(name) and not name.startswith("kubernetes.io/"))
    ):
        return
    raise ConfigError(
        f'config key "placeholder-resources": {section}.{name}: not a resource name (use '
        f"{', '.join(_STANDARD_RESOURCES)}, hugepages-<size> or a domain-qualified extended "
        "resource such as example.com/device)"
    )


def _parse_topology_key(text: str) -> str:
    key = text.strip()
    if not valid_label_key(key):
        raise ConfigError(f'config key "topology-key": {key!r} is not a valid label key')
    return key


def _parse_placement(text: str) -> Placement:
    placement = Placement.parse(text)
    if placement is None:
        raise ConfigError(
            f'config key "placement": {text.strip()!r} is not one of {PLACEMENT_CHOICES}'
        )
    return placement


def _parse_isolation_scope(text: str) -> IsolationScope:
    scope = IsolationScope.parse(text)
    if scope is None:
        raise ConfigError(
            f'config key "isolation-scope": {text.strip()!r} is not a scope; use one of '
            f"{SCOPE_CHOICES}"
        )
    return scope


def _parse_tenant_label(text: str) -> str:
    key = text.strip()
    if key and not valid_label_key(key):
        raise ConfigError(f'config key "isolation-tenant-label": {key!r} is not a valid label key')
    return key


def isolation_problem(scope: IsolationScope, topology_key: str, tenant_label: str) -> str | None:
    """Why ``scope`` cannot be used with these settings, naming the keys; None if it can.

    Kubernetes' rule (the inter-pod affinity design): a required anti-affinity term across
    namespaces only with a per-node topology key, or one run would keep the runs of every
    namespace out of a whole zone. Scope tenant needs the namespace label naming tenants."""
    if scope.cross_namespace and topology_key != HOSTNAME:
        return (
            "that scope keeps runs of other namespaces off a run's topology domain, which "
            f'Kubernetes allows only per node, and config key "topology-key" is '
            f"{topology_key!r}, not {HOSTNAME}"
        )
    if scope is IsolationScope.TENANT and not tenant_label:
        return (
            'that scope needs config key "isolation-tenant-label" (the namespace '
            "label whose value names a namespace's tenant), which is not set"
        )
    return None


def _check_isolation(scope: IsolationScope, topology_key: str, tenant_label: str) -> None:
    if (problem := isolation_problem(scope, topology_key, tenant_label)) is not None:
        fix = (
            f'set "topology-key: {HOSTNAME}"'
            if scope.cross_namespace and topology_key != HOSTNAME
            else 'set "isolation-tenant-label"'
        )
        raise ConfigError(
            f'invalid combination: config key "isolation-scope" is {scope.value}, but {problem}. '
            f'Fix: {fix}, or "isolation-scope: namespace"'
        )


def _parse_seconds(key: str, text: str) -> int:
    try:
        seconds = int(text.strip())
    except ValueError:
        raise ConfigError(f'config key "{key}": {text.strip()!r} is not a whole number') from None
    if seconds < 0:
        raise ConfigError(f'config key "{key}": must be 0 or more')
    return seconds


def _parse_bind_wait(text: str) -> float:
    key = "placeholder-bind-wait-seconds"
    try:
        seconds = float(text.strip())
    except ValueError:
        raise ConfigError(f'config key "{key}": {text.strip()!r} is not a number') from None
    if not 0 <= seconds <= MAX_PLACEHOLDER_BIND_WAIT_SECONDS:  # also refuses nan and inf
        raise ConfigError(
            f'config key "{key}": {seconds:g} is not between 0 and '
            f"{MAX_PLACEHOLDER_BIND_WAIT_SECONDS:g} (seconds; the webhook's timeout is 5 s)"
        )
    return seconds


def parse_settings(raw: Mapping[str, str]) -> Settings:
    """Build settings from ``{key: text}``; raise ConfigError naming every offending key.

    Each key is checked on its own and all the problems are reported together, so a
    ConfigMap with three mistakes is fixed in one round, not three.
    """
    errors: list[str] = []

    def check(parse: Callable[[], _T]) -> _T | None:
        try:
            return parse()
        except ConfigError as exc:
            errors.append(str(exc))
            return None

    unknown = sorted(key for key in raw if key not in KNOWN_KEYS and key not in _UNKNOWN_ENV)
    if unknown:
        errors.append(
            f"unknown config key(s): {', '.join(unknown)}; known keys are "
            f"{', '.join(sorted(KNOWN_KEYS))}"
        )
    if raw.get(_UNKNOWN_ENV):
        errors.append(
            f"unknown {ENV_PREFIX}* variable(s): {raw[_UNKNOWN_ENV]}; a key's variable is "
            f"{ENV_PREFIX} + the key in upper case with _ for - (the mode's is "
            f"{ENV_PREFIX}COSCHEDULE, topology-key's {ENV_PREFIX}TOPOLOGY_KEY)"
        )
    kwargs: dict[str, object] = {}
    if (resolved := check(lambda: resolve_mode(raw))) is not None:
        kwargs["mode"], kwargs["mode_reason"] = resolved
    if (topology := raw.get("topology-key")) is not None and topology.strip():
        kwargs["topology_key"] = check(lambda: _parse_topology_key(topology))
    if (placement := raw.get("placement")) is not None and placement.strip():
        kwargs["placement"] = check(lambda: _parse_placement(placement))
    if (labels := raw.get("group-labels")) is not None:
        kwargs["group_labels"] = check(lambda: _parse_group_labels(labels))
    if (text := raw.get("placeholder-image")) is not None and text.strip():
        kwargs["placeholder_image"] = check(partial(_parse_image, text))
    if (resources := raw.get("placeholder-resources")) is not None and resources.strip():
        kwargs["placeholder_resources"] = check(lambda: _parse_resources(resources))
    if (priority := raw.get("placeholder-priority-class")) is not None:
        kwargs["placeholder_priority_class"] = check(lambda: _parse_priority_class(priority))
    for key in ("idle-grace-seconds", "stuck-grace-seconds"):
        if (seconds := raw.get(key)) is not None and seconds.strip():
            kwargs[key.replace("-", "_")] = check(partial(_parse_seconds, key, seconds))
    if (wait := raw.get("placeholder-bind-wait-seconds")) is not None and wait.strip():
        kwargs["placeholder_bind_wait_seconds"] = check(partial(_parse_bind_wait, wait))
    for key, attr in (
        ("rewrite-claims", "rewrite_claims"),
        ("group-shared-claims", "group_shared_claims"),
    ):
        if (flag := raw.get(key)) is not None and flag.strip():
            kwargs[attr] = check(partial(_parse_bool, key, flag))
    valid_policy: dict[str, str] = {}
    for key in POLICY_KEYS:
        if key in raw and check(partial(parse_policy, {key: raw[key]})) is not None:
            valid_policy[key] = raw[key]
    policy = parse_policy(valid_policy)
    kwargs["policy"] = policy
    if (text := raw.get("scheduling-defaults")) is not None and text.strip():
        rules = check(lambda: parse_scheduling_defaults(text))
        if rules is not None and len(valid_policy) == sum(k in raw for k in POLICY_KEYS):
            # Only against the policy as written: a broken policy key is already reported.
            check(lambda: _check_defaults_against_policy(rules, policy))
        kwargs["scheduling_defaults"] = rules
    scope: IsolationScope | None = IsolationScope.NAMESPACE
    if (scope_text := raw.get("isolation-scope")) is not None and scope_text.strip():
        scope = check(partial(_parse_isolation_scope, scope_text))
        kwargs["isolation_scope"] = scope
    tenant_label: str | None = ""
    if (label_text := raw.get("isolation-tenant-label")) is not None:
        tenant_label = check(partial(_parse_tenant_label, label_text))
        kwargs["isolation_tenant_label"] = tenant_label
    topology_key = kwargs.get("topology_key", DEFAULT_TOPOLOGY_KEY)
    if scope is not None and tenant_label is not None and isinstance(topology_key, str):
        # Only when each key is valid on its own: a broken one is already reported.
        check(partial(_check_isolation, scope, topology_key, tenant_label))
    if errors:
        raise ConfigError("; ".join(errors) if len(errors) == 1 else _numbered(errors))
    return Settings(**kwargs)  # type: ignore[arg-type]


def _numbered(errors: list[str]) -> str:
    return f"{len(errors)} config problems: " + " ".join(
        f"({n}) {error};" for n, error in enumerate(errors, 1)
    ).rstrip(";")


def _parse_priority_class(text: str) -> str:
    name = text.strip()
    if name and not valid_dns_subdomain(name):
        raise ConfigError(f'config key "placeholder-priority-class": {name!r} is not a valid name')
    return name


def _check_defaults_against_policy(rules: tuple[DefaultsRule, ...], policy: PolicySettings) -> None:
    """A default that a deny-mode policy refuses would refuse every pod it matches."""
    for rule in rules:
        findings = check_policy(
            dict(rule.node_selector), [t.to_json() for t in rule.tolerations], None, policy
        )
        for finding in findings:
            if finding.mode is PolicyMode.DENY:
                field = finding.field.removeprefix("spec.")
                raise ConfigError(
                    f'invalid combination: config key "scheduling-defaults" {rule.label} sets '
                    f'{field}, which "{finding.deny_rule}: deny" refuses, so every pod it '
                    "matches would be denied; remove it from the rule or relax the policy"
                )


def env_to_key(name: str) -> str | None:
    """``COSCHEDULE_TOPOLOGY_KEY`` -> ``topology-key``; None for other variables."""
    if not name.startswith(ENV_PREFIX) or len(name) == len(ENV_PREFIX):
        return None
    return name[len(ENV_PREFIX) :].lower().replace("_", "-")


def read_raw_config(config_dir: Path | None, environ: Mapping[str, str]) -> dict[str, str]:
    """Merge ``COSCHEDULE_*`` variables and the config folder; the folder wins.

    Files whose names start with ``.`` are skipped: a ConfigMap volume keeps its data behind
    ``..data`` and timestamped ``..2026_…`` folders next to the key symlinks.
    Unknown keys from the folder are kept so that ``parse_settings`` can refuse them.
    """
    raw: dict[str, str] = {}
    unknown: list[str] = []
    for name, value in sorted(environ.items()):
        key = env_to_key(name)
        if key is None:
            continue
        if key in KNOWN_KEYS:
            raw[key] = value
        # Kubernetes injects COSCHEDULE_SERVICE_HOST and friends into pods of a namespace
        # with a Service named "coschedule..."; the tests' and benchmarks' switches are ours.
        elif not _SERVICE_LINK_RE.match(name) and not name.startswith(TOOL_VARIABLE_PREFIXES):
            unknown.append(name)
    if unknown:
        raw[_UNKNOWN_ENV] = ", ".join(unknown)  # refused by parse_settings, named
    if config_dir is not None and config_dir.is_dir():
        for entry in sorted(config_dir.iterdir()):
            # "_example"-style keys document a ConfigMap (Tekton ships them); skip them.
            if entry.name.startswith((".", "_")) or not entry.is_file():
                continue
            raw[entry.name] = entry.read_text(encoding="utf-8")
    return raw


def load_settings(config_dir: Path | None, environ: Mapping[str, str] | None = None) -> Settings:
    return parse_settings(read_raw_config(config_dir, os.environ if environ is None else environ))
