"""Volume co-location: which claims are rewritten, and both sides always agree.

The view is the real ``ClaimCache`` fed the way its watches feed it (objects shaped like
the API's PVCs and StatefulSets), so the indexes under test are the ones that serve.
"""

from __future__ import annotations

import asyncio
import base64
import copy
from collections.abc import Mapping, MutableMapping
from typing import Any

import jsonpatch as reference_jsonpatch
import orjson
import pytest

from coschedule import marks
from coschedule.config.settings import Settings
from coschedule.config.store import SettingsStore
from coschedule.kube.claim_cache import ClaimCache, _claim_transform, _sts_transform
from coschedule.kube.client import Credentials, KubeClient
from coschedule.marks import (
    ANNOTATION_CLAIM_TEMPLATES,
    ANNOTATION_CLAIMS,
    Mode,
    claim_placeholder,
    run_placeholder,
)
from coschedule.mutate import claim_rewrite as claims_mod
from coschedule.mutate.decision import AdmissionContext, Decision, decide
from coschedule.server.pod_endpoint import PodEndpoint
from coschedule.server.webhook_metrics import WebhookMetrics
from tests.fixtures import admission_review, load_pod

NS = "ci"
RUN = "pr-7f3k2"
PLACEHOLDER = run_placeholder(NS, RUN)
CLAIM_A = "pvc-1f1344866c"  # workspace "source", from a volumeClaimTemplate
CLAIM_B = "pvc-f87b6a85f3"  # workspace "cache", from a volumeClaimTemplate
USER_CLAIM = "shared-maven-repo"


def pvc(
    name: str,
    *,
    owner: tuple[str, str] | None = ("PipelineRun", RUN),
    bound: bool = False,
    modes: tuple[str, ...] = ("ReadWriteOnce",),
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A PVC as the API returns it (Tekton makes these for volumeClaimTemplate workspaces)."""
    meta: dict[str, Any] = {
        "name": name,
        "namespace": NS,
        "resourceVersion": "1",
        "uid": f"uid-{name}",
        "labels": dict(labels or {}),
    }
    if owner is not None:
        meta["ownerReferences"] = [
            {
                "apiVersion": "tekton.dev/v1",
                "kind": owner[0],
                "name": owner[1],
                "uid": "6b4c1d2e",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    spec: dict[str, Any] = {
        "accessModes": list(modes),
        "resources": {"requests": {"storage": "1Gi"}},
        "storageClassName": "standard",
        "volumeMode": "Filesystem",
    }
    if bound:
        spec["volumeName"] = f"pv-{name}"
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": meta,
        "spec": spec,
        "status": {"phase": "Bound" if bound else "Pending"},
    }


def cache() -> ClaimCache:
    # Never started: the tests deliver events the way the informers do.
    view = ClaimCache(KubeClient(Credentials(server="https://127.0.0.1:1")))
    view.claims.synced.set()
    view.statefulsets.synced.set()
    view.pods.synced.set()
    return view


def deliver(view: ClaimCache, obj: dict[str, Any], event: str = "ADDED") -> None:
    informer = {
        "PersistentVolumeClaim": view.claims,
        "StatefulSet": view.statefulsets,
        "Pod": view.pods,
    }[obj["kind"]]
    informer.apply(event, informer.transform(copy.deepcopy(obj)))


def statefulset(templates: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": PLACEHOLDER, "namespace": NS, "resourceVersion": "5"},
        "spec": {
            "volumeClaimTemplates": [
                {"metadata": {"name": t, "annotations": {"coschedule.dev/claim": c}}}
                for t, c in templates.items()
            ]
        },
    }


def run_cluster() -> ClaimCache:
    view = cache()
    deliver(view, pvc(CLAIM_A))
    deliver(view, pvc(CLAIM_B))
    deliver(view, pvc(USER_CLAIM, owner=None, bound=True))
    return view


def two_workspaces_and_user_claim() -> dict[str, Any]:
    pod = load_pod("tekton-taskrun-two-workspaces")
    pod["spec"]["volumes"].append(
        {"name": "ws-maven", "persistentVolumeClaim": {"claimName": USER_CLAIM}}
    )
    return pod


def admit(
    pod: dict[str, Any], view: ClaimCache | None, mode: Mode = Mode.PIPELINERUNS, **kw: Any
) -> tuple[Decision, dict[str, Any]]:
    # These tests are about the rewrite, which is opt-in (rewrite-claims: "true").
    context = AdmissionContext(
        Settings(mode=mode, **{"rewrite_claims": True, **kw}), NS, None, view
    )
    decision = decide(pod, context)
    patched = reference_jsonpatch.apply_patch(pod, decision.ops) if decision.ops else pod
    return decision, patched


def claim_names(pod: dict[str, Any]) -> list[str]:
    return [
        v["persistentVolumeClaim"]["claimName"]
        for v in pod["spec"]["volumes"]
        if "persistentVolumeClaim" in v
    ]


def sts_claim(claim: str) -> str:
    return marks.placeholder_claim(claims_mod.template_name(claim), PLACEHOLDER)


@pytest.mark.parametrize("mode", [Mode.PIPELINERUNS, Mode.ISOLATE_PIPELINERUN])
def test_template_claims_rewritten_user_claim_mounted(mode: Mode) -> None:
    decision, patched = admit(two_workspaces_and_user_claim(), run_cluster(), mode)
    assert decision.allowed
    assert claim_names(patched) == [sts_claim(CLAIM_A), sts_claim(CLAIM_B), USER_CLAIM]
    annotations = patched["metadata"]["annotations"]
    assert annotations[ANNOTATION_CLAIMS] == USER_CLAIM
    templates = orjson.loads(annotations[ANNOTATION_CLAIM_TEMPLATES])
    assert sorted(templates) == [CLAIM_A, CLAIM_B]
    assert templates[CLAIM_A]["claim"] == CLAIM_A
    assert templates[CLAIM_A]["spec"] == {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "1Gi"}},
        "storageClassName": "standard",
        "volumeMode": "Filesystem",
    }
    # The workspace volume names Tekton's steps mount stay the same.
    volume_names = [v["name"] for v in patched["spec"]["volumes"]]
    assert volume_names == [v["name"] for v in two_workspaces_and_user_claim()["spec"]["volumes"]]


def test_every_pod_of_the_run_carries_the_same_whole_run_decision() -> None:
    view = run_cluster()
    annotations = set()
    for name in ("tekton-taskrun", "tekton-taskrun-two-workspaces", "tekton-taskrun-no-workspace"):
        _, patched = admit(load_pod(name), view)
        annotations.add(patched["metadata"]["annotations"][ANNOTATION_CLAIM_TEMPLATES])
    assert len(annotations) == 1
    assert sorted(orjson.loads(annotations.pop())) == [CLAIM_A, CLAIM_B]


def test_reinvocation_adds_nothing() -> None:
    view = run_cluster()
    _, patched = admit(two_workspaces_and_user_claim(), view)
    again, _ = admit(patched, view)
    assert again.allowed
    assert again.ops == []


def test_bound_claim_of_the_run_is_never_rewritten() -> None:
    view = cache()
    deliver(view, pvc(CLAIM_A, bound=True))
    decision, patched = admit(load_pod("tekton-taskrun"), view)
    assert claim_names(patched) == [CLAIM_A]
    assert patched["metadata"]["annotations"][ANNOTATION_CLAIMS] == CLAIM_A
    assert any("bound (it may hold data)" in r for r in decision.reasons)


def test_claim_of_another_run_is_not_rewritten() -> None:
    view = cache()
    deliver(view, pvc(CLAIM_A, owner=("PipelineRun", "some-other-run")))
    decision, patched = admit(load_pod("tekton-taskrun"), view)
    assert claim_names(patched) == [CLAIM_A]
    assert any("not made for this run" in r for r in decision.reasons)


def test_group_label_adopts_a_claim() -> None:
    view = cache()
    deliver(view, pvc(CLAIM_A, owner=None, labels={"coschedule.dev/group": RUN}))
    _, patched = admit(load_pod("tekton-taskrun"), view)
    assert claim_names(patched) == [sts_claim(CLAIM_A)]


@pytest.mark.parametrize(
    "claim",
    [
        pvc(CLAIM_B, labels={"coschedule.dev/skip": "true"}),
        pvc(CLAIM_B, modes=("ReadWriteMany",)),
        pvc(CLAIM_B, modes=("ReadOnlyMany",)),
    ],
)
def test_skipped_and_shared_claims_are_neither_grouped_nor_rewritten(claim: dict[str, Any]) -> None:
    view = cache()
    deliver(view, pvc(CLAIM_A))
    deliver(view, claim)
    pod = load_pod("tekton-taskrun-two-workspaces")
    _, patched = admit(pod, view)
    assert claim_names(patched) == [sts_claim(CLAIM_A), CLAIM_B]
    annotations = patched["metadata"]["annotations"]
    assert annotations[ANNOTATION_CLAIMS] == ""  # the placeholder does not mount it
    assert sorted(orjson.loads(annotations[ANNOTATION_CLAIM_TEMPLATES])) == [CLAIM_A]
    # In workspaces mode the shared claim does not count: one claim left, no denial.
    decision, _ = admit(load_pod("tekton-taskrun-two-workspaces"), view, Mode.WORKSPACES)
    assert decision.allowed
    assert decision.placeholder == claim_placeholder(NS, CLAIM_A)


def test_shared_claims_can_be_grouped_when_configured() -> None:
    view = cache()
    deliver(view, pvc(CLAIM_A, modes=("ReadWriteMany",)))
    _, patched = admit(load_pod("tekton-taskrun"), view, group_shared_claims=True)
    assert claim_names(patched) == [sts_claim(CLAIM_A)]


def test_existing_statefulset_is_the_decision() -> None:
    """Claim B became known after the StatefulSet was made with A alone: B is mounted,
    never pointed at a claim the immutable templates will not create."""
    view = run_cluster()
    deliver(view, statefulset({claims_mod.template_name(CLAIM_A): CLAIM_A}))
    decision, patched = admit(load_pod("tekton-taskrun-two-workspaces"), view)
    assert claim_names(patched) == [sts_claim(CLAIM_A), CLAIM_B]
    assert patched["metadata"]["annotations"][ANNOTATION_CLAIMS] == CLAIM_B
    assert ANNOTATION_CLAIM_TEMPLATES not in patched["metadata"]["annotations"]
    assert decision.templates is None


def test_claim_bound_after_statefulset_still_follows_it() -> None:
    view = run_cluster()
    deliver(view, statefulset({CLAIM_A: CLAIM_A, CLAIM_B: CLAIM_B}))
    deliver(view, pvc(CLAIM_A, bound=True), "MODIFIED")  # Immediate binding, later
    _, patched = admit(load_pod("tekton-taskrun"), view)
    assert claim_names(patched) == [sts_claim(CLAIM_A)]


def test_pod_before_its_claim_is_refused_until_the_claim_is_known() -> None:
    view = cache()
    decision, _ = admit(load_pod("tekton-taskrun"), view)
    assert not decision.allowed
    assert decision.rule == "claim-unknown"
    assert decision.missing_claims == (CLAIM_A,)
    assert "retry" in (decision.message or "").lower()
    deliver(view, pvc(CLAIM_A))
    decision, patched = admit(load_pod("tekton-taskrun"), view)
    assert decision.allowed
    assert claim_names(patched) == [sts_claim(CLAIM_A)]


def test_unsynced_cache_refuses_rewrites_but_not_workspaces_grouping() -> None:
    view = cache()
    view.claims.synced.clear()
    decision, _ = admit(load_pod("tekton-taskrun"), view)
    assert decision.rule == "claim-cache-not-synced"
    grouped, _ = admit(load_pod("tekton-taskrun"), view, Mode.WORKSPACES)
    assert grouped.allowed
    assert grouped.placeholder is not None


def test_webhook_restart_between_pods_decides_the_same() -> None:
    _, patched_first = admit(load_pod("tekton-taskrun"), run_cluster())
    # A new process: a fresh cache listed from the same cluster state.
    _, patched_second = admit(load_pod("tekton-taskrun-two-workspaces"), run_cluster())
    assert (
        patched_first["metadata"]["annotations"][ANNOTATION_CLAIM_TEMPLATES]
        == patched_second["metadata"]["annotations"][ANNOTATION_CLAIM_TEMPLATES]
    )
    assert claim_names(patched_second)[0] == claim_names(patched_first)[0]


def test_rewrite_off_and_offline_mount_claims_as_they_are() -> None:
    _, patched = admit(load_pod("tekton-taskrun"), run_cluster(), rewrite_claims=False)
    assert claim_names(patched) == [CLAIM_A]
    _, offline = admit(load_pod("tekton-taskrun"), None)
    assert claim_names(offline) == [CLAIM_A]
    assert offline["metadata"]["annotations"][ANNOTATION_CLAIMS] == CLAIM_A


@pytest.mark.parametrize("mode", [Mode.PIPELINERUNS, Mode.ISOLATE_PIPELINERUN])
def test_by_default_the_engines_claims_are_mounted_one_volume_per_workspace(mode: Mode) -> None:
    """The default (rewrite-claims off): every pod keeps Tekton's own claims and the
    placeholder mounts them, so a workspace gets one volume whatever its class's binding
    mode; the run's decision (no templates) travels on the pod like a rewrite's would."""
    pod = two_workspaces_and_user_claim()
    context = AdmissionContext(Settings(mode=mode), NS, None, run_cluster())
    assert context.settings.rewrite_claims is False
    decision = decide(pod, context)
    assert decision.allowed
    patched = reference_jsonpatch.apply_patch(pod, decision.ops)
    assert claim_names(patched) == [CLAIM_A, CLAIM_B, USER_CLAIM]
    annotations = patched["metadata"]["annotations"]
    assert annotations[ANNOTATION_CLAIMS] == ",".join([CLAIM_A, CLAIM_B, USER_CLAIM])
    assert decision.templates == ()


def test_with_rewrite_off_a_run_that_has_templates_keeps_following_them() -> None:
    """Turned off mid-run (or an upgrade under a running run): the StatefulSet's templates
    stay the run's decision, so its later pods still use the claims its earlier pods wrote."""
    view = run_cluster()
    deliver(view, statefulset({claims_mod.template_name(CLAIM_A): CLAIM_A}))
    _, patched = admit(load_pod("tekton-taskrun"), view, rewrite_claims=False)
    assert claim_names(patched) == [sts_claim(CLAIM_A)]


def test_workspaces_mode_never_rewrites() -> None:
    _, patched = admit(load_pod("tekton-taskrun"), run_cluster(), Mode.WORKSPACES)
    assert claim_names(patched) == [CLAIM_A]


def test_long_claim_names_get_hashed_template_names() -> None:
    long_name = "pvc-" + "a" * 70
    assert claims_mod.template_name(long_name).startswith("pvc-")
    assert len(claims_mod.template_name(long_name)) <= 63
    assert claims_mod.template_name(long_name) == claims_mod.template_name(long_name)
    assert claims_mod.template_name("data.v1") != "data.v1"  # a dot is not a DNS label
    assert claims_mod.template_name(CLAIM_A) == CLAIM_A


def test_deleted_claim_leaves_the_run_index() -> None:
    view = run_cluster()
    assert {c.name for c in view.run_claims(NS, RUN)} == {CLAIM_A, CLAIM_B}
    deliver(view, pvc(CLAIM_B), "DELETED")
    assert {c.name for c in view.run_claims(NS, RUN)} == {CLAIM_A}


def test_http_layer_waits_for_a_claim_arriving_from_the_watch() -> None:
    """Pod before claim, through the handler: the claim arrives while it waits."""
    view = cache()
    env = {"COSCHEDULE_COSCHEDULE": "pipelineruns", "COSCHEDULE_REWRITE_CLAIMS": "true"}
    store = SettingsStore(None, env)
    handler = PodEndpoint(store, WebhookMetrics(), None, view)
    review = admission_review(load_pod("tekton-taskrun"))
    sent: list[MutableMapping[str, Any]] = []

    async def run() -> None:
        body = orjson.dumps(review)
        messages = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> dict[str, Any]:
            return messages.pop(0)

        async def send(message: MutableMapping[str, Any]) -> None:
            sent.append(message)

        scope = {
            "type": "http",
            "method": "POST",
            "path": "/mutate",
            "headers": [(b"content-type", b"application/json")],
        }
        task = asyncio.create_task(handler(scope, receive, send))
        await asyncio.sleep(0.05)
        assert not sent  # still waiting for the claim
        deliver(view, pvc(CLAIM_A))
        await task

    asyncio.run(run())
    response = orjson.loads(sent[1]["body"])["response"]
    assert response["allowed"] is True
    assert response["uid"] == review["request"]["uid"]
    ops = orjson.loads(base64.b64decode(response["patch"]))
    patched = reference_jsonpatch.apply_patch(review["request"]["object"], ops)
    assert claim_names(patched) == [sts_claim(CLAIM_A)]


def test_cache_transforms_keep_what_decisions_need() -> None:
    sts = _sts_transform(statefulset({"t1": "c1"}))
    assert sts["templates"] == {"t1": "c1"}
    info = _claim_transform(pvc(CLAIM_A))["info"]
    assert info.belongs_to(RUN)
    assert not info.bound


def test_a_later_pod_follows_the_decision_an_earlier_pod_carries() -> None:
    """Claim A binds (Immediate binding) between the run's first and second pod: the
    second follows the first pod's decision from the marked-pod cache, so the run never
    writes to two different volumes."""
    view = run_cluster()
    decision, first = admit(load_pod("tekton-taskrun"), view)
    assert decision.allowed
    first["metadata"].update(name="build-pod", creationTimestamp="2026-11-21T06:00:01Z")
    deliver(view, first)
    deliver(view, pvc(CLAIM_A, bound=True), "MODIFIED")
    second_decision, second = admit(load_pod("tekton-taskrun-two-workspaces"), view)
    assert claim_names(second)[:2] == [sts_claim(CLAIM_A), sts_claim(CLAIM_B)]
    assert any("following the run's earlier pods" in r for r in second_decision.reasons)
    assert (
        second["metadata"]["annotations"][ANNOTATION_CLAIM_TEMPLATES]
        == first["metadata"]["annotations"][ANNOTATION_CLAIM_TEMPLATES]
    )
    deliver(view, first, "DELETED")
    assert view.pod_decision(NS, PLACEHOLDER) is None
