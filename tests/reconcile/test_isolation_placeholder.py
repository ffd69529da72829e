"""The placeholder an isolated run gets in each isolation scope, from the marks the webhook
wrote; and that the default scope leaves every placeholder as it was (no drift on upgrade)."""

from __future__ import annotations

from typing import Any

import pytest

from coschedule.config.settings import Settings
from coschedule.k8s.constants import REQUIRED
from coschedule.marks import LABEL_ISOLATION_SCOPE, LABEL_TENANT, IsolationScope, Mode
from coschedule.placement import anti_affinity
from coschedule.reconcile.placeholder import group_spec, pod_template, template_hash
from tests.reconcile.pods import marked_pod, parsed

TEAM = "example.com/team"
HOST = "kubernetes.io/hostname"

# The pod-template hashes of these groups as computed by the code before isolation scopes
# existed: a placeholder built in the default scope must not drift from them. (The
# workspaces and pipelineruns ones as recomputed when their placeholders traded the
# preferred anti-affinity for a topology spread constraint, one intended drift.)
BEFORE = {
    (Mode.WORKSPACES, "tekton-taskrun"): "5e77006ab56a4a9c",
    (Mode.PIPELINERUNS, "tekton-taskrun"): "46241544ff6c2883",
    (Mode.ISOLATE_PIPELINERUN, "tekton-taskrun"): "835510e94477a68c",
    (Mode.ISOLATE_PIPELINERUN, "argo-workflow-pod"): "333f829e2de39f3e",
}


def template(
    settings: Settings,
    fixture: str = "tekton-taskrun",
    namespace_labels: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    pod = parsed(
        marked_pod(
            fixture,
            settings.mode,
            settings=settings,
            namespace_labels=namespace_labels,
            labels=labels,
        )
    )
    group = group_spec(pod.namespace, pod.marks.placeholder, [pod])
    assert group is not None
    return pod_template(group, settings)


@pytest.mark.parametrize(("mode", "fixture"), sorted(BEFORE))
@pytest.mark.parametrize(
    "config",
    [
        {},
        # A tenant label configured, the namespace without it: still nothing changes.
        {"isolation_tenant_label": TEAM},
        {"isolation_scope": IsolationScope.NAMESPACE, "isolation_tenant_label": TEAM},
    ],
)
def test_the_default_scope_drifts_no_placeholder(
    mode: Mode, fixture: str, config: dict[str, Any]
) -> None:
    settings = Settings(mode=mode, **config)
    assert template_hash(template(settings, fixture, namespace_labels={})) == BEFORE[mode, fixture]


def required(body: dict[str, Any]) -> list[dict[str, Any]]:
    anti = body["spec"]["affinity"]["podAntiAffinity"]
    assert "preferredDuringSchedulingIgnoredDuringExecution" not in anti
    terms: list[dict[str, Any]] = anti[REQUIRED]
    return terms


def test_cluster_scope_repels_placeholders_of_every_namespace() -> None:
    settings = Settings(mode=Mode.ISOLATE_PIPELINERUN, isolation_scope=IsolationScope.CLUSTER)
    body = template(settings)
    assert required(body) == anti_affinity.required_terms(IsolationScope.CLUSTER, "", HOST)
    assert required(body)[0]["namespaceSelector"] == {}
    assert LABEL_TENANT not in body["metadata"]["labels"]


def test_a_namespace_label_gives_the_scope_to_its_runs_placeholders() -> None:
    settings = Settings(mode=Mode.ISOLATE_PIPELINERUN)
    body = template(settings, namespace_labels={LABEL_ISOLATION_SCOPE: "cluster"})
    assert required(body)[0]["namespaceSelector"] == {}


def test_tenant_scope_labels_the_placeholder_and_repels_other_tenants() -> None:
    settings = Settings(
        mode=Mode.ISOLATE_PIPELINERUN,
        isolation_scope=IsolationScope.TENANT,
        isolation_tenant_label=TEAM,
    )
    body = template(settings, namespace_labels={TEAM: "payments"})
    assert body["metadata"]["labels"][LABEL_TENANT] == "payments"
    own, others = required(body)
    assert "namespaceSelector" not in own
    assert others["namespaceSelector"] == {}
    assert others["labelSelector"]["matchExpressions"] == [
        {"key": LABEL_TENANT, "operator": "NotIn", "values": ["payments"]}
    ]


def test_every_mode_labels_its_placeholder_with_the_tenant() -> None:
    # A tenant's runs in other modes are not "another tenant" to its isolated runs.
    settings = Settings(mode=Mode.PIPELINERUNS, isolation_tenant_label=TEAM)
    body = template(settings, namespace_labels={TEAM: "payments"})
    assert body["metadata"]["labels"][LABEL_TENANT] == "payments"
    assert "affinity" not in body["spec"]  # kept apart by the spread constraint alone
    [spread] = body["spec"]["topologySpreadConstraints"]
    assert spread["whenUnsatisfiable"] == "ScheduleAnyway"


def test_a_run_of_an_unlabelled_namespace_in_tenant_scope_is_alone_everywhere() -> None:
    settings = Settings(
        mode=Mode.ISOLATE_PIPELINERUN,
        isolation_scope=IsolationScope.TENANT,
        isolation_tenant_label=TEAM,
    )
    body = template(settings, namespace_labels={})
    assert required(body) == anti_affinity.required_terms(IsolationScope.CLUSTER, "", HOST)
    assert LABEL_TENANT not in body["metadata"]["labels"]
