"""The shipped RBAC, as the API server's authorizer sees it: each process may do what it
needs and nothing else (SubjectAccessReview against the real RBAC authorizer)."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import E2E
from tests.e2e.install import RECONCILER_SA, SYSTEM_NAMESPACE, WEBHOOK_SA

pytestmark = pytest.mark.e2e

# (verb, group, resource, namespace or "" for cluster-wide / all namespaces)
Check = tuple[str, str, str, str]

WEBHOOK_ALLOWED: list[Check] = [
    ("list", "", "namespaces", ""),
    ("watch", "", "namespaces", ""),
    ("list", "", "persistentvolumeclaims", ""),
    ("watch", "apps", "statefulsets", ""),
    ("list", "", "persistentvolumes", ""),
    ("watch", "", "persistentvolumes", ""),
    ("list", "coschedule.dev", "concurrencycontrols", ""),
    ("watch", "coschedule.dev", "concurrencycontrols", ""),
]
WEBHOOK_DENIED: list[Check] = [
    ("delete", "", "persistentvolumes", ""),
    # Run concurrency control: the webhook reads controls and never writes runs.
    ("patch", "coschedule.dev", "concurrencycontrols/status", "team-a"),
    ("create", "coschedule.dev", "concurrencycontrols", "team-a"),
    ("update", "coschedule.dev", "concurrencycontrols", "team-a"),
    ("patch", "tekton.dev", "pipelineruns", "team-a"),
    ("list", "tekton.dev", "pipelineruns", ""),
    ("patch", "argoproj.io", "workflows", "team-a"),
    ("create", "", "pods", "team-a"),
    ("patch", "apps", "statefulsets", "team-a"),
    ("get", "", "secrets", SYSTEM_NAMESPACE),
    ("list", "", "secrets", ""),
    ("delete", "", "persistentvolumeclaims", "team-a"),
    ("update", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", ""),
]
RECONCILER_ALLOWED: list[Check] = [
    ("watch", "", "pods", ""),
    ("delete", "", "pods", "team-a"),
    ("patch", "", "pods", "team-a"),  # releases a pod held by our gate (placement auto)
    ("watch", "", "nodes", ""),
    ("create", "apps", "statefulsets", "team-a"),
    ("delete", "apps", "statefulsets", "team-a"),
    ("get", "tekton.dev", "pipelineruns", "team-a"),
    ("get", "argoproj.io", "workflows", "team-a"),
    ("update", "coordination.k8s.io", "leases", SYSTEM_NAMESPACE),
    ("create", "", "events", "team-a"),
    ("get", "", "persistentvolumes", ""),
    ("patch", "", "persistentvolumeclaims", "team-a"),  # releases our claims after teardown
    # Run concurrency control: watch grouped runs and controls, start/cancel runs by patch.
    ("list", "tekton.dev", "pipelineruns", ""),
    ("watch", "tekton.dev", "pipelineruns", ""),
    ("patch", "tekton.dev", "pipelineruns", "team-a"),
    ("list", "argoproj.io", "workflows", ""),
    ("watch", "argoproj.io", "workflows", ""),
    ("patch", "argoproj.io", "workflows", "team-a"),
    ("list", "coschedule.dev", "concurrencycontrols", ""),
    ("watch", "coschedule.dev", "concurrencycontrols", ""),
    ("patch", "coschedule.dev", "concurrencycontrols/status", "team-a"),
]
RECONCILER_DENIED: list[Check] = [
    ("delete", "", "persistentvolumes", ""),
    ("get", "", "secrets", "team-a"),
    ("list", "", "secrets", ""),
    ("create", "", "pods", "team-a"),
    ("update", "", "nodes", ""),
    ("patch", "", "nodes", ""),
    ("delete", "", "nodes", ""),
    ("create", "coordination.k8s.io", "leases", "default"),
    ("delete", "tekton.dev", "pipelineruns", "team-a"),
    ("update", "tekton.dev", "pipelineruns", "team-a"),
    ("create", "tekton.dev", "pipelineruns", "team-a"),
    ("delete", "argoproj.io", "workflows", "team-a"),
    ("update", "argoproj.io", "workflows", "team-a"),
    ("create", "argoproj.io", "workflows", "team-a"),
    ("patch", "coschedule.dev", "concurrencycontrols", "team-a"),
    ("delete", "coschedule.dev", "concurrencycontrols", "team-a"),
    ("update", "tekton.dev", "pipelineruns/status", "team-a"),
    ("patch", "argoproj.io", "workflows/status", "team-a"),
    ("create", "rbac.authorization.k8s.io", "clusterrolebindings", ""),
    ("impersonate", "", "serviceaccounts", ""),
]


def allowed(e2e: E2E, sa: str, check: Check) -> bool:
    verb, group, resource, namespace = check
    resource, _, subresource = resource.partition("/")
    attributes = {"verb": verb, "group": group, "resource": resource}
    if subresource:
        attributes["subresource"] = subresource
    if namespace:
        attributes["namespace"] = namespace
    review = e2e.api.request(
        "POST",
        "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": f"system:serviceaccount:{SYSTEM_NAMESPACE}:{sa}",
                "groups": [
                    "system:serviceaccounts",
                    f"system:serviceaccounts:{SYSTEM_NAMESPACE}",
                    "system:authenticated",
                ],
                "resourceAttributes": attributes,
            },
        },
    )
    assert review is not None
    return bool((review.get("status") or {}).get("allowed"))


@pytest.mark.parametrize(
    ("sa", "may", "may_not"),
    [
        (WEBHOOK_SA, WEBHOOK_ALLOWED, WEBHOOK_DENIED),
        (RECONCILER_SA, RECONCILER_ALLOWED, RECONCILER_DENIED),
    ],
)
def test_service_account_has_least_privilege(
    e2e: E2E, sa: str, may: list[Check], may_not: list[Check]
) -> None:
    missing = [check for check in may if not allowed(e2e, sa, check)]
    excess = [check for check in may_not if allowed(e2e, sa, check)]
    assert not missing, f"{sa} lacks what it needs: {missing}"
    assert not excess, f"{sa} may do more than it needs: {excess}"
