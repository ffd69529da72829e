"""Isolation scope: which other runs an ``isolate-pipelinerun`` run keeps off its node. Pure.

``isolate-pipelinerun`` gives each run's placeholder a required anti-affinity to other
placeholders. Its scope says how far that reaches; each scope keeps off everything the one
before it does, so widening a scope never lets a run share a node it could not share before:

- ``namespace`` (the default, Tekton's behaviour): the runs of its own namespace. The term
  has no namespace selector, so a placeholder built under it is what it always was.
- ``tenant``: those, and the runs of every other tenant. A namespace's tenant is the value of
  the namespace label named by config key ``isolation-tenant-label``; the placeholder carries
  it as ``coschedule.dev/tenant`` and repels, in every namespace, the placeholders whose value
  is not its own (``NotIn``: a placeholder without the label too). A namespace without the
  label (or with an empty value) is a tenant of its own: its runs keep every other
  namespace's runs off their node, as with ``cluster``.
- ``cluster``: every other run, whatever its namespace (``namespaceSelector: {}``).

Kubernetes allows a required anti-affinity across namespaces only with a per-node topology
key; ``config.settings.isolation_problem`` says so, at load for the cluster config and at
admission for a label's override.

The scope comes from the run's pod label ``coschedule.dev/isolation-scope``, else its
namespace's label, else the cluster config (as the mode does).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from coschedule.config.settings import Settings
from coschedule.marks import (
    COMPONENT_AFFINITY_ASSISTANT,
    LABEL_COMPONENT,
    LABEL_ISOLATION_SCOPE,
    LABEL_TENANT,
    IsolationScope,
)

POD_LABEL = "pod label"
NAMESPACE_LABEL = "namespace label"
CLUSTER_CONFIG = "cluster config"


@dataclass(frozen=True, slots=True)
class ScopeChoice:
    scope: IsolationScope
    source: str  # POD_LABEL, NAMESPACE_LABEL or CLUSTER_CONFIG
    value: str = ""  # the label's value as written (a label's choice)

    @property
    def reason(self) -> str:
        """Where the scope comes from, for ``explain`` (built only when asked)."""
        if self.source == CLUSTER_CONFIG:
            return f'cluster config "isolation-scope: {self.scope}"'
        return f"{self.source} {LABEL_ISOLATION_SCOPE}={self.value}"


@dataclass(frozen=True, slots=True)
class InvalidScope:
    source: str
    value: str


def cluster_scope(settings: Settings) -> ScopeChoice:
    """The choice when neither the run nor its namespace is labelled (built once per
    settings by the caller: it is the answer for most runs)."""
    return ScopeChoice(settings.isolation_scope, CLUSTER_CONFIG)


def choose_scope(
    pod_labels: Mapping[str, str],
    namespace_labels: Mapping[str, str] | None,
    cluster: ScopeChoice,
) -> ScopeChoice | InvalidScope:
    """The run's own label wins, then its namespace's, then the cluster configuration
    (``cluster_scope``)."""
    if (value := pod_labels.get(LABEL_ISOLATION_SCOPE)) is not None:
        return _labelled(POD_LABEL, value)
    if namespace_labels is not None and (
        (value := namespace_labels.get(LABEL_ISOLATION_SCOPE)) is not None
    ):
        return _labelled(NAMESPACE_LABEL, value)
    return cluster


def _labelled(source: str, value: str) -> ScopeChoice | InvalidScope:
    scope = IsolationScope.parse(value)
    if scope is None:
        return InvalidScope(source, value)
    return ScopeChoice(scope, source, value)


def tenant_of(namespace_labels: Mapping[str, str] | None, settings: Settings) -> str:
    """The tenant of a namespace: its ``isolation-tenant-label`` value ("" when not
    configured, unknown or empty: a tenant of its own)."""
    key = settings.isolation_tenant_label
    if not key or namespace_labels is None:
        return ""
    value = namespace_labels.get(key)
    return value if isinstance(value, str) else ""


def _term(topology_key: str, *, everywhere: bool, not_tenant: str = "") -> dict[str, Any]:
    selector: dict[str, Any] = {"matchLabels": {LABEL_COMPONENT: COMPONENT_AFFINITY_ASSISTANT}}
    if not_tenant:
        selector["matchExpressions"] = [
            {"key": LABEL_TENANT, "operator": "NotIn", "values": [not_tenant]}
        ]
    term: dict[str, Any] = {"labelSelector": selector, "topologyKey": topology_key}
    if everywhere:
        term["namespaceSelector"] = {}
    return term


def required_terms(scope: IsolationScope, tenant: str, topology_key: str) -> list[dict[str, Any]]:
    """The required anti-affinity terms of an isolated run's placeholder."""
    if scope is IsolationScope.NAMESPACE:
        return [_term(topology_key, everywhere=False)]
    if scope is IsolationScope.TENANT and tenant:
        return [
            _term(topology_key, everywhere=False),
            _term(topology_key, everywhere=True, not_tenant=tenant),
        ]
    return [_term(topology_key, everywhere=True)]


def describe(scope: IsolationScope, tenant: str) -> str:
    """What the scope keeps off a run's node, for ``explain`` and the docs' examples."""
    if scope is IsolationScope.NAMESPACE:
        return "one run per node among the runs of its namespace"
    if scope is IsolationScope.CLUSTER:
        return "one run per node among the runs of every namespace"
    if tenant:
        return (
            f"one run per node among the runs of its namespace, and no run of a tenant other "
            f"than {tenant!r} on its node"
        )
    return (
        "its namespace has no tenant, so it is a tenant of its own: one run per node among "
        "the runs of every namespace"
    )
