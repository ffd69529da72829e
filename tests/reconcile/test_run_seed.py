"""A PipelineRun's placeholder made at the run's creation (``run_seed``) and what ``plan``
does with it: table tests of the pure decisions, no API."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import pytest

from coschedule.config.settings import Settings
from coschedule.k8s.timefmt import micro_time, parse_time
from coschedule.marks import (
    ANNOTATION_RUN_ADMITTED,
    LABEL_ENABLED,
    LABEL_MODE,
    Mode,
    Placement,
    run_placeholder,
)
from coschedule.reconcile.model import (
    CreateStatefulSet,
    DeleteStatefulSet,
    Observed,
    OwnerRef,
    OwnerState,
    OwnerStatus,
    PatchStatefulSet,
)
from coschedule.reconcile.placeholder import group_spec, pod_template
from coschedule.reconcile.plan import plan
from coschedule.reconcile.run_seed import (
    candidate,
    ended,
    namespace_changed,
    orphan_done,
    orphan_run,
    placeholder_key,
    run_begun,
    same_for_seed,
    seed,
    seed_pod,
    slim_run,
)
from tests.reconcile.pods import marked_pod, parsed
from tests.reconcile.test_plan import existing_set, only

CREATED = "2026-11-21T06:00:00Z"
T0 = parse_time(CREATED) or 0.0
NOW = T0 + 1.0
SETTINGS = Settings(mode=Mode.PIPELINERUNS, placement=Placement.AUTO)
ENABLED = {LABEL_ENABLED: "true"}
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
POOL_AB = {
    "nodeAffinity": {
        REQUIRED: {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a", "b"]}]}
            ]
        }
    }
}
TOLERATE_GPU = {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}


def pipeline_run(**spec: Any) -> dict[str, Any]:
    """A PipelineRun as stored (``spec`` over its pipelineRef), labels as the fixture's."""
    return {
        "apiVersion": "tekton.dev/v1",
        "kind": "PipelineRun",
        "metadata": {
            "name": "pr-7f3k2",
            "namespace": "ci",
            "uid": "uid-pr",
            "resourceVersion": "7",
            "creationTimestamp": CREATED,
            "labels": {"tekton.dev/pipeline": "build-and-test"},
            "managedFields": [{"manager": "kubectl"}],
        },
        "spec": {"pipelineRef": {"name": "build-and-test"}, **spec},
        "status": {"conditions": [{"type": "Succeeded", "status": "Unknown"}]},
    }


def with_template(**template: Any) -> dict[str, Any]:
    return pipeline_run(taskRunTemplate={"podTemplate": template, "serviceAccountName": "ci"})


def labelled(run: dict[str, Any], **labels: str) -> dict[str, Any]:
    run["metadata"]["labels"].update(labels)
    return run


def done(run: dict[str, Any], status: str) -> dict[str, Any]:
    run["status"] = {"conditions": [{"type": "Succeeded", "status": status}]}
    return run


def deleting(run: dict[str, Any]) -> dict[str, Any]:
    run["metadata"]["deletionTimestamp"] = "2026-11-21T06:00:01Z"
    return run


# ---- a placeholder a dead leader made with no owner ----------------------------------

ORPHAN = {
    "coschedule.dev/mode": "pipelineruns",
    "coschedule.dev/run": "pr-7f3k2",
    "coschedule.dev/run-label": "tekton.dev/pipelineRun",
}


@pytest.mark.parametrize(
    ("annotations", "run"),
    [
        pytest.param(ORPHAN, "pr-7f3k2", id="a PipelineRun's"),
        pytest.param(
            {**ORPHAN, "coschedule.dev/mode": "isolate-pipelinerun"}, "pr-7f3k2", id="isolated"
        ),
        pytest.param({**ORPHAN, "coschedule.dev/mode": "workspaces"}, None, id="a claim's group"),
        pytest.param(
            {**ORPHAN, "coschedule.dev/run-label": "workflows.argoproj.io/workflow"},
            None,
            id="an engine not watched",
        ),
        pytest.param(
            {k: v for k, v in ORPHAN.items() if k != "coschedule.dev/run-label"},
            None,
            id="made before the run label was written",
        ),
        pytest.param({**ORPHAN, "coschedule.dev/run": ""}, None, id="no run"),
    ],
)
def test_only_a_pipelineruns_placeholder_names_a_run_to_read(
    annotations: dict[str, str], run: str | None
) -> None:
    assert orphan_run(annotations) == run


@pytest.mark.parametrize(
    ("stored", "why"),
    [
        pytest.param(None, "PipelineRun pr-7f3k2 is gone", id="gone"),
        pytest.param(done(pipeline_run(), "True"), "PipelineRun pr-7f3k2 is done", id="succeeded"),
        pytest.param(done(pipeline_run(), "False"), "PipelineRun pr-7f3k2 is done", id="failed"),
        pytest.param(
            deleting(pipeline_run()), "PipelineRun pr-7f3k2 is being deleted", id="deleting"
        ),
        pytest.param(pipeline_run(), None, id="running: may still make pods"),
        pytest.param(pipeline_run(status="PipelineRunPending"), None, id="pending: may start"),
    ],
)
def test_an_owner_less_placeholder_goes_when_its_run_is_done_or_gone(
    stored: dict[str, Any] | None, why: str | None
) -> None:
    slim = slim_run(stored) if stored is not None else None
    assert orphan_done("pr-7f3k2", slim) == why


@pytest.mark.parametrize(
    ("cached", "why"),
    [
        pytest.param(None, "PipelineRun pr-7f3k2 is gone", id="deleted"),
        pytest.param(done(pipeline_run(), "True"), "PipelineRun pr-7f3k2 is done", id="done"),
        pytest.param(
            deleting(pipeline_run()), "PipelineRun pr-7f3k2 is being deleted", id="deleting"
        ),
        pytest.param(pipeline_run(), None, id="running"),
        pytest.param(
            {**pipeline_run(), "metadata": {**pipeline_run()["metadata"], "uid": "uid-new"}},
            "PipelineRun pr-7f3k2 is gone",
            id="another run under its name",
        ),
    ],
)
def test_a_run_s_owner_state_follows_the_runs_cache(
    cached: dict[str, Any] | None, why: str | None
) -> None:
    root = OwnerRef("tekton.dev/v1", "PipelineRun", "pr-7f3k2", "uid-pr")
    assert ended(root, slim_run(cached) if cached is not None else None) == why


# ---- which runs get a seed ------------------------------------------------------------


def namespace(**labels: str) -> dict[str, Any]:
    return {"metadata": {"name": "ci", "resourceVersion": "3", "labels": labels}}


@pytest.mark.parametrize(
    ("event", "obj", "old", "changed"),
    [
        pytest.param("MODIFIED", namespace(**ENABLED), namespace(), True, id="enabled"),
        pytest.param("MODIFIED", namespace(), namespace(**ENABLED), True, id="disabled"),
        pytest.param(
            "MODIFIED",
            namespace(**ENABLED, **{LABEL_MODE: "pipelineruns"}),
            namespace(**ENABLED, **{LABEL_MODE: "workspaces"}),
            True,
            id="mode changed",
        ),
        pytest.param("ADDED", namespace(**ENABLED), None, True, id="seen after its runs"),
        pytest.param(
            "MODIFIED", namespace(**ENABLED), namespace(**ENABLED), False, id="labels the same"
        ),
        pytest.param("DELETED", namespace(**ENABLED), None, False, id="deleted"),
    ],
)
def test_a_namespace_whose_labels_change_has_its_runs_looked_at_again(
    event: str, obj: dict[str, Any], old: dict[str, Any] | None, changed: bool
) -> None:
    assert namespace_changed(event, obj, old) is changed


SEEDED: list[tuple[str, dict[str, Any], dict[str, str] | None, Settings, float]] = [
    ("started run, enabled namespace", pipeline_run(), ENABLED, SETTINGS, NOW),
    ("podTemplate constraints", with_template(nodeSelector={"pool": "a"}), ENABLED, SETTINGS, NOW),
    ("isolate-pipelinerun", pipeline_run(), ENABLED, Settings(mode=Mode.ISOLATE_PIPELINERUN), NOW),
    (
        "namespace mode label",
        pipeline_run(),
        {**ENABLED, LABEL_MODE: "pipelineruns"},
        Settings(mode=Mode.WORKSPACES),
        NOW,
    ),
    (
        "the run's own mode label",
        labelled(pipeline_run(), **{LABEL_MODE: "pipelineruns"}),
        ENABLED,
        Settings(mode=Mode.WORKSPACES),
        NOW,
    ),
    (
        "taskRunSpecs without placement",
        pipeline_run(taskRunSpecs=[{"pipelineTaskName": "build", "serviceAccountName": "b"}]),
        ENABLED,
        SETTINGS,
        NOW,
    ),
    ("pod-affinity placement", pipeline_run(), ENABLED, Settings(mode=Mode.PIPELINERUNS), NOW),
    ("just inside the idle grace", pipeline_run(), ENABLED, SETTINGS, T0 + 299.0),
]

NOT_SEEDED: list[tuple[str, dict[str, Any], dict[str, str] | None, Settings, float]] = [
    (
        "held by concurrency control",
        pipeline_run(status="PipelineRunPending"),
        ENABLED,
        SETTINGS,
        NOW,
    ),
    ("cancelled", pipeline_run(status="Cancelled"), ENABLED, SETTINGS, NOW),
    ("succeeded", done(pipeline_run(), "True"), ENABLED, SETTINGS, NOW),
    ("failed", done(pipeline_run(), "False"), ENABLED, SETTINGS, NOW),
    ("being deleted", deleting(pipeline_run()), ENABLED, SETTINGS, NOW),
    ("namespace not enabled", pipeline_run(), {}, SETTINGS, NOW),
    ("namespace not cached", pipeline_run(), None, SETTINGS, NOW),
    ("workspaces mode", pipeline_run(), ENABLED, Settings(mode=Mode.WORKSPACES), NOW),
    ("disabled mode", pipeline_run(), ENABLED, Settings(mode=Mode.DISABLED), NOW),
    (
        "namespace disabled",
        pipeline_run(),
        {**ENABLED, LABEL_MODE: "disabled"},
        SETTINGS,
        NOW,
    ),
    (
        "the run disabled",
        labelled(pipeline_run(), **{LABEL_MODE: "disabled"}),
        ENABLED,
        SETTINGS,
        NOW,
    ),
    (
        "a task's own nodeSelector",
        pipeline_run(
            taskRunSpecs=[
                {"pipelineTaskName": "build", "podTemplate": {"nodeSelector": {"a": "b"}}}
            ]
        ),
        ENABLED,
        SETTINGS,
        NOW,
    ),
    (
        "rewrite-claims on",
        pipeline_run(),
        ENABLED,
        Settings(mode=Mode.PIPELINERUNS, rewrite_claims=True),
        NOW,
    ),
    ("past the idle grace", pipeline_run(), ENABLED, SETTINGS, T0 + 300.0),
]


@pytest.mark.parametrize(
    ("run", "labels", "settings", "now"),
    [case[1:] for case in SEEDED],
    ids=[case[0] for case in SEEDED],
)
def test_a_started_run_in_a_per_run_mode_is_seeded(
    run: dict[str, Any], labels: dict[str, str] | None, settings: Settings, now: float
) -> None:
    found = seed(slim_run(run), labels, settings, now)
    assert found is not None
    assert found.pod.marks.placeholder == run_placeholder("ci", "pr-7f3k2")
    assert found.pod.marks.mode.per_run
    assert (found.root.kind, found.root.uid) == ("PipelineRun", "uid-pr")
    assert found.expires == T0 + settings.idle_grace_seconds
    assert placeholder_key(slim_run(run), settings) == f"ci/{found.pod.marks.placeholder}"


@pytest.mark.parametrize(
    ("run", "labels", "settings", "now"),
    [case[1:] for case in NOT_SEEDED],
    ids=[case[0] for case in NOT_SEEDED],
)
def test_held_done_disabled_or_unknowable_runs_are_not_seeded(
    run: dict[str, Any], labels: dict[str, str] | None, settings: Settings, now: float
) -> None:
    assert seed(slim_run(run), labels, settings, now) is None


def stamped(run: dict[str, Any], at: float) -> dict[str, Any]:
    run["metadata"].setdefault("annotations", {})[ANNOTATION_RUN_ADMITTED] = micro_time(at)
    return run


def test_a_run_started_after_being_held_is_seeded_for_the_idle_grace_from_its_start() -> None:
    """A run held by concurrency control and started by the reconciler (stamped then) gets
    its placeholder from the start, however long it waited; a stamp older than the run
    (copied with it) or later than now (not to be trusted) leaves the grace to its creation."""
    started = T0 + 3600.0
    run = stamped(pipeline_run(), started)
    assert run_begun(slim_run(run), started + 1.0) == started
    found = seed(slim_run(run), ENABLED, SETTINGS, started + 1.0)
    assert found is not None
    assert found.expires == started + SETTINGS.idle_grace_seconds
    assert seed(slim_run(run), ENABLED, SETTINGS, started + 300.0) is None
    assert seed(slim_run(pipeline_run()), ENABLED, SETTINGS, started + 1.0) is None
    copied = slim_run(stamped(pipeline_run(), T0 - 86400.0))
    assert run_begun(copied, NOW) == T0
    future = slim_run(stamped(pipeline_run(), NOW + 3600.0))
    assert run_begun(future, NOW) == T0
    assert seed(future, ENABLED, SETTINGS, T0 + 300.0) is None
    # The stamp is something a seed reads: writing it looks at the run again.
    assert not same_for_seed(slim_run(pipeline_run()), slim_run(run))


def test_a_started_run_with_no_pod_within_the_grace_of_its_start_gives_it_back() -> None:
    started = T0 + 3600.0
    keeps = plan(_podless(started + 100.0, run_begun=started), SETTINGS, started + 100.0)
    assert not only(keeps, DeleteStatefulSet)
    gives = plan(_podless(started + 300.0, run_begun=started), SETTINGS, started + 300.0)
    assert only(gives, DeleteStatefulSet)


def test_only_started_unfinished_runs_are_candidates_for_the_index() -> None:
    assert candidate(slim_run(pipeline_run()))
    assert not candidate(slim_run(pipeline_run(status="PipelineRunPending")))
    assert not candidate(slim_run(done(pipeline_run(), "True")))
    assert not candidate(slim_run(deleting(pipeline_run())))


def test_a_group_label_names_the_placeholder_as_it_names_the_pods() -> None:
    run = labelled(pipeline_run(), **{"coschedule.dev/group": "release-42"})
    found = seed(slim_run(run), ENABLED, SETTINGS, NOW)
    assert found is not None
    assert found.pod.marks.placeholder == run_placeholder("ci", "release-42")
    assert placeholder_key(slim_run(run), SETTINGS) == f"ci/{run_placeholder('ci', 'release-42')}"


def test_the_cache_keeps_what_a_seed_reads_only() -> None:
    run = with_template(nodeSelector={"pool": "a"}, securityContext={"runAsUser": 1}, env=[1])
    run["spec"]["workspaces"] = [
        {"name": "src", "persistentVolumeClaim": {"claimName": "sources"}},
        {"name": "tmp", "emptyDir": {}},
    ]
    slim = slim_run(run)
    assert "managedFields" not in slim["metadata"]
    assert slim["spec"]["podTemplate"] == {"nodeSelector": {"pool": "a"}}
    assert slim["spec"]["claims"] == ["sources"]
    # A status update of a running run changes nothing the seed reads.
    again = copy.deepcopy(run)
    again["status"]["childReferences"] = [{"name": "pr-7f3k2-build"}]
    again["metadata"]["resourceVersion"] = "8"
    assert same_for_seed(slim, slim_run(again))
    assert not same_for_seed(slim, slim_run(done(again, "True")))
    assert not same_for_seed(slim, slim_run(labelled(again, team="a")))


# ---- the seed is the first pod, as far as its placeholder reads it --------------------


def tekton_pod(run: dict[str, Any]) -> dict[str, Any]:
    """The first TaskRun pod Tekton makes for ``run`` (the fixture, with the podTemplate's
    placement fields), marked by the webhook."""
    template = run["spec"].get("taskRunTemplate", {}).get("podTemplate", {})

    def apply_template(pod: dict[str, Any]) -> None:
        spec = pod["spec"]
        spec.update({k: copy.deepcopy(v) for k, v in template.items() if k != "tolerations"})
        spec["tolerations"] = [*template.get("tolerations", []), *spec.get("tolerations", [])]
        spec["volumes"] = [v for v in spec["volumes"] if "persistentVolumeClaim" not in v]

    return marked_pod(
        "tekton-taskrun",
        settings=SETTINGS,
        created="2026-11-21T06:00:02Z",
        namespace_labels={},
        before=apply_template,
    )


@pytest.mark.parametrize(
    "template",
    [
        {},
        {"nodeSelector": {"pool": "a"}},
        {"tolerations": [TOLERATE_GPU], "affinity": POOL_AB},
        {
            "nodeSelector": {"disk": "ssd"},
            "topologySpreadConstraints": [
                {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}
            ],
            "schedulerName": "batch",
        },
    ],
    ids=["none", "nodeSelector", "tolerations+affinity", "spread+scheduler"],
)
def test_the_seeds_placeholder_is_the_one_the_first_pod_gives(template: dict[str, Any]) -> None:
    run = with_template(**template)
    found = seed(slim_run(run), ENABLED, SETTINGS, NOW)
    assert found is not None
    first = parsed(tekton_pod(run))
    from_seed = group_spec("ci", found.pod.marks.placeholder, [found.pod])
    from_pod = group_spec("ci", first.marks.placeholder, [first])
    assert from_seed is not None
    assert from_pod is not None
    assert from_seed == replace(from_pod, claims=from_seed.claims)
    # Same pod template: the first pod changes nothing of the placeholder's.
    assert pod_template(from_seed, SETTINGS) == pod_template(from_pod, SETTINGS)


def test_the_runs_named_claims_are_mounted_by_its_placeholder() -> None:
    run = pipeline_run(workspaces=[{"name": "s", "persistentVolumeClaim": {"claimName": "src"}}])
    found = seed(slim_run(run), ENABLED, SETTINGS, NOW)
    assert found is not None
    assert found.pod.marks.claims == ("src",)
    volumes = seed_pod(slim_run(run))["spec"]["volumes"]
    assert volumes == [{"name": "ws-0", "persistentVolumeClaim": {"claimName": "src"}}]


# ---- plan with a seed --------------------------------------------------------------------


def seeded(run: dict[str, Any], **over: Any) -> Observed:
    found = seed(slim_run(run), ENABLED, SETTINGS, NOW)
    assert found is not None
    base = Observed(
        namespace="ci",
        name=found.pod.marks.placeholder,
        owner=OwnerState(found.root, OwnerStatus.RUNNING, NOW),
        seed=found.pod,
        seed_until=found.expires,
        run_begun=T0,
    )
    return replace(base, **over)


def test_a_seeded_run_gets_its_placeholder_before_any_pod() -> None:
    observed = seeded(with_template(nodeSelector={"pool": "a"}, affinity=POOL_AB))
    result = plan(observed, SETTINGS, NOW)
    (create,) = only(result, CreateStatefulSet)
    assert create.name == run_placeholder("ci", "pr-7f3k2")
    spec = create.body["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"pool": "a"}
    assert spec["affinity"]["nodeAffinity"] == POOL_AB["nodeAffinity"]
    (owner,) = create.body["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"]) == ("PipelineRun", "uid-pr")
    assert "before the run's first pod" in create.event.message
    # Looked at again when the seed expires (the idle grace from the run's creation).
    assert result.requeue is not None
    assert result.requeue.after == pytest.approx(T0 + 300.0 - NOW)


def test_a_seeded_placeholder_that_exists_is_left_as_it_is() -> None:
    observed = seeded(pipeline_run())
    observed = replace(observed, statefulset=existing_set(observed, SETTINGS))
    result = plan(observed, SETTINGS, NOW)
    assert result.actions == ()
    assert result.requeue is not None


def test_the_first_pod_takes_over_from_the_seed() -> None:
    run = pipeline_run()
    observed = seeded(run)
    observed = replace(observed, statefulset=existing_set(observed, SETTINGS))
    first = tekton_pod(with_template(nodeSelector={"pool": "b"}))
    result = plan(replace(observed, pods=(parsed(first),)), SETTINGS, NOW)
    # The pod's constraints win: the template follows (no restart: OnDelete), no create.
    assert not only(result, CreateStatefulSet)
    (patch,) = only(result, PatchStatefulSet)
    assert patch.patch["spec"]["template"]["spec"]["nodeSelector"] == {"pool": "b"}


def _podless(now: float, **over: Any) -> Observed:
    """The seed gone (expired, or the run held meanwhile) and still no pod of the run."""
    observed = seeded(pipeline_run())
    sts = existing_set(observed, SETTINGS)
    return replace(observed, statefulset=sts, seed=None, seed_until=0.0, **over)


def test_a_run_that_made_no_pod_within_the_idle_grace_gives_its_placeholder_back() -> None:
    observed = _podless(T0 + 300.0)
    result = plan(observed, SETTINGS, T0 + 300.0)
    assert [a.name for a in only(result, DeleteStatefulSet)] == [observed.name]


def test_within_the_idle_grace_a_podless_running_run_keeps_it() -> None:
    result = plan(_podless(T0 + 100.0), SETTINGS, T0 + 100.0)
    assert not only(result, DeleteStatefulSet)
    assert result.requeue is not None


def test_a_deleted_run_gives_its_placeholder_back_at_once() -> None:
    gone = OwnerState(seeded(pipeline_run()).owner.root, OwnerStatus.DONE, NOW, "deleted")  # type: ignore[union-attr]
    result = plan(_podless(NOW, owner=gone, run_begun=None), SETTINGS, NOW)
    assert only(result, DeleteStatefulSet)


def test_a_placeholder_whose_run_had_pods_is_not_given_back_by_the_grace() -> None:
    observed = _podless(T0 + 900.0)
    finished = tekton_pod(pipeline_run())
    finished["status"] = {"phase": "Succeeded"}
    result = plan(replace(observed, pods=(parsed(finished),)), SETTINGS, T0 + 900.0)
    # Quiet, but its run runs: the existing rule (never torn down while the owner runs).
    assert not only(result, DeleteStatefulSet)


def test_a_placeholder_with_claim_templates_is_never_given_back_by_the_grace() -> None:
    observed = _podless(T0 + 900.0)
    assert observed.statefulset is not None
    sts = replace(observed.statefulset, templates={"data": "pvc-1"})
    result = plan(replace(observed, statefulset=sts), SETTINGS, T0 + 900.0)
    assert not only(result, DeleteStatefulSet)
