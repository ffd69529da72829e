"""What an isolated run's placeholder keeps off its node: its required anti-affinity. Pure.

The webhook decides a run's scope (``mutate.isolation``) and marks its pods with it; the
reconciler writes these terms on the run's placeholder; ``explain`` shows them.

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
"""

from __future__ import annotations

from typing import Any

from coschedule.marks import (
    COMPONENT_AFFINITY_ASSISTANT,
    LABEL_COMPONENT,
    LABEL_TENANT,
    IsolationScope,
)


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
