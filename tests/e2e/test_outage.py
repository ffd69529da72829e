"""A webhook outage on the real control plane: every ``coschedule serve`` stopped, the pod
webhook failing open, the MutatingAdmissionPolicy ``coschedule-gate-pods`` (as shipped in
manifests/base, bound here to the scenario's namespace only) run by kube-apiserver itself.

A Tekton TaskRun's pod is created, never refused, and stored gated and labelled by the
policy; the reconciler marks it with the webhook's decision, makes the placeholder, pins the
pod to its node and lifts the gate: the run's pods share one node. A Job's pod (placed by
pod affinity) is created as it is: not co-located, not refused. With the webhook back, a
pod the policy gated is pinned and ungated by the webhook in the same admission.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from coschedule.cli.main import main
from coschedule.marks import (
    ANNOTATION_PINNED_NODE,
    GATE_PLACEHOLDER,
    GATED_BY_POLICY,
    LABEL_GATED_BY,
    LABEL_PLACEHOLDER,
    run_placeholder,
)
from coschedule.reconcile.run_plan import read_tests
from coschedule.reconcile.unmarked import REASON_MARKED
from tests.e2e.cluster import Proc, wait_healthy
from tests.e2e.conftest import E2E
from tests.e2e.kube import Api, ApiError, Obj, wait_for
from tests.e2e.runs import node, wait_bound, wait_placeholder_bound
from tests.e2e.test_concurrency import (
    NO_GATED_POD,
    finish,
    make_control,
    reconciling,  # noqa: F401 (a fixture)
    run_manifest,
    state,
    states,
    wait_states,
)
from tests.e2e.test_stuck import NO_WORKSPACE, events_on
from tests.e2e.world import (
    TektonRun,
    create_pod,
    describe_namespace,
    strip_service_account_volume,
    unique,
)
from tests.fixtures import load_pod

pytestmark = pytest.mark.e2e

BASE = Path(__file__).resolve().parents[2] / "manifests" / "base"
POLICY = BASE / "admissionpolicy-pods.yaml"
RUNS_POLICY = BASE / "admissionpolicy-runs.yaml"


@contextlib.contextmanager
def gate_policy(api: Api, namespace: str, source: Path = POLICY) -> Iterator[None]:
    """The shipped policy and binding, renamed, its binding narrowed to ``namespace`` so
    that other scenarios of the session see no policy."""
    policy, binding = (d for d in yaml.safe_load_all(source.read_text("utf-8")) if d)
    name = unique(policy["metadata"]["name"])
    policy = copy.deepcopy(policy)
    policy["metadata"]["name"] = name
    binding = copy.deepcopy(binding)
    binding["metadata"]["name"] = name
    binding["spec"]["policyName"] = name
    binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"].append(
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": [namespace]}
    )
    api.create(policy)
    api.create(binding)
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            api.delete("MutatingAdmissionPolicyBinding", name)
        with contextlib.suppress(Exception):
            api.delete("MutatingAdmissionPolicy", name)


def wait_policy_active(api: Api, run: TektonRun) -> None:
    """kube-apiserver loads a new policy from its own watch: a dry run says when. Called
    with the webhook down: with it up, its own gate on the probe (placement auto) would look
    like the policy's, and it drops the policy's mark in the same admission. The policy's
    label is the proof."""
    probe = run.pod_manifest("probe", fixture=NO_WORKSPACE)

    def gated() -> bool:
        stored = api.create(copy.deepcopy(probe), dry_run=True)
        labels = stored["metadata"].get("labels") or {}
        return labels.get(LABEL_GATED_BY) == GATED_BY_POLICY and any(
            g.get("name") == GATE_PLACEHOLDER for g in stored["spec"].get("schedulingGates") or []
        )

    wait_for("the admission policy to be active", gated, timeout=30)


@contextlib.contextmanager
def webhook_down(e2e: E2E) -> Iterator[None]:
    """Every webhook replica gone (the process stopped); started again after, on the same
    port with the same certificate, so that the registration stays valid."""
    product = e2e.product
    proc = product.webhook
    assert proc is not None
    proc.stop()
    try:
        yield
    finally:
        again = Proc(proc.name, proc.argv, proc.log_path, env=proc.env, cwd=proc.cwd).start()
        product.webhook = again
        e2e.plane.procs[proc.name] = again
        health = proc.argv[proc.argv.index("--health-port") + 1]
        wait_healthy(f"http://127.0.0.1:{health}/readyz", again, timeout=30)


def labels_of(pod: Obj) -> dict[str, str]:
    return dict(pod["metadata"].get("labels") or {})


def gates_of(pod: Obj) -> list[str]:
    return [g["name"] for g in pod["spec"].get("schedulingGates") or []]


def test_a_webhook_outage_refuses_no_pod_and_the_reconciler_colocates_the_run(
    e2e: E2E, namespace: Callable[..., str]
) -> None:
    e2e.require("scheduler", "controller-manager", "reconciler")
    api = e2e.api
    ns = namespace(mode="pipelineruns")
    run = TektonRun(api, ns, unique("pr")).create()
    with gate_policy(api, ns):
        with webhook_down(e2e):
            wait_policy_active(api, run)
            # Created, not refused (the pod webhook fails open): gated and labelled by the
            # policy, with none of the webhook's marks.
            first = run.create_pod("build", fixture=NO_WORKSPACE)
            assert gates_of(first) == [GATE_PLACEHOLDER]
            assert labels_of(first)[LABEL_GATED_BY] == GATED_BY_POLICY
            assert LABEL_PLACEHOLDER not in labels_of(first)
            # The reconciler marks it as the webhook would, makes the placeholder, pins it.
            placeholder = run_placeholder(ns, run.name)
            here = node(wait_placeholder_bound(api, ns, placeholder))
            bound = wait_bound(api, ns, run.pod_name("build"), node=here)
            assert labels_of(bound)[LABEL_PLACEHOLDER] == placeholder
            assert bound["metadata"]["annotations"][ANNOTATION_PINNED_NODE] == here
            assert gates_of(bound) == []
            (event,) = events_on(api, ns, "Pod", run.pod_name("build"), REASON_MARKED)
            assert placeholder in str(event["message"])
            # The run's next pod, still in the outage: the same node.
            run.create_pod("test", fixture=NO_WORKSPACE)
            second = wait_bound(api, ns, run.pod_name("test"), node=here)
            assert second["metadata"]["annotations"][ANNOTATION_PINNED_NODE] == here

            # A Job's pod (pod affinity, not placement by node name): not gated by the
            # policy, created as it is: not co-located, not refused.
            job_pod = load_pod("job-pod")
            job_pod["metadata"].update(name=unique("job-pod"), namespace=ns)
            job_pod["metadata"].pop("ownerReferences", None)
            job_pod["metadata"]["labels"]["coschedule.dev/group"] = run.name
            job_pod["spec"]["serviceAccountName"] = "ci-builder"  # the namespace's
            strip_service_account_volume(job_pod["spec"])
            job_pod["spec"]["volumes"] = [
                v for v in job_pod["spec"].get("volumes") or [] if "persistentVolumeClaim" not in v
            ]
            for container in job_pod["spec"]["containers"]:
                container.pop("volumeMounts", None)
            stored = create_pod(api, job_pod)
            assert gates_of(stored) == []
            assert LABEL_PLACEHOLDER not in labels_of(stored)
            assert "podAffinity" not in (stored["spec"].get("affinity") or {})

        # The webhook back: a pod the policy gates is pinned and ungated at admission.
        third = run.create_pod("deploy", fixture=NO_WORKSPACE)
        assert gates_of(third) == [], describe_namespace(api, ns)
        assert third["metadata"]["annotations"][ANNOTATION_PINNED_NODE] == here
        wait_bound(api, ns, run.pod_name("deploy"), node=here)
    run.finish()


def test_a_webhook_outage_refuses_no_run_and_a_queue_keeps_its_limit(
    e2e: E2E, namespace: Callable[..., str]
) -> None:
    e2e.require("reconciler")
    api = e2e.api
    ns = namespace(prefix="outage-runs")
    free = namespace(prefix="outage-free")  # enabled, no control: never held
    make_control(e2e, ns, "env", {"selector": {}, "strategy": "Queue", "maxRunning": 1, "key": "x"})
    with gate_policy(api, ns, RUNS_POLICY), gate_policy(api, free, RUNS_POLICY):
        with webhook_down(e2e):
            # The policy is active once a dry-run run comes back held (with the webhook
            # up, the webhook decides and removes the mark in the same admission).
            wait_for(
                "the run admission policy to be active",
                lambda: (
                    "coschedule.dev/held-by"
                    in (
                        api.create(run_manifest("PipelineRun", ns, "probe", {}), dry_run=True)[
                            "metadata"
                        ].get("annotations")
                        or {}
                    )
                ),
                timeout=30,
            )
            names = ["o1", "o2", "o3"]
            for name in names:  # created, not refused
                api.create(run_manifest("PipelineRun", ns, name, {}))
            unheld = api.create(run_manifest("PipelineRun", free, "f1", {}))
            assert "status" not in unheld["spec"]  # no control there: started at once
            # The reconciler decides as the webhook would: one runs, two wait. A run the
            # policy holds already reads "pending-us", so the states alone do not say that
            # the reconciler has decided each run: its decision removes the held-by mark.
            expected = {"o1": "started", "o2": "pending-us", "o3": "pending-us"}
            wait_states(api, "PipelineRun", ns, expected)
            wait_for(
                "the reconciler to decide every held run",
                lambda: not any(_policy_held(api, ns, name) for name in names),
                timeout=60,
            )
            for name in names:
                stored = api.must_get("PipelineRun", name, ns)
                assert stored["metadata"]["labels"]["concurrency.coschedule.dev/env"] == "x"
                annotations = stored["metadata"].get("annotations") or {}
                assert "coschedule.dev/held-by" not in annotations
            time.sleep(1)  # a wrong extra start would show by now
            assert states(api, "PipelineRun", ns, names) == expected
            finish(api, "PipelineRun", ns, "o1")
            expected.update(o1="done", o2="started")
            wait_states(api, "PipelineRun", ns, expected)
        # The webhook back: held by the policy, decided by the webhook in one admission.
        api.create(run_manifest("PipelineRun", ns, "o4", {}))
        stored = api.must_get("PipelineRun", "o4", ns)
        assert "coschedule.dev/held-by" not in (stored["metadata"].get("annotations") or {})
        assert stored["metadata"]["labels"]["concurrency.coschedule.dev/env"] == "x"
        assert state(stored) == "pending-us"


def test_a_held_runs_admit_holds_to_what_it_read_not_to_the_runs_version(
    e2e: E2E, namespace: Callable[..., str]
) -> None:
    """kube-apiserver's own JSON patch ``test`` of the admit's guards (``read_tests``: the
    run's uid, labels and annotations as read, its spec by its generation): a status write after
    the read (Tekton's Pending condition on a new run) does not refuse the patch, as a test
    of the resourceVersion did (422, retried: 5 times in one real-stack scenario); a label
    written after the read does (422), and nothing is changed."""
    api = e2e.api
    ns = namespace(prefix="admit-guards")
    for name in ("r1", "r2", "r3"):  # labels, annotations and spec, as a held run has them
        manifest = run_manifest("PipelineRun", ns, name, {"branch": "main"}, pending=True)
        manifest["metadata"]["annotations"] = {"note": "kept"}
        api.create(manifest)
    decided = {"op": "add", "path": "/metadata/annotations/decided", "value": "yes"}
    json_patch = "application/json-patch+json"
    pending = {"conditions": [{"type": "Succeeded", "status": "Unknown", "reason": "Pending"}]}

    stored = api.must_get("PipelineRun", "r1", ns)
    api.patch("PipelineRun", "r1", {"status": pending}, ns, subresource="status")
    # The guard as it was: the version read, which the status write changed.
    version = {"op": "test", "path": "/metadata/resourceVersion"}
    version["value"] = stored["metadata"]["resourceVersion"]
    with pytest.raises(ApiError) as refused:
        api.patch("PipelineRun", "r1", [version, decided], ns, patch_type=json_patch)
    assert refused.value.status == 422
    api.patch("PipelineRun", "r1", [*read_tests(stored), decided], ns, patch_type=json_patch)
    assert api.must_get("PipelineRun", "r1", ns)["metadata"]["annotations"]["decided"] == "yes"

    stored = api.must_get("PipelineRun", "r2", ns)
    api.patch("PipelineRun", "r2", {"metadata": {"labels": {"team": "x"}}}, ns)
    with pytest.raises(ApiError) as refused:
        api.patch("PipelineRun", "r2", [*read_tests(stored), decided], ns, patch_type=json_patch)
    assert refused.value.status == 422
    assert "decided" not in (
        api.must_get("PipelineRun", "r2", ns)["metadata"].get("annotations") or {}
    )

    # A param changed after the read (the key a control groups by): the spec's generation
    # moved, so the patch is refused too.
    stored = api.must_get("PipelineRun", "r3", ns)
    params = [{"name": "branch", "value": "dev"}]
    api.patch("PipelineRun", "r3", {"spec": {"params": params}}, ns)
    with pytest.raises(ApiError) as refused:
        api.patch("PipelineRun", "r3", [*read_tests(stored), decided], ns, patch_type=json_patch)
    assert refused.value.status == 422


def _policy_held(api: Api, ns: str, name: str) -> bool:
    run = api.must_get("PipelineRun", name, ns)
    return "coschedule.dev/held-by" in (run["metadata"].get("annotations") or {})


@pytest.mark.usefixtures("reconciling")
def test_after_an_uninstall_release_held_leaves_no_gated_pod(
    e2e: E2E, namespace: Callable[..., str], capsys: pytest.CaptureFixture[str]
) -> None:
    """The reconciler gone (uninstalled): TaskRun pods wait behind the gate, which nothing
    else lifts; ``release-held`` lifts every one, pins none, and the scheduler places them."""
    e2e.require("scheduler", "controller-manager", "reconciler")
    api = e2e.api
    ns = namespace(mode="pipelineruns")
    for name in list(e2e.product.reconcilers):
        e2e.product.reconcilers.pop(name).stop()
    run = TektonRun(api, ns, unique("pr")).create()
    for task in ("build", "test"):
        stored = run.create_pod(task, fixture=NO_WORKSPACE)
        assert gates_of(stored) == [GATE_PLACEHOLDER]  # the webhook held it: no placeholder
    time.sleep(2)  # nothing lifts the gate
    assert all(
        gates_of(api.must_get("Pod", run.pod_name(t), ns)) == [GATE_PLACEHOLDER]
        for t in ("build", "test")
    )
    assert e2e.plane.admin_kubeconfig is not None
    admin = ["release-held", "--kubeconfig", str(e2e.plane.admin_kubeconfig), "-n", ns]
    capsys.readouterr()
    assert main([*admin, "--dry-run"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "2 gated pod(s) would be ungated (dry run: nothing changed)"
    )
    assert main(admin) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "ungated 2 pod(s)"
    left = [p for p in api.list("Pod", ns) if GATE_PLACEHOLDER in gates_of(p)]
    assert left == []  # gated pods left after uninstall: 0
    for task in ("build", "test"):
        bound = wait_bound(api, ns, run.pod_name(task))
        assert ANNOTATION_PINNED_NODE not in (bound["metadata"].get("annotations") or {})
    assert main(admin) == 0
    assert capsys.readouterr().out.splitlines()[-1] == NO_GATED_POD
