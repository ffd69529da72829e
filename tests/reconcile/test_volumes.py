"""Volume co-location on the reconciler's side: the StatefulSet it builds provisions exactly
the claims the webhook pointed the run's pods at, whatever order things arrive in."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

from coschedule.config.settings import Settings
from coschedule.marks import BadMark, Mode, run_placeholder
from coschedule.mutate.claim_rewrite import StaticClaims
from coschedule.mutate.decision import AdmissionContext, decide
from coschedule.reconcile import shapes
from coschedule.reconcile.model import (
    DeleteClaim,
    DeleteStatefulSet,
    MarkedPod,
    Observed,
    OwnerRef,
    OwnerState,
    OwnerStatus,
)
from coschedule.reconcile.placeholder import build_statefulset, group_spec
from coschedule.reconcile.plan import claim_templates, plan
from coschedule.wire.jsonpatch import apply
from tests.fixtures import load_pod

NS = "ci"
RUN = "pr-7f3k2"
PLACEHOLDER = run_placeholder(NS, RUN)
SETTINGS = Settings(mode=Mode.PIPELINERUNS, rewrite_claims=True)  # the opt-in rewrite
OWNER = OwnerRef("tekton.dev/v1", "PipelineRun", RUN, "uid-pr")


def pvc(name: str, *, bound: bool = False, owned: bool = True) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": NS}
    if owned:
        meta["ownerReferences"] = [
            {"apiVersion": "tekton.dev/v1", "kind": "PipelineRun", "name": RUN, "uid": "u"}
        ]
    spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "2Gi"}},
        "storageClassName": "wait-for-first-consumer",
    }
    if bound:
        spec["volumeName"] = f"pv-{name}"
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta, "spec": spec}


def admitted(
    fixture: str, cluster: list[dict[str, Any]], *, name: str, created: str
) -> dict[str, Any]:
    """A pod through the real webhook decision with the cluster's claims, as stored."""
    pod = load_pod(fixture)
    pod["spec"]["volumes"].append(
        {"name": "ws-user", "persistentVolumeClaim": {"claimName": "user-data"}}
    )
    view = StaticClaims.from_objects(cluster, NS)
    decision = decide(pod, AdmissionContext(SETTINGS, NS, None, view))
    assert decision.allowed, decision.message
    stored: dict[str, Any] = apply(pod, decision.ops)
    stored["metadata"].update(name=name, uid=f"uid-{name}", creationTimestamp=created)
    stored["status"] = {"phase": "Pending"}
    return stored


def parse(pod: dict[str, Any]) -> MarkedPod:
    result = shapes.parse_marked(shapes.slim_marked_pod(copy.deepcopy(pod)))
    assert isinstance(result, MarkedPod), result
    return result


def referenced(pod: dict[str, Any]) -> set[str]:
    return {
        v["persistentVolumeClaim"]["claimName"]
        for v in pod["spec"]["volumes"]
        if "persistentVolumeClaim" in v
    }


def provisioned(sts: dict[str, Any]) -> set[str]:
    return {
        f"{t['metadata']['name']}-{sts['metadata']['name']}-0"
        for t in sts["spec"].get("volumeClaimTemplates", ())
    }


def mounted(sts: dict[str, Any]) -> set[str]:
    return {
        v["persistentVolumeClaim"]["claimName"]
        for v in sts["spec"]["template"]["spec"].get("volumes", ())
    }


def build(pods: list[dict[str, Any]]) -> dict[str, Any]:
    marked = [parse(p) for p in pods]
    templates, made, conflicts = claim_templates(marked, None)
    assert made == ()
    assert conflicts == ()
    group = group_spec(NS, PLACEHOLDER, marked)
    assert group is not None
    return build_statefulset(group, SETTINGS, OWNER, templates)


def assert_every_claim_exists(
    pods: list[dict[str, Any]], sts: dict[str, Any], cluster: list[dict[str, Any]]
) -> None:
    """The invariants: a pod never references a claim that will not exist, and the run's
    pods agree on which claims are rewritten."""
    existing = {o["metadata"]["name"] for o in cluster if o["kind"] == "PersistentVolumeClaim"}
    rewritten_by: dict[str, set[bool]] = {}
    for pod in pods:
        missing = referenced(pod) - provisioned(sts) - existing
        assert not missing, f"{pod['metadata']['name']} references {missing}"
        for claim in referenced(pod):
            original = claim.removesuffix(f"-{PLACEHOLDER}-0")
            rewritten_by.setdefault(original, set()).add(claim != original)
    split = {claim for claim, ways in rewritten_by.items() if len(ways) > 1}
    assert not split, f"the run's pods disagree on {split}"


def test_two_template_workspaces_and_a_user_claim() -> None:
    cluster = [
        pvc("pvc-1f1344866c"),
        pvc("pvc-f87b6a85f3"),
        pvc("user-data", owned=False, bound=True),
    ]
    pods = [
        admitted("tekton-taskrun", cluster, name="build", created="2026-11-21T06:00:01Z"),
        admitted(
            "tekton-taskrun-two-workspaces", cluster, name="test", created="2026-11-21T06:00:02Z"
        ),
    ]
    sts = build(pods)
    assert len(sts["spec"]["volumeClaimTemplates"]) == 2
    assert provisioned(sts) == {
        f"pvc-1f1344866c-{PLACEHOLDER}-0",
        f"pvc-f87b6a85f3-{PLACEHOLDER}-0",
    }
    assert referenced(pods[1]) == provisioned(sts) | {"user-data"}
    assert mounted(sts) == {"user-data"}  # the run goes where the user's data is
    assert_every_claim_exists(pods, sts, cluster)
    # The claims it makes carry the run's owner, so deleting the run deletes them.
    for template in sts["spec"]["volumeClaimTemplates"]:
        assert template["metadata"]["ownerReferences"][0]["name"] == RUN
        assert template["spec"]["storageClassName"] == "wait-for-first-consumer"


def test_statefulset_built_from_the_first_pod_covers_later_pods() -> None:
    """First pod mounts one workspace, yet the StatefulSet built from it alone provisions
    the whole run's claims: the second pod, admitted before or after, finds them."""
    cluster = [
        pvc("pvc-1f1344866c"),
        pvc("pvc-f87b6a85f3"),
        pvc("user-data", owned=False, bound=True),
    ]
    first = admitted("tekton-taskrun", cluster, name="build", created="2026-11-21T06:00:01Z")
    sts = build([first])
    second = admitted(
        "tekton-taskrun-two-workspaces", cluster, name="test", created="2026-11-21T06:00:05Z"
    )
    assert_every_claim_exists([first, second], sts, cluster)


def test_existing_statefulset_decides_for_pods_admitted_after_it() -> None:
    cluster = [pvc("pvc-1f1344866c"), pvc("user-data", owned=False, bound=True)]
    first = admitted("tekton-taskrun", cluster, name="build", created="2026-11-21T06:00:01Z")
    sts = build([first])
    # Claim B appears after the StatefulSet (immutable templates): the webhook follows it.
    cluster += [sts, pvc("pvc-f87b6a85f3")]
    second = admitted(
        "tekton-taskrun-two-workspaces", cluster, name="test", created="2026-11-21T06:00:05Z"
    )
    assert f"pvc-f87b6a85f3-{PLACEHOLDER}-0" not in referenced(second)
    assert "pvc-f87b6a85f3" in referenced(second)
    assert_every_claim_exists([first, second], sts, cluster)
    # And the reconciler, seeing the StatefulSet, keeps its templates and mounts B plainly.
    observed_sts = shapes.parse_statefulset(shapes.slim_statefulset(copy.deepcopy(sts)))
    templates, made, _ = claim_templates([parse(first), parse(second)], observed_sts)
    assert [t.name for t in templates] == ["pvc-1f1344866c"]
    assert made == (f"pvc-1f1344866c-{PLACEHOLDER}-0",)
    group = group_spec(NS, PLACEHOLDER, [parse(first), parse(second)])
    assert group is not None
    rebuilt = build_statefulset(group, SETTINGS, OWNER, templates)
    assert mounted(rebuilt) == {"pvc-f87b6a85f3", "user-data"}


def test_teardown_deletes_the_claims_the_statefulset_made_and_no_other() -> None:
    cluster = [pvc("pvc-1f1344866c"), pvc("user-data", owned=False, bound=True)]
    pod = admitted("tekton-taskrun", cluster, name="build", created="2026-11-21T06:00:01Z")
    pod["status"] = {"phase": "Succeeded"}
    sts = build([pod])
    sts["metadata"].update(uid="uid-sts", resourceVersion="7")
    observed_sts = shapes.parse_statefulset(shapes.slim_statefulset(copy.deepcopy(sts)))
    templates, made, _ = claim_templates([parse(pod)], observed_sts)
    done = OwnerState(OWNER, OwnerStatus.DONE, detail="PipelineRun pr-7f3k2 Succeeded")
    running = OwnerState(OWNER, OwnerStatus.RUNNING, detail="PipelineRun pr-7f3k2 running")
    common = dict(
        namespace=NS,
        name=PLACEHOLDER,
        pods=(parse(pod),),
        statefulset=observed_sts,
        claim_templates=templates,
        claims_to_delete=made,
        idle_since=0.0,
    )
    actions = plan(Observed(**common, owner=done), SETTINGS, now=1000.0).actions  # type: ignore[arg-type]
    assert any(isinstance(a, DeleteStatefulSet) for a in actions)
    assert [a.name for a in actions if isinstance(a, DeleteClaim)] == [
        f"pvc-1f1344866c-{PLACEHOLDER}-0"
    ]
    # Never before: a run whose owner still runs keeps its claims, even with no live pod.
    actions = plan(Observed(**common, owner=running), SETTINGS, now=1000.0).actions  # type: ignore[arg-type]
    assert not any(isinstance(a, (DeleteClaim, DeleteStatefulSet)) for a in actions)


def test_a_claim_bound_between_two_pods_does_not_split_the_run() -> None:
    """Immediate binding: claim A binds after pod a was admitted. Pod b, admitted while
    no StatefulSet exists yet, follows pod a's decision (the webhook watches marked pods),
    so both write to the same volume."""
    user = pvc("user-data", owned=False, bound=True)
    a = admitted(
        "tekton-taskrun", [pvc("pvc-1f1344866c"), user], name="a", created="2026-11-21T06:00:01Z"
    )
    later = [pvc("pvc-1f1344866c", bound=True), pvc("pvc-f87b6a85f3"), user, a]
    b = admitted("tekton-taskrun-two-workspaces", later, name="b", created="2026-11-21T06:00:02Z")
    assert f"pvc-1f1344866c-{PLACEHOLDER}-0" in referenced(b)
    templates, _, conflicts = claim_templates([parse(a), parse(b)], None)
    assert conflicts == ()
    assert [t.name for t in templates] == ["pvc-1f1344866c"]
    group = group_spec(NS, PLACEHOLDER, [parse(a), parse(b)])
    assert group is not None
    sts = build_statefulset(group, SETTINGS, OWNER, templates)
    assert_every_claim_exists([a, b], sts, later)


def test_pods_that_disagree_are_reported_and_the_union_is_built() -> None:
    """Two pods admitted at the same instant by two webhook replicas with different views:
    the reconciler builds the union, so every claim either pod names will exist."""
    user = pvc("user-data", owned=False, bound=True)
    a = admitted(
        "tekton-taskrun", [pvc("pvc-1f1344866c"), user], name="a", created="2026-11-21T06:00:01Z"
    )
    b = admitted(
        "tekton-taskrun-two-workspaces",
        [pvc("pvc-1f1344866c"), pvc("pvc-f87b6a85f3"), user],
        name="b",
        created="2026-11-21T06:00:01Z",
    )
    templates, _, conflicts = claim_templates([parse(a), parse(b)], None)
    assert conflicts == ()
    assert [t.name for t in templates] == ["pvc-1f1344866c", "pvc-f87b6a85f3"]
    group = group_spec(NS, PLACEHOLDER, [parse(a), parse(b)])
    assert group is not None
    sts = build_statefulset(group, SETTINGS, OWNER, templates)
    assert_every_claim_exists([a, b], sts, [user])
    # Had they disagreed on a template's spec, the earliest pod's wins and it is reported.
    earliest = parse(a)
    first_templates = earliest.marks.claim_templates
    assert first_templates is not None
    bigger = replace(first_templates[0], spec={**first_templates[0].spec, "x": 1})
    later = parse(b)
    disagreeing = replace(later, marks=later.marks._replace(claim_templates=(bigger,)))
    _, _, conflicts = claim_templates([earliest, disagreeing], None)
    assert conflicts == ("pvc-1f1344866c",)


def test_malformed_claim_templates_annotation_is_a_bad_mark() -> None:
    pod = admitted(
        "tekton-taskrun",
        [pvc("pvc-1f1344866c"), pvc("user-data", owned=False, bound=True)],
        name="a",
        created="2026-11-21T06:00:01Z",
    )
    for broken in ("{not json", "[1]", '{"t": {"claim": 1}}'):
        pod["metadata"]["annotations"]["coschedule.dev/claim-templates"] = broken
        result = shapes.parse_marked(shapes.slim_marked_pod(copy.deepcopy(pod)))
        assert isinstance(result, BadMark)
        assert "claim-templates" in result.reason
