"""Isolation scope: which scope an ``isolate-pipelinerun`` run gets. Pure.

What each scope keeps off a run's node (the placeholder's required anti-affinity, which the
reconciler writes) is ``coschedule.placement.anti_affinity``. Kubernetes allows a required
anti-affinity across namespaces only with a per-node topology key;
``config.settings.isolation_problem`` says so, at load for the cluster config and at
admission for a label's override.

The scope comes from the run's pod label ``coschedule.dev/isolation-scope``, else its
namespace's label, else the cluster config (as the mode does); a namespace's tenant from the
namespace label named by config key ``isolation-tenant-label``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from coschedule.config.settings import Settings
from coschedule.marks import LABEL_ISOLATION_SCOPE, IsolationScope

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
