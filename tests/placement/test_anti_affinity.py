"""Which runs an isolated run's placeholder keeps off its node, read as the scheduler reads
its required anti-affinity terms, per scope."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from coschedule.k8s.selectors import Requirement, Selector
from coschedule.marks import LABEL_TENANT, IsolationScope, placeholder_labels
from coschedule.placement import anti_affinity

HOST = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"


# ---- the terms, read as the scheduler reads them ---------------------------------------


def _selector(doc: dict[str, Any]) -> Selector:
    return Selector(
        tuple(doc.get("matchLabels", {}).items()),
        tuple(
            Requirement(e["key"], e["operator"], tuple(e.get("values", ())))
            for e in doc.get("matchExpressions", ())
        ),
    )


def term_matches(
    term: dict[str, Any], own_namespace: str, namespace: str, labels: dict[str, str]
) -> bool:
    """Whether a required anti-affinity term of a pod in ``own_namespace`` selects a pod in
    ``namespace`` with ``labels`` (Kubernetes: no namespaces and no namespaceSelector means
    the term's own namespace; ``namespaceSelector: {}`` every namespace)."""
    if "namespaceSelector" in term:
        assert term["namespaceSelector"] == {}, "only the empty selector is ours"
    elif namespace != own_namespace:
        return False
    return _selector(term["labelSelector"]).matches(labels)


def kept_off(scope: IsolationScope, tenant: str, own: str, other: tuple[str, str]) -> bool:
    terms = anti_affinity.required_terms(scope, tenant, HOST)
    namespace, other_tenant = other
    labels = placeholder_labels("affinity-assistant-0123456789")
    if other_tenant:
        labels[LABEL_TENANT] = other_tenant
    return any(term_matches(t, own, namespace, labels) for t in terms)


NAMESPACES = st.sampled_from(["ci", "ci-2", "team-b", "release"])
TENANTS = st.sampled_from(["", "a", "b"])


@given(
    scope=st.sampled_from(list(IsolationScope)),
    tenant=TENANTS,
    own=NAMESPACES,
    others=st.lists(st.tuples(NAMESPACES, TENANTS), max_size=8),
)
def test_the_terms_keep_off_exactly_what_the_scope_says(
    scope: IsolationScope, tenant: str, own: str, others: list[tuple[str, str]]
) -> None:
    for other in others:
        namespace, other_tenant = other
        if namespace == own:
            expected = True  # isolate-pipelinerun's own promise, in every scope
        elif scope is IsolationScope.CLUSTER:
            expected = True
        elif scope is IsolationScope.TENANT:
            # Another tenant, a placeholder without one, or a run with no tenant of its own.
            expected = not tenant or other_tenant != tenant
        else:
            expected = False
        assert kept_off(scope, tenant, own, other) is expected, (scope, tenant, own, other)


@given(tenant=TENANTS, own=NAMESPACES, other=st.tuples(NAMESPACES, TENANTS))
def test_widening_the_scope_never_lets_a_run_share_a_node_it_could_not(
    tenant: str, own: str, other: tuple[str, str]
) -> None:
    namespace = kept_off(IsolationScope.NAMESPACE, tenant, own, other)
    per_tenant = kept_off(IsolationScope.TENANT, tenant, own, other)
    cluster = kept_off(IsolationScope.CLUSTER, tenant, own, other)
    assert namespace <= per_tenant <= cluster


def test_namespace_scope_is_the_term_placeholders_always_had() -> None:
    assert anti_affinity.required_terms(IsolationScope.NAMESPACE, "a", ZONE) == [
        {
            "labelSelector": {"matchLabels": {"app.kubernetes.io/component": "affinity-assistant"}},
            "topologyKey": ZONE,
        }
    ]


def test_cluster_scope_selects_every_namespace() -> None:
    [term] = anti_affinity.required_terms(IsolationScope.CLUSTER, "", HOST)
    assert term["namespaceSelector"] == {}
    assert term["topologyKey"] == HOST


def test_tenant_scope_repels_other_tenants_everywhere_and_its_namespace_as_before() -> None:
    own, others = anti_affinity.required_terms(IsolationScope.TENANT, "a", HOST)
    assert own == anti_affinity.required_terms(IsolationScope.NAMESPACE, "a", HOST)[0]
    assert others["namespaceSelector"] == {}
    assert others["labelSelector"]["matchExpressions"] == [
        {"key": LABEL_TENANT, "operator": "NotIn", "values": ["a"]}
    ]
    # Without a tenant of its own, the run is alone among every namespace's runs.
    assert anti_affinity.required_terms(IsolationScope.TENANT, "", HOST) == (
        anti_affinity.required_terms(IsolationScope.CLUSTER, "", HOST)
    )
