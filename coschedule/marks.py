"""The webhook<->reconciler protocol, owned here alone: the labels and annotations the
webhook writes on a pod (its "marks"), the modes, the placeholder and claim names both
sides compute, the claim-template type, and the one encoder and parser of the marks.

Both processes import this module; no other module spells a mark. Pure: no I/O.
"""

from __future__ import annotations

import enum
import functools
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson

# Labels users and the MutatingWebhookConfiguration see.
LABEL_ENABLED = "coschedule.dev/enabled"  # namespace toggle (namespaceSelector)
LABEL_MODE = "coschedule.dev/mode"  # per-namespace or per-run override
LABEL_GROUP = "coschedule.dev/group"  # opt any pod into a run
LABEL_PLACEHOLDER = "coschedule.dev/placeholder"  # the mark: which placeholder a pod joins
LABEL_SKIP = "coschedule.dev/skip"  # on a claim: never group or rewrite it
# Per-namespace or per-run override of the config key isolation-scope (isolate-pipelinerun).
LABEL_ISOLATION_SCOPE = "coschedule.dev/isolation-scope"
# On a placeholder's pod: the tenant of its namespace (isolation scope tenant).
LABEL_TENANT = "coschedule.dev/tenant"

# Labels of the placeholder (Tekton's names, so Tekton users' dashboards keep working).
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
COMPONENT_AFFINITY_ASSISTANT = "affinity-assistant"
MANAGED_BY = "coschedule"
PLACEHOLDER_PREFIX = "affinity-assistant-"

# Annotations the webhook writes on a marked pod for the reconciler.
ANNOTATION_MODE = "coschedule.dev/mode"  # the effective mode of the pod's group
ANNOTATION_RUN = "coschedule.dev/run"  # the run identity value
ANNOTATION_RUN_LABEL = "coschedule.dev/run-label"  # which group label gave it
ANNOTATION_CLAIMS = "coschedule.dev/claims"  # claims the placeholder mounts (comma-separated)
ANNOTATION_TOPOLOGY_KEY = "coschedule.dev/topology-key"
ANNOTATION_CLAIM_TEMPLATES = "coschedule.dev/claim-templates"  # rewritten claim -> template
# Written only when not the default, so that the marks of namespace-scoped runs are as before:
ANNOTATION_ISOLATION_SCOPE = "coschedule.dev/isolation-scope"  # isolate-pipelinerun's scope
ANNOTATION_TENANT = "coschedule.dev/tenant"  # the namespace's tenant (isolation-tenant-label)


# Run concurrency control: the marks the webhook writes on a PipelineRun or Workflow.
# Per ConcurrencyControl: concurrency.coschedule.dev/<control>: <key, or its hash> (label),
# and, when the key had to be hashed, the key itself (annotation of the same name).
LABEL_CONCURRENCY_PREFIX = "concurrency.coschedule.dev/"
# On every run the webhook grouped: the reconciler watches only those (a label selector
# cannot match a key prefix).
LABEL_CONCURRENCY_GROUPED = "coschedule.dev/concurrency"
CONCURRENCY_GROUPED = "grouped"
# On a run the webhook made pending, until the reconciler starts or cancels it.
ANNOTATION_PENDING_BY = "coschedule.dev/pending-by"
PENDING_BY_CONCURRENCY = "concurrency"
# Put by the MutatingAdmissionPolicy ``coschedule-hold-runs`` (CEL, in the API server) on a
# run it held in a namespace that has a ConcurrencyControl, before the webhook decided: the
# webhook (or, when it was unreachable, the reconciler) labels it with its groups, or starts
# it when no control selects it, and removes this annotation.
ANNOTATION_HELD_BY = "coschedule.dev/held-by"
HELD_BY_POLICY = "admission-policy"
# On a PipelineRun the run webhook admitted started, whose placeholder the reconciler makes
# at once (the seed): when, RFC 3339. Tekton copies a run's annotations onto its TaskRuns
# and their pods, so every webhook replica sees on a run's first pod that its placeholder is
# on its way, not only the replica that admitted the run.
ANNOTATION_RUN_ADMITTED = "coschedule.dev/run-admitted-at"
# On a run held pending by a Queue or Replace control: why it waits (its place, the run ahead),
# written by the reconciler when that changes; removed when the run starts or is cancelled.
ANNOTATION_WAITING = "coschedule.dev/waiting"
# The same as data, for bots and UIs (JSON: control, key, position, the runs ahead and their
# states); written and removed with it.
ANNOTATION_WAITING_DATA = "coschedule.dev/waiting-data"
# Per Queue control with a priority: priority.coschedule.dev/<control>: <integer>, written at
# admission from the control's priority template; a higher one starts first. A user may
# change it on a waiting run (kubectl annotate --overwrite) to move it up or down.
ANNOTATION_PRIORITY_PREFIX = "priority.coschedule.dev/"
# Placement by node name (the `placement` key, `auto`): a pod whose placeholder is not bound
# yet waits behind this scheduling gate; the reconciler pins it to the placeholder's node and
# lifts the gate in one patch. A pinned pod names its node in the annotation, so the pin is
# told apart from a user's own `matchFields` and a pod left behind by a move is found.
GATE_PLACEHOLDER = "coschedule.dev/placeholder"
ANNOTATION_PINNED_NODE = "coschedule.dev/pinned-node"
# Put with that gate by the MutatingAdmissionPolicy ``coschedule-gate-pods`` (CEL, run by the
# API server itself, so never unreachable) on a pod placed by node name that the webhook has
# not marked yet. The webhook, when it answers, decides as ever (and drops the gate where it
# would not hold the pod); when it did not (an outage), the reconciler finds the pod by this
# label and no placeholder label, and marks it with the webhook's own decision.
LABEL_GATED_BY = "coschedule.dev/gated-by"
GATED_BY_POLICY = "admission-policy"
# On each volumeClaimTemplate of a placeholder: the original claim it stands for.
TEMPLATE_CLAIM = "coschedule.dev/claim"

# The marks every marked pod carries (the claim templates are optional).
MARK_ANNOTATIONS = (
    ANNOTATION_MODE,
    ANNOTATION_RUN,
    ANNOTATION_RUN_LABEL,
    ANNOTATION_CLAIMS,
    ANNOTATION_TOPOLOGY_KEY,
)
ALL_MARK_ANNOTATIONS = (
    *MARK_ANNOTATIONS,
    ANNOTATION_CLAIM_TEMPLATES,
    ANNOTATION_ISOLATION_SCOPE,
    ANNOTATION_TENANT,
)


class Mode(enum.StrEnum):
    """Modes (Tekton's words)."""

    DISABLED = "disabled"
    WORKSPACES = "workspaces"
    PIPELINERUNS = "pipelineruns"
    ISOLATE_PIPELINERUN = "isolate-pipelinerun"

    @classmethod
    def parse(cls, text: str) -> Mode | None:
        try:
            return cls(text.strip().lower())
        except ValueError:
            return None

    @property
    def per_run(self) -> bool:
        """Modes whose group is a whole run rather than a claim."""
        return self is Mode.PIPELINERUNS or self is Mode.ISOLATE_PIPELINERUN


class Placement(enum.StrEnum):
    """How a run's pods are tied to their placeholder (the `placement` key)."""

    # Pin by node name where it is safe: the pod's engine recreates a deleted, never-started
    # pod (a pod left pending on a node its placeholder left is deleted for it) and the
    # topology key is the hostname. Elsewhere, pod affinity.
    AUTO = "auto"
    POD_AFFINITY = "pod-affinity"  # every pod: a required pod-affinity term to the placeholder

    @classmethod
    def parse(cls, text: str) -> Placement | None:
        try:
            return cls(text.strip().lower())
        except ValueError:
            return None


PLACEMENT_CHOICES = ", ".join(p.value for p in Placement)


MODE_CHOICES = ", ".join(m.value for m in Mode)


class IsolationScope(enum.StrEnum):
    """Which other runs an ``isolate-pipelinerun`` run keeps off its node: those of its own
    namespace (``namespace``, Tekton's behaviour), those of its namespace and of every other
    tenant (``tenant``), or every other run (``cluster``)."""

    NAMESPACE = "namespace"
    TENANT = "tenant"
    CLUSTER = "cluster"

    @classmethod
    def parse(cls, text: str) -> IsolationScope | None:
        try:
            return cls(text.strip().lower())
        except ValueError:
            return None

    @property
    def cross_namespace(self) -> bool:
        """Whether the placeholder's required anti-affinity reaches other namespaces."""
        return self is not IsolationScope.NAMESPACE


SCOPE_CHOICES = ", ".join(s.value for s in IsolationScope)


@dataclass(frozen=True, slots=True)
class NamespaceInfo:
    """What the namespace cache knows of the request's namespace."""

    labels: Mapping[str, str]

    @property
    def enabled(self) -> bool:
        return self.labels.get(LABEL_ENABLED) == "true"


def run_identity(
    labels: Mapping[str, str], group_labels: tuple[str, ...]
) -> tuple[str, str] | None:
    """(label key, run) from the first group label present with a value."""
    for key in group_labels:
        value = labels.get(key)
        if value:
            return key, value
    return None


# ---- names both sides compute --------------------------------------------------------

_HEX_DIGITS = 10


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:_HEX_DIGITS]


@functools.lru_cache(maxsize=4096)  # the pods of one run ask for the same name
def run_placeholder(namespace: str, run: str) -> str:
    """The placeholder of a whole run (``pipelineruns``, ``isolate-pipelinerun``)."""
    return PLACEHOLDER_PREFIX + _digest(f"{namespace}/{run}")


@functools.lru_cache(maxsize=4096)
def claim_placeholder(namespace: str, claim: str) -> str:
    """The placeholder of a claim (``workspaces``)."""
    return PLACEHOLDER_PREFIX + _digest(f"{namespace}/pvc/{claim}")


def placeholder_claim(template: str, placeholder: str) -> str:
    """The claim the StatefulSet controller makes from a template for replica 0."""
    return f"{template}-{placeholder}-0"


def is_placeholder_claim(claim: str, placeholder: str | None = None) -> bool:
    """Whether ``claim`` is a claim a placeholder's template made (of ``placeholder`` when
    given; of any placeholder otherwise: a claim the webhook already rewrote)."""
    if placeholder is not None:
        return claim.endswith(f"-{placeholder}-0")
    return PLACEHOLDER_PREFIX in claim and claim.endswith("-0")


# ---- the claim templates -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClaimTemplate:
    """A placeholder ``volumeClaimTemplates`` entry: its name, the engine's claim it stands
    for, and the claim spec it copies."""

    name: str
    claim: str
    spec: Mapping[str, Any]


def encode_claim_templates(templates: Sequence[ClaimTemplate]) -> str:
    """The ``claim-templates`` annotation: {template: {claim, spec}}, keys sorted."""
    doc = {t.name: {"claim": t.claim, "spec": dict(t.spec)} for t in templates}
    return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS).decode()


def parse_claim_templates(text: Any) -> tuple[ClaimTemplate, ...] | str:
    """The ``claim-templates`` annotation back into templates (sorted by name); a str is
    the reason it is malformed."""
    try:
        doc = orjson.loads(text)
    except (orjson.JSONDecodeError, TypeError):
        return f"annotation {ANNOTATION_CLAIM_TEMPLATES} is not JSON"
    if not isinstance(doc, dict):
        return f"annotation {ANNOTATION_CLAIM_TEMPLATES} is not a JSON object"
    result = []
    for name, entry in sorted(doc.items()):
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("claim"), str)
            or not isinstance(entry.get("spec"), dict)
        ):
            return f"annotation {ANNOTATION_CLAIM_TEMPLATES}: entry {name!r} needs claim and spec"
        result.append(ClaimTemplate(str(name), entry["claim"], entry["spec"]))
    return tuple(result)


def template_metadata(template: ClaimTemplate) -> dict[str, Any]:
    """A volumeClaimTemplate's marks: its name, our managed-by label, the claim it stands for."""
    return {
        "name": template.name,
        "labels": {LABEL_MANAGED_BY: MANAGED_BY},
        "annotations": {TEMPLATE_CLAIM: template.claim or template.name},
    }


def statefulset_templates(sts: Mapping[str, Any]) -> dict[str, str]:
    """{template name: original claim} of a placeholder StatefulSet."""
    result: dict[str, str] = {}
    for template in (sts.get("spec") or {}).get("volumeClaimTemplates") or ():
        if not isinstance(template, dict):
            continue
        meta = template.get("metadata") or {}
        name = meta.get("name")
        if isinstance(name, str):
            original = (meta.get("annotations") or {}).get(TEMPLATE_CLAIM, name)
            result[name] = str(original)
    return result


# ---- the marks on a pod --------------------------------------------------------------


class Marks(NamedTuple):
    """What the webhook writes on a pod it groups: the placeholder label and annotations.
    (A NamedTuple: built on every admission, and a frozen dataclass is slower to build.)"""

    placeholder: str
    mode: Mode
    run: str
    run_label: str
    claims: tuple[str, ...]
    topology_key: str
    # The run's claim templates as the webhook decided them (volume co-location); None
    # when it followed an existing StatefulSet or did not rewrite.
    claim_templates: tuple[ClaimTemplate, ...] | None = None
    # isolate-pipelinerun's reach, and the tenant of the pod's namespace ("" when none).
    scope: IsolationScope = IsolationScope.NAMESPACE
    tenant: str = ""


@dataclass(frozen=True, slots=True)
class BadMark:
    """A pod whose marks cannot be used; skipped with a log line saying why."""

    namespace: str
    name: str
    placeholder: str
    reason: str


def encode(marks: Marks) -> dict[str, str]:
    """The annotations of ``marks`` (the placeholder is the label ``LABEL_PLACEHOLDER``)."""
    return encode_fields(
        marks.mode,
        marks.run,
        marks.run_label,
        marks.claims,
        marks.topology_key,
        marks.claim_templates,
        marks.scope,
        marks.tenant,
    )


def encode_fields(
    mode: Mode,
    run: str,
    run_label: str,
    claims: Sequence[str],
    topology_key: str,
    claim_templates: Sequence[ClaimTemplate] | None = None,
    scope: IsolationScope = IsolationScope.NAMESPACE,
    tenant: str = "",
) -> dict[str, str]:
    """``encode`` from the fields, for the admission hot path: no ``Marks`` to build.
    The scope and the tenant are written only when they say something: the marks of a
    namespace-scoped run without a tenant are what they were before either existed."""
    result = {
        ANNOTATION_MODE: str(mode),  # the value (StrEnum); ``.value`` is a slower property
        ANNOTATION_RUN: run,
        ANNOTATION_RUN_LABEL: run_label,
        ANNOTATION_CLAIMS: ",".join(claims),
        ANNOTATION_TOPOLOGY_KEY: topology_key,
    }
    if claim_templates is not None:
        result[ANNOTATION_CLAIM_TEMPLATES] = encode_claim_templates(claim_templates)
    if scope is not IsolationScope.NAMESPACE:
        result[ANNOTATION_ISOLATION_SCOPE] = str(scope)
    if tenant:
        result[ANNOTATION_TENANT] = tenant
    return result


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def parse(metadata: Mapping[str, Any]) -> Marks | BadMark:
    """The marks of a pod from its metadata (labels and annotations); malformed or
    inconsistent marks (a placeholder other than the one they name) -> ``BadMark``."""
    namespace = str(metadata.get("namespace") or "")
    name = str(metadata.get("name") or "")
    placeholder = _dict(metadata.get("labels")).get(LABEL_PLACEHOLDER)
    annotations = _dict(metadata.get("annotations"))

    def bad(reason: str) -> BadMark:
        return BadMark(namespace, name, str(placeholder or ""), reason)

    if not isinstance(placeholder, str) or not placeholder:
        return bad(f"label {LABEL_PLACEHOLDER} is empty")
    missing = [k for k in MARK_ANNOTATIONS if not isinstance(annotations.get(k), str)]
    if missing:
        return bad(f"annotation(s) missing: {', '.join(missing)}")
    mode = Mode.parse(annotations[ANNOTATION_MODE])
    if mode is None or mode is Mode.DISABLED:
        return bad(f"annotation {ANNOTATION_MODE}={annotations[ANNOTATION_MODE]!r} is not a mode")
    run = annotations[ANNOTATION_RUN]
    if not run or not annotations[ANNOTATION_RUN_LABEL] or not annotations[ANNOTATION_TOPOLOGY_KEY]:
        return bad(f"annotations {ANNOTATION_RUN}, run-label and topology-key must not be empty")
    claims = tuple(c.strip() for c in annotations[ANNOTATION_CLAIMS].split(",") if c.strip())
    if mode is Mode.WORKSPACES:
        if len(claims) != 1:
            return bad(f"mode workspaces needs exactly one claim, {ANNOTATION_CLAIMS} has {claims}")
        expected = claim_placeholder(namespace, claims[0])
    else:
        expected = run_placeholder(namespace, run)
    if placeholder != expected:
        return bad(f"placeholder {placeholder!r} is not {expected!r}, the name its marks give")
    templates: tuple[ClaimTemplate, ...] | None = None
    if (text := annotations.get(ANNOTATION_CLAIM_TEMPLATES)) is not None:
        parsed = parse_claim_templates(text)
        if isinstance(parsed, str):
            return bad(parsed)
        templates = parsed
    scope = IsolationScope.NAMESPACE
    if (text := annotations.get(ANNOTATION_ISOLATION_SCOPE)) is not None:
        parsed_scope = IsolationScope.parse(str(text))
        if parsed_scope is None:
            return bad(f"annotation {ANNOTATION_ISOLATION_SCOPE}={text!r} is not a scope")
        scope = parsed_scope
    tenant = annotations.get(ANNOTATION_TENANT)
    return Marks(
        placeholder=placeholder,
        mode=mode,
        run=run,
        run_label=annotations[ANNOTATION_RUN_LABEL],
        claims=claims,
        topology_key=annotations[ANNOTATION_TOPOLOGY_KEY],
        claim_templates=templates,
        scope=scope,
        tenant=tenant if isinstance(tenant, str) else "",
    )


def placeholder_of(metadata: Mapping[str, Any]) -> str:
    """The placeholder label of a marked pod ("" if absent)."""
    value = _dict(metadata.get("labels")).get(LABEL_PLACEHOLDER)
    return value if isinstance(value, str) else ""


def placeholder_labels(name: str) -> dict[str, str]:
    """The labels of a placeholder StatefulSet and its pod."""
    return {
        LABEL_COMPONENT: COMPONENT_AFFINITY_ASSISTANT,
        LABEL_INSTANCE: name,
        LABEL_MANAGED_BY: MANAGED_BY,
    }


def placeholder_selector(name: str) -> dict[str, str]:
    """What selects the placeholder's pod (and what a marked pod's affinity term matches)."""
    return {LABEL_COMPONENT: COMPONENT_AFFINITY_ASSISTANT, LABEL_INSTANCE: name}


def affinity_term(placeholder: str, topology_key: str) -> dict[str, Any]:
    """The required pod-affinity term that pins a marked pod to its placeholder."""
    return {
        "labelSelector": {
            "matchLabels": {
                LABEL_COMPONENT: COMPONENT_AFFINITY_ASSISTANT,
                LABEL_INSTANCE: placeholder,
            }
        },
        "topologyKey": topology_key,
    }


def term_placeholder(term: Any) -> str | None:
    """The placeholder an affinity term selects, if it is an affinity-assistant term."""
    if not isinstance(term, dict):
        return None
    selector = term.get("labelSelector")
    if not isinstance(selector, dict):
        return None
    labels = selector.get("matchLabels")
    if not isinstance(labels, dict) or labels.get(LABEL_COMPONENT) != COMPONENT_AFFINITY_ASSISTANT:
        return None
    instance = labels.get(LABEL_INSTANCE)
    return instance if isinstance(instance, str) else None


def managed_placeholder(labels: Mapping[str, Any]) -> str:
    """The placeholder a pod with these labels is the pod of, if we manage it; else ""."""
    if labels.get(LABEL_COMPONENT) != COMPONENT_AFFINITY_ASSISTANT:
        return ""
    if labels.get(LABEL_MANAGED_BY) != MANAGED_BY:
        return ""
    return str(labels.get(LABEL_INSTANCE) or "")
