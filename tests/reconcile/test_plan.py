"""Pure decisions: (observed pods, nodes, StatefulSets, owners) -> actions."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from coschedule.config.settings import Settings
from coschedule.k8s.nodes import Node, Taint
from coschedule.k8s.timefmt import parse_time
from coschedule.k8s.volumes import VolumeTopology
from coschedule.marks import (
    ANNOTATION_CLAIMS,
    BadMark,
    ClaimTemplate,
    Mode,
    Placement,
    claim_placeholder,
    run_placeholder,
)
from coschedule.reconcile import owners, relocation, shapes
from coschedule.reconcile.model import (
    CreateStatefulSet,
    DeleteClaim,
    DeletePlaceholderPod,
    DeleteStatefulSet,
    HoldPinnedPlaceholder,
    Observed,
    ObservedSet,
    OwnerRef,
    OwnerState,
    OwnerStatus,
    PatchStatefulSet,
    PlaceholderPod,
    Plan,
    RecordEvent,
)
from coschedule.reconcile.placeholder import (
    ANNOTATION_TEMPLATE_HASH,
    build_statefulset,
    group_spec,
    pod_template,
    template_hash,
)
from coschedule.reconcile.plan import (
    NODE_DOWN_SECONDS,
    OWNER_RECHECK_SECONDS,
    OWNER_RETRY_SECONDS,
    STRANDED_DELETE_SECONDS,
    owner_check_due,
    plan,
)
from tests.fixtures import DEFAULT_TOLERATIONS
from tests.reconcile.pods import by_node_name, marked_pod, parsed, placeholder_of

NOW = 1_800_000_000.0
PIPELINERUN = OwnerRef("tekton.dev/v1", "PipelineRun", "pr-7f3k2", "uid-pr")
RUNNING = OwnerState(PIPELINERUN, OwnerStatus.RUNNING, NOW, "")
SETTINGS = Settings(mode=Mode.PIPELINERUNS)


def only(result: Plan, kind: type) -> list[Any]:
    return [a for a in result.actions if isinstance(a, kind)]


def observed_for(*pods: dict[str, Any], **kwargs: Any) -> Observed:
    parsed_pods = tuple(parsed(p) for p in pods)
    name = parsed_pods[0].marks.placeholder if parsed_pods else kwargs.pop("name")
    namespace = parsed_pods[0].namespace if parsed_pods else kwargs.pop("namespace")
    return Observed(namespace=namespace, name=name, pods=parsed_pods, **kwargs)


def existing_set(observed: Observed, settings: Settings = SETTINGS, **over: Any) -> ObservedSet:
    """The StatefulSet as we would have created it for ``observed``."""
    body = created_body(observed, settings)
    meta = body["metadata"]
    base = ObservedSet(
        namespace=observed.namespace,
        name=observed.name,
        uid="sts-uid",
        resource_version="42",
        replicas=1,
        update_strategy="OnDelete",
        labels=meta["labels"],
        annotations=meta["annotations"],
        owner_references=tuple(meta.get("ownerReferences", ())),
        deleting=False,
    )
    return replace(base, **over)


def created_body(observed: Observed, settings: Settings = SETTINGS) -> dict[str, Any]:
    owner = observed.owner
    if owner is not None and owner.status is OwnerStatus.DONE:
        # Made while the run ran (a done run's pods get none).
        observed = replace(observed, owner=replace(owner, status=OwnerStatus.RUNNING))
    creates = only(plan(observed, settings, NOW), CreateStatefulSet)
    assert len(creates) == 1
    body: dict[str, Any] = creates[0].body
    return body


# ---- creation ------------------------------------------------------------------------


def test_first_live_pod_creates_the_placeholder_statefulset() -> None:
    pod = marked_pod("tekton-taskrun")
    observed = observed_for(pod, owner=RUNNING)
    actions = plan(observed, SETTINGS, NOW)
    [create] = only(actions, CreateStatefulSet)
    body = create.body
    name = run_placeholder("ci", "pr-7f3k2")
    assert create.name == name == placeholder_of(pod)
    assert body["kind"] == "StatefulSet"
    assert body["apiVersion"] == "apps/v1"
    ours = {
        "app.kubernetes.io/component": "affinity-assistant",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/managed-by": "coschedule",
    }
    assert body["metadata"]["labels"] == ours
    spec = body["spec"]
    assert spec["template"]["metadata"]["labels"] == ours
    assert spec["selector"] == {
        "matchLabels": {k: v for k, v in ours.items() if "managed-by" not in k}
    }
    assert spec["replicas"] == 1
    assert spec["podManagementPolicy"] == "Parallel"
    assert spec["updateStrategy"] == {"type": "OnDelete"}
    assert spec["serviceName"] == name
    pod_spec = spec["template"]["spec"]
    assert pod_spec["automountServiceAccountToken"] is False
    assert pod_spec["enableServiceLinks"] is False
    assert pod_spec["terminationGracePeriodSeconds"] <= 2
    [container] = pod_spec["containers"]
    assert container["image"] == SETTINGS.placeholder_image
    ctx = container["securityContext"]
    assert ctx["runAsNonRoot"] is True
    assert ctx["runAsUser"] == 65532
    assert ctx["readOnlyRootFilesystem"] is True
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["capabilities"] == {"drop": ["ALL"]}
    assert ctx["seccompProfile"] == {"type": "RuntimeDefault"}
    # Placeholders keep apart by a topology spread constraint, never by an inter-pod term.
    assert "affinity" not in pod_spec
    assert pod_spec["topologySpreadConstraints"] == [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": {"app.kubernetes.io/component": "affinity-assistant"}},
        }
    ]
    assert pod_spec["volumes"] == [
        {"name": "claim-0", "persistentVolumeClaim": {"claimName": "pvc-1f1344866c"}}
    ]
    assert body["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "tekton.dev/v1",
            "kind": "PipelineRun",
            "name": "pr-7f3k2",
            "uid": "uid-pr",
            "controller": False,
            "blockOwnerDeletion": False,
        }
    ]
    [create] = only(actions, CreateStatefulSet)
    event = create.event
    assert event.reason == "PlaceholderCreated"
    assert "pr-7f3k2" in event.message
    assert not only(actions, DeleteStatefulSet)


def test_isolate_mode_requires_anti_affinity_with_the_configured_topology_key() -> None:
    settings = Settings(mode=Mode.ISOLATE_PIPELINERUN, topology_key="topology.kubernetes.io/zone")
    pod = marked_pod("tekton-taskrun", settings=settings)
    body = created_body(observed_for(pod), settings)
    anti = body["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert "preferredDuringSchedulingIgnoredDuringExecution" not in anti
    [term] = anti["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "topology.kubernetes.io/zone"
    assert term["labelSelector"]["matchLabels"] == {
        "app.kubernetes.io/component": "affinity-assistant"
    }


def test_workspaces_mode_mounts_the_groups_claim_and_has_no_owner() -> None:
    pod = marked_pod("argo-workflow-pod", Mode.WORKSPACES)
    observed = observed_for(pod, owner=RUNNING)
    assert observed.name == claim_placeholder("ci", "wf-build-9xkq2-workdir")
    body = created_body(observed, Settings(mode=Mode.WORKSPACES))
    assert "ownerReferences" not in body["metadata"]
    assert body["spec"]["template"]["spec"]["volumes"] == [
        {"name": "claim-0", "persistentVolumeClaim": {"claimName": "wf-build-9xkq2-workdir"}}
    ]
    assert body["metadata"]["annotations"]["coschedule.dev/mode"] == "workspaces"


def test_pipelineruns_mode_mounts_every_claim_of_the_run() -> None:
    one = marked_pod("tekton-taskrun", created="2026-11-21T06:00:00Z")
    two = marked_pod("tekton-taskrun-two-workspaces", created="2026-11-21T06:01:00Z")
    none = marked_pod("tekton-taskrun-no-workspace", created="2026-11-21T06:02:00Z")
    assert placeholder_of(one) == placeholder_of(two) == placeholder_of(none)
    body = created_body(observed_for(one, two, none))
    assert body["spec"]["template"]["spec"]["volumes"] == [
        {"name": "claim-0", "persistentVolumeClaim": {"claimName": "pvc-1f1344866c"}},
        {"name": "claim-1", "persistentVolumeClaim": {"claimName": "pvc-f87b6a85f3"}},
    ]


def test_node_selector_and_tolerations_are_what_every_pod_allows() -> None:
    first = marked_pod(
        "tekton-taskrun-user-affinity", name="a-late", created="2026-11-21T06:00:00Z"
    )
    later = marked_pod("tekton-taskrun-user-affinity", name="b", created="2026-11-21T06:05:00Z")
    later["spec"]["nodeSelector"] = {"kubernetes.io/os": "linux", "disk": "ssd"}
    later["spec"]["tolerations"] = [*DEFAULT_TOLERATIONS]
    pod_spec = created_body(observed_for(later, first))["spec"]["template"]["spec"]
    # Both selectors' keys; only the tolerations both pods have.
    assert pod_spec["nodeSelector"] == {
        "kubernetes.io/os": "linux",
        "node-pool": "ci-builders",
        "disk": "ssd",
    }
    assert pod_spec["tolerations"] == list(DEFAULT_TOLERATIONS)


def test_a_pod_that_allows_no_node_with_the_earlier_ones_is_left_out() -> None:
    first = marked_pod(
        "tekton-taskrun-user-affinity", name="a-late", created="2026-11-21T06:00:00Z"
    )
    later = marked_pod("tekton-taskrun-user-affinity", name="b", created="2026-11-21T06:05:00Z")
    later["spec"]["nodeSelector"] = {"node-pool": "other"}
    tie = marked_pod("tekton-taskrun-user-affinity", name="0-tie", created="2026-11-21T06:00:00Z")
    tie["spec"]["nodeSelector"] = {"node-pool": "tie-winner"}
    group = group_spec("ci", "x", [parsed(p) for p in (later, first)])
    assert group is not None
    assert group.node_selector == {"kubernetes.io/os": "linux", "node-pool": "ci-builders"}
    assert group.excluded == ("b",)
    [create] = only(plan(observed_for(later, first), SETTINGS, NOW), CreateStatefulSet)
    assert create.event.type == "Warning"
    assert "pod(s) b left out" in create.event.message
    # Same creationTimestamp: the name decides, whatever order the cache lists them in.
    for order in ((first, tie, later), (later, tie, first)):
        body = created_body(observed_for(*order))
        assert body["spec"]["template"]["spec"]["nodeSelector"] == {"node-pool": "tie-winner"}


REQUIRED_TERMS = "requiredDuringSchedulingIgnoredDuringExecution"


def _pool_affinity(pod: dict[str, Any], *allowed: str) -> None:
    pod["spec"]["affinity"] = {
        "nodeAffinity": {
            REQUIRED_TERMS: {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "pool", "operator": "In", "values": list(allowed)}
                        ]
                    }
                ]
            }
        }
    }


def _required(body: dict[str, Any]) -> Any:
    affinity = body["spec"]["template"]["spec"]["affinity"]
    return affinity.get("nodeAffinity", {}).get(REQUIRED_TERMS, {}).get("nodeSelectorTerms")


@pytest.mark.parametrize("placement", list(Placement))
def test_the_runs_required_node_affinity_goes_on_the_placeholder(placement: Placement) -> None:
    """The issue's case: the podTemplate allows two of three nodes; the placeholder, and the
    volume it provisions, must not go to the third. Pinned pods carry our pin in their
    terms: the placeholder carries the pod's own terms, not the pin."""
    settings = Settings(mode=Mode.PIPELINERUNS, placement=placement)
    pod = marked_pod(
        "tekton-taskrun", settings=settings, before=lambda p: _pool_affinity(p, "a", "b")
    )
    if placement is Placement.AUTO:
        pod = by_node_name(pod, "node-a")
    body = created_body(observed_for(pod), settings)
    assert _required(body) == [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a", "b"]}]}
    ]
    # The constraint that spreads placeholders is still there.
    assert body["spec"]["template"]["spec"]["topologySpreadConstraints"]


def test_pods_without_node_affinity_leave_the_placeholder_as_before() -> None:
    body = created_body(observed_for(marked_pod("tekton-taskrun")))
    assert "affinity" not in body["spec"]["template"]["spec"]


@pytest.mark.parametrize(
    ("first", "second", "terms"),
    [
        # Terms are ORed: the meet is their cross product, each pair ANDed.
        (
            [["a", "b"]],
            [["b", "c"]],
            [[("In", ["a", "b"]), ("In", ["b", "c"])]],
        ),
        # One pod with no requirement: the other's terms.
        (None, [["a"]], [[("In", ["a"])]]),
        # Two terms each: four pairs, the ones no node can meet dropped.
        (
            [["a"], ["b"]],
            [["b"], ["c"]],
            [[("In", ["b"])]],
        ),
    ],
)
def test_pods_that_differ_give_the_placeholder_their_meet(
    first: list[list[str]] | None, second: list[list[str]], terms: list[list[tuple[str, list[str]]]]
) -> None:
    def with_terms(spec_terms: list[list[str]] | None) -> Any:
        def edit(pod: dict[str, Any]) -> None:
            if spec_terms is None:
                return
            pod["spec"]["affinity"] = {
                "nodeAffinity": {
                    REQUIRED_TERMS: {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "pool", "operator": "In", "values": v}]}
                            for v in spec_terms
                        ]
                    }
                }
            }

        return edit

    a = marked_pod("tekton-taskrun", name="a", before=with_terms(first))
    b = marked_pod(
        "tekton-taskrun", name="b", created="2026-11-21T06:01:00Z", before=with_terms(second)
    )
    wanted = [
        {
            "matchExpressions": [
                {"key": "pool", "operator": op, "values": values} for op, values in term
            ]
        }
        for term in terms
    ]
    assert _required(created_body(observed_for(a, b))) == wanted


def test_a_narrower_later_pod_changes_the_template_without_restarting_the_placeholder() -> None:
    """OnDelete: the template follows; the placeholder pod moves only through the stuck-run
    rule (when the new pod cannot join it where it is and nothing of the run runs)."""
    a = marked_pod("tekton-taskrun", name="a", before=lambda p: _pool_affinity(p, "a", "b"))
    observed = observed_for(a, owner=RUNNING)
    sts = existing_set(observed)
    b = marked_pod(
        "tekton-taskrun",
        name="b",
        created="2026-11-21T06:01:00Z",
        before=lambda p: _pool_affinity(p, "b"),
    )
    later = observed_for(a, b, owner=RUNNING, statefulset=sts)
    [patch] = only(plan(later, SETTINGS, NOW), PatchStatefulSet)
    assert patch.why == "pod template"
    terms = patch.patch["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][REQUIRED_TERMS]
    assert terms["nodeSelectorTerms"] == [
        {
            "matchExpressions": [
                {"key": "pool", "operator": "In", "values": ["a", "b"]},
                {"key": "pool", "operator": "In", "values": ["b"]},
            ]
        }
    ]
    assert not only(plan(later, SETTINGS, NOW), DeletePlaceholderPod)


def test_a_run_keeps_the_claims_of_a_pod_deleted_meanwhile() -> None:
    """The pod that mounted a claim was deleted (moved off a node, remade by its engine):
    the placeholder keeps the claim while it exists, or a placeholder remade meanwhile
    would not hold the run's data. A claim deleted too is let go."""
    two = marked_pod("tekton-taskrun-two-workspaces", name="two")
    none = marked_pod("tekton-taskrun-no-workspace", name="none", created="2026-11-21T06:01:00Z")
    sts = existing_set(observed_for(two, none, owner=RUNNING))
    assert sts.annotations[ANNOTATION_CLAIMS] == "pvc-1f1344866c,pvc-f87b6a85f3"
    left = observed_for(none, owner=RUNNING, statefulset=sts)
    kept = replace(left, claims_kept=("pvc-1f1344866c", "pvc-f87b6a85f3"))
    assert not only(plan(kept, SETTINGS, NOW), PatchStatefulSet)
    one_gone = replace(left, claims_kept=("pvc-f87b6a85f3",))
    [patch] = only(plan(one_gone, SETTINGS, NOW), PatchStatefulSet)
    assert patch.patch["metadata"]["annotations"][ANNOTATION_CLAIMS] == "pvc-f87b6a85f3"
    assert patch.patch["spec"]["template"]["spec"]["volumes"] == [
        {"name": "claim-0", "persistentVolumeClaim": {"claimName": "pvc-f87b6a85f3"}}
    ]
    # A later pod that names a kept claim again changes nothing.
    back = marked_pod("tekton-taskrun", name="back", created="2026-11-21T06:02:00Z")
    again = replace(
        observed_for(none, back, owner=RUNNING, statefulset=sts), claims_kept=("pvc-f87b6a85f3",)
    )
    assert not only(plan(again, SETTINGS, NOW), PatchStatefulSet)


def test_spread_constraints_keep_the_placeholder_on_nodes_with_their_key() -> None:
    def spread(pod: dict[str, Any]) -> None:
        pod["spec"]["topologySpreadConstraints"] = [
            {
                "maxSkew": 1,
                "topologyKey": "topology.kubernetes.io/zone",
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"app": "x"}},
            }
        ]

    body = created_body(observed_for(marked_pod("tekton-taskrun", before=spread)))
    assert _required(body) == [
        {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "Exists"}]}
    ]


def test_relocation_ands_its_never_back_into_the_runs_terms() -> None:
    a = marked_pod("tekton-taskrun", before=lambda p: _pool_affinity(p, "a", "b"))
    body = created_body(observed_for(a))
    state = relocation.first("kubernetes.io/hostname", "node-a", "node-b", NOW)
    steered = relocation.steer(
        body["spec"]["template"], {relocation.ANNOTATION_RELOCATIONS: state.encode()}
    )
    node_affinity = steered["spec"]["affinity"]["nodeAffinity"]
    assert node_affinity[REQUIRED_TERMS]["nodeSelectorTerms"] == [
        {
            "matchExpressions": [
                {"key": "pool", "operator": "In", "values": ["a", "b"]},
                {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["node-a"]},
            ]
        }
    ]


def test_image_resources_and_priority_class_come_from_settings() -> None:
    settings = Settings(
        mode=Mode.PIPELINERUNS,
        placeholder_image="example.com/pause:9",
        placeholder_resources={"requests": {"cpu": "2m", "memory": "4Mi"}},
        placeholder_priority_class="ci-high",
    )
    body = created_body(observed_for(marked_pod("tekton-taskrun")), settings)
    pod_spec = body["spec"]["template"]["spec"]
    assert pod_spec["containers"][0]["image"] == "example.com/pause:9"
    assert pod_spec["containers"][0]["resources"] == {"requests": {"cpu": "2m", "memory": "4Mi"}}
    assert pod_spec["priorityClassName"] == "ci-high"


def test_claim_templates_become_volume_claim_templates_with_mounts() -> None:
    pod = parsed(marked_pod("tekton-taskrun"))
    group = group_spec(pod.namespace, pod.marks.placeholder, [pod])
    assert group is not None
    pvc_spec = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    owner = OwnerRef("tekton.dev/v1", "PipelineRun", "pr-7f3k2", "uid-pr")
    template = ClaimTemplate("pvc-abc", "pvc-abc", pvc_spec)
    body = build_statefulset(group, SETTINGS, owner, [template])
    assert body["spec"]["volumeClaimTemplates"] == [
        {
            "metadata": {
                "name": "pvc-abc",
                "labels": {"app.kubernetes.io/managed-by": "coschedule"},
                "annotations": {"coschedule.dev/claim": "pvc-abc"},
                # Copied into the claim: deleting the run deletes it, whatever went first.
                "ownerReferences": [owner.as_owner_reference()],
            },
            "spec": pvc_spec,
        }
    ]
    mounts = body["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    assert [m["name"] for m in mounts] == ["pvc-abc"]
    assert "volumeClaimTemplates" not in build_statefulset(group, SETTINGS)["spec"]


def test_claims_made_by_our_templates_are_not_mounted_twice() -> None:
    pod = marked_pod("tekton-taskrun-two-workspaces")
    name = placeholder_of(pod)
    made = f"pvc-abc-{name}-0"  # as the webhook rewrites a template claim
    pod["metadata"]["annotations"]["coschedule.dev/claims"] = f"pvc-1f1344866c,{made}"
    one = parsed(pod)
    group = group_spec(one.namespace, name, [one])
    assert group is not None
    template = ClaimTemplate("pvc-abc", "", {"accessModes": ["ReadWriteOnce"]})
    body = build_statefulset(group, SETTINGS, None, [template])
    volumes = body["spec"]["template"]["spec"]["volumes"]
    assert [v["persistentVolumeClaim"]["claimName"] for v in volumes] == ["pvc-1f1344866c"]


def test_jobs_and_shipwright_and_argo_pods_each_get_a_placeholder() -> None:
    for fixture in ("job-pod", "shipwright-buildrun-pod", "argo-workflow-pod"):
        pod = marked_pod(fixture)
        [create] = only(plan(observed_for(pod), SETTINGS, NOW), CreateStatefulSet)
        assert create.name == placeholder_of(pod)


def test_statefulset_being_deleted_is_recreated_later_not_patched() -> None:
    observed = observed_for(marked_pod("tekton-taskrun"), owner=RUNNING)
    sts = existing_set(observed, deleting=True)
    actions = plan(replace(observed, statefulset=sts), SETTINGS, NOW)
    assert not only(actions, CreateStatefulSet)
    assert not only(actions, PatchStatefulSet)
    assert actions.requeue is not None


# ---- bad marks -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        (lambda m: m["annotations"].__setitem__("coschedule.dev/mode", "sometimes"), "not a mode"),
        (lambda m: m["annotations"].pop("coschedule.dev/run"), "missing"),
        (lambda m: m["annotations"].pop("coschedule.dev/topology-key"), "missing"),
        (
            lambda m: m["labels"].__setitem__(
                "coschedule.dev/placeholder", "affinity-assistant-0000000000"
            ),
            "is not",
        ),
        (lambda m: m["annotations"].__setitem__("coschedule.dev/run", "other-run"), "is not"),
    ],
)
def test_malformed_marks_are_skipped_with_a_reason(edit: Any, why: str) -> None:
    pod = marked_pod("tekton-taskrun")
    edit(pod["metadata"])
    result = shapes.parse_marked(shapes.slim_marked_pod(pod))
    assert isinstance(result, BadMark)
    assert why in result.reason
    assert result.name == "pr-7f3k2-build-pod"


def test_workspaces_marks_need_exactly_one_claim() -> None:
    pod = marked_pod("argo-workflow-pod", Mode.WORKSPACES)
    pod["metadata"]["annotations"]["coschedule.dev/claims"] = "a,b"
    result = shapes.parse_marked(shapes.slim_marked_pod(pod))
    assert isinstance(result, BadMark)
    assert "exactly one claim" in result.reason


# ---- cordons and taints -----------------------------------------------------------------


def _with_placeholder_pod(
    node: Node, tolerations: tuple[dict[str, Any], ...] = ()
) -> tuple[Observed, PlaceholderPod]:
    observed = observed_for(marked_pod("tekton-taskrun", node="worker-1"), owner=RUNNING)
    ppod = PlaceholderPod("ci", f"{observed.name}-0", node.name, tolerations, False)
    observed = replace(
        observed,
        statefulset=existing_set(observed),
        placeholder_pods=(ppod,),
        nodes={node.name: node},
    )
    return observed, ppod


def test_cordoned_node_deletes_the_placeholder_pod_only() -> None:
    observed, ppod = _with_placeholder_pod(Node("worker-1", True, ()))
    actions = plan(observed, SETTINGS, NOW)
    [delete] = only(actions, DeletePlaceholderPod)
    assert (delete.name, delete.node, delete.reason) == (ppod.name, "worker-1", "cordoned")
    assert delete.statefulset == observed.name
    event = delete.event
    assert "worker-1" in event.message
    assert "cordoned" in event.message
    assert event.statefulset == observed.name
    assert not only(actions, DeleteStatefulSet)
    assert not only(actions, CreateStatefulSet)


def test_schedulable_node_leaves_the_placeholder_alone() -> None:
    observed, _ = _with_placeholder_pod(Node("worker-1", False, ()))
    assert plan(observed, SETTINGS, NOW) == Plan()


@pytest.mark.parametrize(
    "taint",
    [
        Taint("node.kubernetes.io/not-ready", "", "NoExecute"),
        Taint("ToBeDeletedByClusterAutoscaler", "1732171000", "NoSchedule"),
        Taint("dedicated", "gpu", "NoSchedule"),
    ],
)
def test_untolerated_taints_move_the_placeholder(taint: Taint) -> None:
    # The DefaultTolerationSeconds tolerations (300 s) only delay an eviction: they do not count.
    default = DEFAULT_TOLERATIONS
    observed, _ = _with_placeholder_pod(Node("worker-1", False, (taint,)), default)
    [delete] = only(plan(observed, SETTINGS, NOW), DeletePlaceholderPod)
    assert delete.reason == "tainted"
    assert taint.key in delete.message


def _pinned(name: str, key: str, *values: str) -> VolumeTopology:
    """A bound volume usable only on nodes whose ``key`` is one of ``values``."""
    term = {"matchExpressions": [{"key": key, "operator": "In", "values": list(values)}]}
    return VolumeTopology(name, (term,))


@pytest.mark.parametrize(
    "node",
    [
        Node("worker-1", True, ()),
        Node("worker-1", False, (Taint("dedicated", "gpu", "NoSchedule"),)),
    ],
)
def test_a_placeholder_pinned_by_its_node_local_volume_stays_explained(node: Node) -> None:
    """Its volume can be used on this node only: moved, it would sit Pending and the run's
    data would stay here. It stays, and a Warning says why and what can be done."""
    observed, ppod = _with_placeholder_pod(node)
    observed = replace(
        observed,
        placeholder_volumes=(
            ("cache", _pinned("pv-shared", "topology.kubernetes.io/zone", "z1")),
            ("source", _pinned("pv-local-1", "kubernetes.io/hostname", "worker-1")),
        ),
    )
    actions = plan(observed, SETTINGS, NOW)
    assert not only(actions, DeletePlaceholderPod)
    [hold] = only(actions, HoldPinnedPlaceholder)
    assert (hold.name, hold.node, hold.statefulset) == (ppod.name, "worker-1", observed.name)
    assert hold.reason == ("cordoned" if node.unschedulable else "tainted")
    assert hold.event.type == "Warning"
    assert hold.event.reason == "PlaceholderPinned"
    assert "claim source, volume pv-local-1" in hold.event.message
    assert "pv-shared" not in hold.event.message  # a zonal volume does not pin it
    assert "uncordon or untaint" in hold.event.message


@pytest.mark.parametrize(
    "volume",
    [
        _pinned("pv-zonal", "topology.kubernetes.io/zone", "z1"),
        _pinned("pv-two-nodes", "kubernetes.io/hostname", "worker-1", "worker-2"),
        _pinned("pv-elsewhere", "kubernetes.io/hostname", "worker-2"),
        VolumeTopology("pv-anywhere"),
    ],
)
def test_a_volume_usable_elsewhere_does_not_pin_the_placeholder(volume: VolumeTopology) -> None:
    observed, _ = _with_placeholder_pod(Node("worker-1", True, ()))
    observed = replace(observed, placeholder_volumes=(("source", volume),))
    actions = plan(observed, SETTINGS, NOW)
    assert only(actions, DeletePlaceholderPod)
    assert not only(actions, HoldPinnedPlaceholder)


def test_tolerated_and_soft_taints_do_not_move_it() -> None:
    node = Node(
        "worker-1",
        False,
        (
            Taint("dedicated", "ci", "NoSchedule"),
            Taint("ci.example.com/spot", "yes", "NoSchedule"),
            Taint("busy", "", "PreferNoSchedule"),
        ),
    )
    tolerations = (
        {"key": "dedicated", "operator": "Equal", "value": "ci", "effect": "NoSchedule"},
        {"key": "ci.example.com/spot", "operator": "Exists"},
    )
    observed, _ = _with_placeholder_pod(node, tolerations)
    assert not only(plan(observed, SETTINGS, NOW), DeletePlaceholderPod)


def test_pods_already_terminating_or_unscheduled_are_not_deleted_again() -> None:
    observed, ppod = _with_placeholder_pod(Node("worker-1", True, ()))
    for other in (replace(ppod, deleting=True), replace(ppod, node_name="")):
        assert not only(
            plan(replace(observed, placeholder_pods=(other,)), SETTINGS, NOW), DeletePlaceholderPod
        )


# ---- a dead node: its kubelet stopped reporting -----------------------------------------

UNREACHABLE = Taint("node.kubernetes.io/unreachable", "", "NoExecute")
UNREACHABLE_NOSCHEDULE = Taint("node.kubernetes.io/unreachable", "", "NoSchedule")
NOT_READY = Taint("node.kubernetes.io/not-ready", "", "NoExecute")


def _on_dead_node(node: Node, **pod: Any) -> tuple[Observed, PlaceholderPod]:
    observed, ppod = _with_placeholder_pod(node, DEFAULT_TOLERATIONS)
    ppod = replace(ppod, uid="uid-ppod-1", **pod)
    return replace(observed, placeholder_pods=(ppod,)), ppod


SILENT_SINCE = NOW - NODE_DOWN_SECONDS  # silent long enough to be taken for dead


@pytest.mark.parametrize(
    "node",
    [
        Node(
            "worker-1",
            False,
            (UNREACHABLE_NOSCHEDULE, UNREACHABLE),
            ready="Unknown",
            ready_since=SILENT_SINCE,
        ),
        Node("worker-1", False, (UNREACHABLE,)),  # the taint, no Ready condition at all
        Node("worker-1", False, (), ready="Unknown", ready_since=SILENT_SINCE - 60),
    ],
)
def test_a_placeholder_on_a_node_whose_kubelet_stopped_reporting_is_force_deleted(
    node: Node,
) -> None:
    """Its kubelet would never confirm a graceful delete: the pod would stay Terminating and
    the StatefulSet would never make it again. A placeholder runs nothing: force it, once,
    only the pod seen (its uid), and say so."""
    observed, ppod = _on_dead_node(node)
    result = plan(observed, SETTINGS, NOW)
    [delete] = only(result, DeletePlaceholderPod)
    assert (delete.name, delete.node, delete.force, delete.uid) == (
        ppod.name,
        "worker-1",
        True,
        "uid-ppod-1",
    )
    assert delete.reason == "node-down"
    assert delete.event.reason == "PlaceholderMoved"
    assert delete.event.message.startswith(f"force-deleted placeholder pod {ppod.name}")
    assert "worker-1" in delete.event.message
    assert "runs nothing" in delete.event.message
    assert not only(result, DeleteStatefulSet)


@pytest.mark.parametrize("deleting", [False, True])
def test_a_node_silent_for_a_moment_is_left_alone_until_it_has_been_silent_long(
    deleting: bool,
) -> None:
    """A control plane back from an outage marks nodes Unknown until their kubelets post
    again (within about 10 s): nothing moves for that, not even gracefully (a move would
    split a run whose task runs there). Looked at again when the wait is over."""
    node = Node("worker-1", False, (UNREACHABLE,), ready="Unknown", ready_since=NOW - 5)
    observed, _ = _on_dead_node(node, deleting=deleting, deletion_due=NOW - 1)
    result = plan(observed, SETTINGS, NOW)
    assert not only(result, DeletePlaceholderPod)
    assert result.requeue is not None
    assert result.requeue.after == pytest.approx(NODE_DOWN_SECONDS - 5)
    [forced] = only(plan(observed, SETTINGS, NOW + NODE_DOWN_SECONDS), DeletePlaceholderPod)
    assert forced.force


@pytest.mark.parametrize("deleting", [False, True])
@pytest.mark.parametrize("taints", [(UNREACHABLE_NOSCHEDULE, UNREACHABLE), ()])
def test_a_silent_node_whose_kubelet_renews_its_lease_is_alive_nothing_moves(
    deleting: bool, taints: tuple[Taint, ...]
) -> None:
    """After a kube-apiserver restart under load a kubelet can take longer than
    NODE_DOWN_SECONDS to post Ready again, while it renews its Lease as always (found by the
    sustained load: three runs' placeholders forced off live nodes, each run's next task
    on another node). A kubelet that renews is alive: no force, no move, no hold; looked
    at again when the renewal would be old."""
    node = Node("worker-1", False, taints, ready="Unknown", ready_since=SILENT_SINCE - 30)
    observed, _ = _on_dead_node(node, deleting=deleting, deletion_due=NOW - 60)
    observed = replace(observed, node_renewed={"worker-1": NOW - 4})
    result = plan(observed, SETTINGS, NOW)
    assert not only(result, DeletePlaceholderPod)
    assert not only(result, HoldPinnedPlaceholder)
    assert result.requeue is not None
    assert result.requeue.after == pytest.approx(NODE_DOWN_SECONDS - 4)
    # The same node, once its kubelet has not renewed for NODE_DOWN_SECONDS: dead, forced.
    later = NOW + NODE_DOWN_SECONDS
    [forced] = only(plan(observed, SETTINGS, later), DeletePlaceholderPod)
    assert (forced.force, forced.reason) == (True, "node-down")


@pytest.mark.parametrize(
    "renewed",
    [
        {"worker-1": NOW - NODE_DOWN_SECONDS},  # renewed last as long ago as it is silent
        {"worker-1": SILENT_SINCE - 40},  # before it went silent: the usual dead node
        {"worker-2": NOW},  # another node's
        {},  # not read (no Role, a refused read)
    ],
)
def test_a_silent_node_whose_lease_is_old_or_unread_is_dead_as_before(
    renewed: dict[str, float],
) -> None:
    node = Node("worker-1", False, (UNREACHABLE,), ready="Unknown", ready_since=SILENT_SINCE)
    observed, ppod = _on_dead_node(node)
    [forced] = only(
        plan(replace(observed, node_renewed=renewed), SETTINGS, NOW), DeletePlaceholderPod
    )
    assert (forced.name, forced.force) == (ppod.name, True)


def test_a_renewing_kubelet_on_a_node_holding_the_runs_data_raises_no_warning() -> None:
    """A node-local volume's placeholder on a silent node is held and explained; on a node
    whose kubelet renews, there is nothing to explain yet."""
    node = Node("worker-1", False, (UNREACHABLE,), ready="Unknown", ready_since=SILENT_SINCE)
    observed, _ = _on_dead_node(node)
    local = _pinned("pv-local-1", "kubernetes.io/hostname", "worker-1")
    held = replace(observed, placeholder_volumes=(("source", local),))
    assert only(plan(held, SETTINGS, NOW), HoldPinnedPlaceholder)
    renewing = replace(held, node_renewed={"worker-1": NOW - 1})
    assert not only(plan(renewing, SETTINGS, NOW), HoldPinnedPlaceholder)


def test_every_node_silent_is_the_control_planes_problem_nothing_is_forced() -> None:
    node = Node("worker-1", False, (UNREACHABLE,), ready="Unknown", ready_since=SILENT_SINCE)
    observed, _ = _on_dead_node(node)
    result = plan(replace(observed, all_nodes_silent=True), SETTINGS, NOW)
    assert not only(result, DeletePlaceholderPod)


@pytest.mark.parametrize(
    ("taint", "deleting"),
    [
        (UNREACHABLE, True),
        (UNREACHABLE, False),
        (UNREACHABLE_NOSCHEDULE, False),
        (NOT_READY, False),
    ],
)
def test_a_lifecycle_taint_left_on_a_node_ready_again_moves_nothing(
    taint: Taint, deleting: bool
) -> None:
    """After a kube-apiserver restart the node lifecycle controller marks every node
    Unknown and taints it; their kubelets post Ready again within seconds and the taint is
    lifted on the controller's next pass. In between, a live placeholder there is not moved
    (found by the sustained load's API server restart: the placeholder of a run whose first
    task had run on the node was deleted "so that it moves", and the run's next tasks ran on
    another node), nor a terminating one forced."""
    node = Node("worker-1", False, (taint,), ready="True", ready_since=NOW - 1)
    observed, _ = _on_dead_node(node, deleting=deleting, deletion_due=NOW - 60)
    result = plan(observed, SETTINGS, NOW)
    assert not only(result, DeletePlaceholderPod)
    assert not only(result, HoldPinnedPlaceholder)


@pytest.mark.parametrize("due", [NOW + 1, NOW - 300])  # grace not over yet; long over
def test_a_terminating_placeholder_on_a_silent_node_is_forced(due: float) -> None:
    """Deleted gracefully earlier (a cordon, the taint manager, before the node went
    silent): nobody will finish that delete, whatever its grace period says."""
    node = Node("worker-1", False, (UNREACHABLE,), ready="Unknown", ready_since=SILENT_SINCE)
    observed, ppod = _on_dead_node(node, deleting=True, deletion_due=due)
    [delete] = only(plan(observed, SETTINGS, NOW), DeletePlaceholderPod)
    assert (delete.name, delete.force, delete.uid) == (ppod.name, True, "uid-ppod-1")


def test_a_not_ready_node_whose_kubelet_reports_gets_the_grace_period_first() -> None:
    """Ready False: the kubelet still reports and may finish the delete itself. It has the
    pod's grace period and a few seconds more; then the delete is forced."""
    node = Node("worker-1", False, (NOT_READY,), ready="False")
    observed, ppod = _on_dead_node(node)
    [delete] = only(plan(observed, SETTINGS, NOW), DeletePlaceholderPod)
    assert (delete.force, delete.reason) == (False, "tainted")  # graceful first
    assert delete.event.message.startswith(f"deleted placeholder pod {ppod.name}: ")
    assert "so that it moves" not in delete.event.message  # it moves once gone, not before

    deleting, _ = _on_dead_node(node, deleting=True, deletion_due=NOW + 1)
    waiting = plan(deleting, SETTINGS, NOW)
    assert not only(waiting, DeletePlaceholderPod)
    assert waiting.requeue is not None
    assert waiting.requeue.after == pytest.approx(1 + STRANDED_DELETE_SECONDS)

    later = NOW + 1 + STRANDED_DELETE_SECONDS
    [forced] = only(plan(deleting, SETTINGS, later), DeletePlaceholderPod)
    assert (forced.force, forced.reason, forced.uid) == (True, "node-down", "uid-ppod-1")
    assert "did not finish" in forced.event.message


@pytest.mark.parametrize(
    "node",
    [
        Node("worker-1", True, (), ready="True"),  # cordoned: its kubelet finishes the delete
        Node("worker-1", False, (Taint("dedicated", "gpu", "NoSchedule"),), ready="True"),
    ],
)
def test_a_terminating_placeholder_on_a_reporting_node_is_left_to_its_kubelet(node: Node) -> None:
    observed, _ = _on_dead_node(node, deleting=True, deletion_due=NOW - 600)
    result = plan(observed, SETTINGS, NOW)
    assert not only(result, DeletePlaceholderPod)
    assert result.requeue is None


def test_a_placeholder_pinned_to_a_dead_node_by_its_volume_is_not_forced() -> None:
    """Its data is on that node only: made again elsewhere it could run nowhere."""
    node = Node("worker-1", False, (UNREACHABLE,), ready="Unknown", ready_since=SILENT_SINCE)
    local = (("source", _pinned("pv-local-1", "kubernetes.io/hostname", "worker-1")),)
    for deleting in (False, True):
        observed, _ = _on_dead_node(node, deleting=deleting, deletion_due=NOW - 60)
        result = plan(replace(observed, placeholder_volumes=local), SETTINGS, NOW)
        assert not only(result, DeletePlaceholderPod)
        held = only(result, HoldPinnedPlaceholder)
        assert bool(held) is not deleting
        if held:
            assert held[0].reason == "node-down"
            assert "stopped reporting" in held[0].event.message


def test_a_placeholder_whose_node_object_is_gone_is_left_to_the_pod_garbage_collector() -> None:
    node = Node("worker-1", False, (UNREACHABLE,), ready="Unknown", ready_since=SILENT_SINCE)
    observed, _ = _on_dead_node(node)
    assert not only(plan(replace(observed, nodes={}), SETTINGS, NOW), DeletePlaceholderPod)


# ---- teardown -------------------------------------------------------------------------


def _quiet(owner: OwnerState | None, **kwargs: Any) -> Observed:
    pod = marked_pod("tekton-taskrun", phase="Succeeded")
    observed = observed_for(pod, owner=owner, **kwargs)
    live_twin = observed_for(marked_pod("tekton-taskrun"), owner=owner)
    return replace(observed, statefulset=existing_set(live_twin))


def test_owner_completion_tears_the_run_down() -> None:
    done = replace(RUNNING, status=OwnerStatus.DONE, detail="PipelineRun pr-7f3k2 Succeeded=True")
    observed = replace(_quiet(done), claims_to_delete=("pvc-a-affinity-assistant-x-0",))
    actions = plan(observed, SETTINGS, NOW)
    [delete] = only(actions, DeleteStatefulSet)
    assert delete.name == observed.name
    assert "Succeeded=True" in delete.why
    assert only(actions, DeleteClaim) == [DeleteClaim("ci", "pvc-a-affinity-assistant-x-0")]
    assert [e.reason for e in only(actions, RecordEvent)] == ["PlaceholderDeleted"]


def test_running_owner_keeps_a_quiet_run_and_asks_again_later() -> None:
    # A gap between tasks: no live pod for an hour, but the PipelineRun still runs.
    observed = replace(_quiet(RUNNING), idle_since=NOW - 3600)
    actions = plan(observed, SETTINGS, NOW + 10)
    assert not only(actions, DeleteStatefulSet)
    requeue = actions.requeue
    assert requeue is not None
    assert 0 < requeue.after <= OWNER_RECHECK_SECONDS


def test_unknown_owner_status_never_tears_down() -> None:
    unknown = replace(RUNNING, status=OwnerStatus.UNKNOWN)
    actions = plan(replace(_quiet(unknown), idle_since=NOW - 10_000), SETTINGS, NOW)
    assert not only(actions, DeleteStatefulSet)


def test_live_pods_keep_the_placeholder_even_when_the_owner_reports_done() -> None:
    done = replace(RUNNING, status=OwnerStatus.DONE)
    observed = observed_for(marked_pod("tekton-taskrun"), owner=done)
    observed = replace(observed, statefulset=existing_set(observed))
    assert not only(plan(observed, SETTINGS, NOW), DeleteStatefulSet)


def test_a_done_run_s_live_pods_get_no_new_placeholder() -> None:
    # A run deleted as it finished, its last pod still Running: the garbage collector took
    # the StatefulSet first. Its engine makes no pod for it any more.
    gone = replace(RUNNING, status=OwnerStatus.DONE, detail="PipelineRun pr-7f3k2 is gone")
    observed = observed_for(marked_pod("tekton-taskrun"), owner=gone)
    result = plan(observed, SETTINGS, NOW)
    assert not result.actions
    assert result.note is not None
    assert "PipelineRun pr-7f3k2 is gone" in result.note
    # While it runs, its pods get theirs.
    assert only(plan(observed_for(marked_pod("tekton-taskrun")), SETTINGS, NOW), CreateStatefulSet)


def test_runs_without_owner_go_after_the_idle_grace() -> None:
    no_owner = OwnerState(None, detail="no pod has a controller owner")
    observed = replace(_quiet(no_owner), idle_since=NOW - 100)
    actions = plan(observed, SETTINGS, NOW)
    assert not only(actions, DeleteStatefulSet)
    requeue = actions.requeue
    assert requeue is not None
    assert requeue.after == pytest.approx(SETTINGS.idle_grace_seconds - 100)
    later = plan(observed, SETTINGS, NOW + SETTINGS.idle_grace_seconds)
    assert only(later, DeleteStatefulSet)


def test_idle_grace_counts_from_the_last_pod_end_after_a_restart() -> None:
    pod = marked_pod("job-pod", phase="Succeeded", finished_at="2026-11-21T06:10:00Z")
    observed = observed_for(pod)
    live = observed_for(marked_pod("job-pod"))
    observed = replace(observed, statefulset=existing_set(live), idle_since=None)
    ended = parse_time("2026-11-21T06:10:00Z")
    assert ended is not None
    assert not only(plan(observed, SETTINGS, ended + 299), DeleteStatefulSet)
    assert only(plan(observed, SETTINGS, ended + 301), DeleteStatefulSet)


def test_workspaces_groups_use_idle_grace_even_with_an_owner() -> None:
    settings = Settings(mode=Mode.WORKSPACES, idle_grace_seconds=60)
    pod = marked_pod("argo-workflow-pod", Mode.WORKSPACES, phase="Failed")
    live = observed_for(marked_pod("argo-workflow-pod", Mode.WORKSPACES))
    observed = replace(
        observed_for(pod), statefulset=existing_set(live, settings), idle_since=NOW - 61
    )
    assert only(plan(observed, settings, NOW), DeleteStatefulSet)


def test_workspaces_group_goes_at_once_when_its_claim_is_deleted() -> None:
    # Found on the real stack: a PipelineRun deleted in workspaces mode left Tekton's claim
    # Terminating, held by our placeholder, for the whole idle grace (5 minutes).
    settings = Settings(mode=Mode.WORKSPACES, idle_grace_seconds=300)
    pod = marked_pod("job-pod", Mode.WORKSPACES, phase="Succeeded")
    live = observed_for(marked_pod("job-pod", Mode.WORKSPACES))
    quiet = replace(observed_for(pod), statefulset=existing_set(live, settings), idle_since=NOW)
    waiting = plan(quiet, settings, NOW + 10)
    assert not only(waiting, DeleteStatefulSet)
    deleted = plan(replace(quiet, claims_gone=("etl-scratch",)), settings, NOW + 10)
    [delete] = only(deleted, DeleteStatefulSet)
    assert "claim etl-scratch deleted" in delete.why
    [event] = only(deleted, RecordEvent)
    assert event.reason == "PlaceholderDeleted"
    assert "etl-scratch" in event.message


def test_a_quiet_workspaces_group_is_looked_at_again_before_its_grace_ends() -> None:
    # So that a claim deleted meanwhile is seen: as often as a quiet run's owner is asked.
    settings = Settings(mode=Mode.WORKSPACES, idle_grace_seconds=300)
    pod = marked_pod("job-pod", Mode.WORKSPACES, phase="Succeeded")
    live = observed_for(marked_pod("job-pod", Mode.WORKSPACES))
    quiet = replace(observed_for(pod), statefulset=existing_set(live, settings), idle_since=NOW)
    for quiet_for in (0.0, 3.0, 100.0):
        requeue = plan(quiet, settings, NOW + quiet_for).requeue
        assert requeue is not None
        assert requeue.after <= min(OWNER_RECHECK_SECONDS, max(2.0, quiet_for))
    # Near the end of the grace, the grace itself is the next look.
    requeue = plan(quiet, settings, NOW + 295).requeue
    assert requeue is not None
    assert requeue.after == pytest.approx(5)


def test_statefulset_alone_after_restart_uses_its_own_annotations() -> None:
    # No pod left in the cache: the StatefulSet says it is per-run and who owns it.
    live = observed_for(marked_pod("tekton-taskrun"), owner=RUNNING)
    sts = existing_set(live)
    bare = Observed("ci", live.name, statefulset=sts, owner=RUNNING, idle_since=NOW - 9999)
    assert not only(plan(bare, SETTINGS, NOW), DeleteStatefulSet)
    gone = replace(RUNNING, status=OwnerStatus.DONE, detail="PipelineRun pr-7f3k2 was deleted")
    assert only(plan(replace(bare, owner=gone), SETTINGS, NOW), DeleteStatefulSet)


def test_owner_check_is_due_only_for_quiet_runs_and_not_too_often() -> None:
    assert not owner_check_due(True, RUNNING, NOW + 999)
    assert not owner_check_due(False, RUNNING, NOW + 1)
    assert owner_check_due(False, RUNNING, NOW + OWNER_RECHECK_SECONDS)
    assert owner_check_due(False, OwnerState(PIPELINERUN), NOW)
    assert not owner_check_due(False, OwnerState(None), NOW)
    assert not owner_check_due(False, replace(RUNNING, status=OwnerStatus.DONE), NOW + 999)


@pytest.mark.parametrize(
    ("kind", "status", "done"),
    [
        ("PipelineRun", {"conditions": [{"type": "Succeeded", "status": "Unknown"}]}, False),
        ("PipelineRun", {"conditions": [{"type": "Succeeded", "status": "True"}]}, True),
        ("TaskRun", {"conditions": [{"type": "Succeeded", "status": "False"}]}, True),
        ("BuildRun", {"conditions": [{"type": "Succeeded", "status": "Unknown"}]}, False),
        ("BuildRun", {"conditions": [{"type": "Succeeded", "status": "False"}]}, True),
        ("Workflow", {"phase": "Running"}, False),
        ("Workflow", {"phase": "Error"}, True),
        ("Workflow", {"phase": "Succeeded"}, True),
        ("Job", {"conditions": [{"type": "Complete", "status": "False"}]}, False),
        ("Job", {"conditions": [{"type": "Failed", "status": "True"}]}, True),
        ("Job", {}, False),
    ],
)
def test_owner_completion_per_kind(kind: str, status: dict[str, Any], done: bool) -> None:
    ref = OwnerRef("x/v1", kind, "run", "u1")
    obj = {"metadata": {"name": "run", "uid": "u1"}, "status": status}
    assert (owners.completion(ref, obj) is not None) is done


def test_owner_deleted_or_replaced_is_done() -> None:
    ref = OwnerRef("x/v1", "Workflow", "run", "u1")
    assert owners.completion(ref, None)
    running = {"phase": "Running"}
    assert owners.completion(ref, {"metadata": {"uid": "u2"}, "status": running})
    assert owners.completion(
        ref, {"metadata": {"uid": "u1", "deletionTimestamp": "2026-01-01T00:00:00Z"}}
    )


def test_owner_walk_goes_from_taskrun_to_pipelinerun_or_buildrun_only() -> None:
    taskrun = OwnerRef("tekton.dev/v1", "TaskRun", "tr", "u")

    def owned_by(kind: str) -> dict[str, Any]:
        ref = {"apiVersion": "x/v1", "kind": kind, "name": "p", "uid": "pu", "controller": True}
        return {"metadata": {"ownerReferences": [ref]}}

    parent = owners.parent_to_follow(taskrun, owned_by("PipelineRun"))
    assert parent is not None
    assert parent.kind == "PipelineRun"
    parent = owners.parent_to_follow(taskrun, owned_by("BuildRun"))
    assert parent is not None
    assert parent.kind == "BuildRun"
    assert owners.parent_to_follow(taskrun, owned_by("Something")) is None
    job = OwnerRef("batch/v1", "Job", "j", "u")
    assert owners.parent_to_follow(job, owned_by("CronJob")) is None


# ---- drift: hand edits -----------------------------------------------------------------


def test_hand_scaled_statefulset_is_patched_back_not_recreated() -> None:
    observed = observed_for(marked_pod("tekton-taskrun"), owner=RUNNING)
    sts = existing_set(observed, replicas=3)
    actions = plan(replace(observed, statefulset=sts), SETTINGS, NOW)
    [patch] = only(actions, PatchStatefulSet)
    assert patch.patch["spec"] == {"replicas": 1}
    assert patch.patch["metadata"]["resourceVersion"] == "42"
    assert not only(actions, DeleteStatefulSet)
    assert not only(actions, CreateStatefulSet)


def test_unchanged_statefulset_needs_no_patch() -> None:
    observed = observed_for(marked_pod("tekton-taskrun"), owner=RUNNING)
    assert plan(replace(observed, statefulset=existing_set(observed)), SETTINGS, NOW) == Plan()


def test_removed_labels_and_new_claims_are_patched_in() -> None:
    first = marked_pod("tekton-taskrun", created="2026-11-21T06:00:00Z")
    observed = observed_for(first, owner=RUNNING)
    sts = existing_set(observed, labels={"app.kubernetes.io/instance": observed.name})
    second = marked_pod("tekton-taskrun-two-workspaces", created="2026-11-21T06:01:00Z")
    grown = observed_for(first, second, owner=RUNNING)
    [patch] = only(plan(replace(grown, statefulset=sts), SETTINGS, NOW), PatchStatefulSet)
    assert patch.patch["metadata"]["labels"] == {
        "app.kubernetes.io/component": "affinity-assistant",
        "app.kubernetes.io/managed-by": "coschedule",
    }
    volumes = patch.patch["spec"]["template"]["spec"]["volumes"]
    assert [v["persistentVolumeClaim"]["claimName"] for v in volumes] == [
        "pvc-1f1344866c",
        "pvc-f87b6a85f3",
    ]
    group = group_spec("ci", grown.name, grown.pods)
    assert group is not None
    digest = template_hash(pod_template(group, SETTINGS))
    assert patch.patch["metadata"]["annotations"][ANNOTATION_TEMPLATE_HASH] == digest


def test_owner_resolved_after_creation_is_added_to_the_owner_references() -> None:
    observed = observed_for(marked_pod("tekton-taskrun"), owner=None)
    sts = existing_set(observed)
    assert not sts.owner_references
    [patch] = only(
        plan(replace(observed, statefulset=sts, owner=RUNNING), SETTINGS, NOW), PatchStatefulSet
    )
    assert patch.patch["metadata"]["ownerReferences"][0]["uid"] == "uid-pr"


def test_marks_keep_the_pods_controller_owner_for_owner_resolution() -> None:
    pod = parsed(marked_pod("tekton-taskrun"))
    assert pod.owner == OwnerRef(
        "tekton.dev/v1", "TaskRun", "pr-7f3k2-build", "5ec72d68-3760-5cfd-8159-dfba55008a34"
    )
    assert parsed(marked_pod("argo-workflow-pod")).owner is not None
    assert parsed(marked_pod("job-pod")).owner is not None


def test_update_strategy_is_kept_on_delete_so_template_patches_never_restart_it() -> None:
    observed = observed_for(marked_pod("tekton-taskrun"), owner=RUNNING)
    sts = existing_set(observed, update_strategy="RollingUpdate")
    [patch] = only(plan(replace(observed, statefulset=sts), SETTINGS, NOW), PatchStatefulSet)
    assert patch.patch["spec"] == {"updateStrategy": {"type": "OnDelete", "rollingUpdate": None}}


def test_owner_is_asked_again_soon_after_the_run_goes_quiet_then_less_often() -> None:
    """The last pod ends a moment before Tekton marks the PipelineRun done: the next owner
    check comes within seconds, not a whole period later; a long gap backs off."""
    from datetime import UTC, datetime

    def requeue_after(quiet_for: float) -> float:
        ended = datetime.fromtimestamp(NOW - quiet_for, UTC).isoformat().replace("+00:00", "Z")
        sts = existing_set(observed_for(marked_pod("tekton-taskrun"), owner=RUNNING))
        pod = marked_pod("tekton-taskrun", phase="Succeeded", finished_at=ended)
        observed = observed_for(pod, owner=RUNNING, statefulset=sts)  # checked just now
        requeue = plan(observed, SETTINGS, NOW).requeue
        assert requeue is not None
        return float(requeue.after)

    assert requeue_after(0.5) == pytest.approx(2.0)
    assert requeue_after(10.0) == pytest.approx(10.0)
    assert requeue_after(600.0) == pytest.approx(OWNER_RECHECK_SECONDS)
    running = RUNNING
    assert not owner_check_due(False, running, NOW + 1.0, quiet_for=1.0)
    assert owner_check_due(False, running, NOW + 2.0, quiet_for=1.0)
    assert not owner_check_due(False, running, NOW + 20.0, quiet_for=300.0)


# ---- owner lookup failures are observed, and plan decides ----------------------------

LOOKUP_FAILED = OwnerState(None, OwnerStatus.LOOKUP_FAILED, NOW, "503 Service Unavailable")


def test_failed_owner_lookup_with_waiting_pods_creates_without_owner_and_looks_again() -> None:
    result = plan(observed_for(marked_pod("tekton-taskrun"), owner=LOOKUP_FAILED), SETTINGS, NOW)
    [create] = only(result, CreateStatefulSet)
    assert "ownerReferences" not in create.body["metadata"]
    assert result.requeue is not None
    assert result.requeue.after == OWNER_RETRY_SECONDS
    assert "503" in str(result.warning)
    assert result.retry is None


def test_failed_owner_lookup_with_a_placeholder_decides_nothing_and_retries() -> None:
    observed = observed_for(marked_pod("tekton-taskrun"), owner=LOOKUP_FAILED)
    result = plan(replace(observed, statefulset=existing_set(observed)), SETTINGS, NOW)
    assert result == Plan(retry="503 Service Unavailable")
