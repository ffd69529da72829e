"""Each mode with real PipelineRuns, started together (independent namespaces) and judged by
Tekton's own verdict and by what ran where."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

from tests.e2e.kube import Api, ApiError, Obj
from tests.e2e.world import make_namespace, unique, wait_webhook_sees
from tests.real.runs import (
    Recorder,
    Seen,
    assert_succeeded,
    claim_placeholder_name,
    claim_template,
    describe,
    pipeline_run,
    placeholder_name,
    task,
    task_pods,
    wait_runs,
    write_read_pipeline,
)
from tests.real.stack import CONFIG, RealCluster
from tests.real.volumes import volume_node


@dataclass
class Scenario:
    namespace: str
    runs: list[str]
    seen: Seen
    result: dict[str, Obj] = field(default_factory=dict)


def _namespace(real: RealCluster, prefix: str, mode: str) -> str:
    name = unique(f"real-{prefix}")
    make_namespace(real.api, name, mode)
    if mode != CONFIG["coschedule"]:  # until the webhook has seen it, it gets the cluster's
        wait_webhook_sees(real.api, name, mode)
    return name


def _two_templates(namespace: str, name: str, storage_class: str) -> Obj:
    tasks, finally_ = write_read_pipeline()
    return pipeline_run(
        namespace,
        name,
        tasks,
        {
            "src": {"volumeClaimTemplate": claim_template(storage_class)},
            "cache": {"volumeClaimTemplate": claim_template(storage_class)},
        },
        finally_=finally_,
    )


def _shared_claim_run(namespace: str, name: str) -> Obj:
    tasks = [
        task(
            "write",
            "echo $(context.pipelineRun.name) >"
            " $(workspaces.ws.path)/$(context.pipelineRun.name)\n",
            ["ws"],
        ),
        task(
            "read",
            "grep -qx $(context.pipelineRun.name) "
            "$(workspaces.ws.path)/$(context.pipelineRun.name)\n",
            ["ws"],
            run_after=["write"],
        ),
    ]
    return pipeline_run(
        namespace, name, tasks, {"ws": {"persistentVolumeClaim": {"claimName": "shared"}}}
    )


def _isolated_run(namespace: str, name: str, storage_class: str) -> Obj:
    tasks = [
        task("write", "echo x > $(workspaces.ws.path)/x\nsleep 3\n", ["ws"]),
        task("read", "test -s $(workspaces.ws.path)/x\n", ["ws"], run_after=["write"]),
    ]
    return pipeline_run(
        namespace, name, tasks, {"ws": {"volumeClaimTemplate": claim_template(storage_class)}}
    )


@pytest.fixture(scope="module")
def started(real: RealCluster) -> Iterator[dict[str, Scenario]]:
    """Every mode's runs, created at once in their own namespaces."""
    api = real.api
    out: dict[str, Scenario] = {}
    recorder = Recorder(api).start()
    ns = _namespace(real, "pipelineruns", "pipelineruns")
    out["pipelineruns"] = Scenario(ns, ["two-templates"], recorder.watch(ns))
    api.create(_two_templates(ns, "two-templates", real.local_class))

    ns = _namespace(real, "workspaces", "workspaces")
    api.create(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "shared", "namespace": ns},
            "spec": claim_template(real.local_class)["spec"],
        }
    )
    out["workspaces"] = Scenario(ns, ["shared-a", "shared-b", "own"], recorder.watch(ns))
    for name in ("shared-a", "shared-b"):
        api.create(_shared_claim_run(ns, name))
    # A run with a claim of its own (Tekton's, from a template): its placeholder follows the
    # claim, and goes with it when the run is deleted (teardown below).
    api.create(_isolated_run(ns, "own", real.local_class))

    if len(real.nodes) >= 2:
        ns = _namespace(real, "isolate", "isolate-pipelinerun")
        out["isolate"] = Scenario(ns, ["isolated-a", "isolated-b"], recorder.watch(ns))
        for name in ("isolated-a", "isolated-b"):
            api.create(_isolated_run(ns, name, real.local_class))
    yield out
    recorder.stop()
    if os.environ.get("REAL_KEEP"):
        return
    for scenario in out.values():
        with contextlib.suppress(ApiError):
            api.delete("Namespace", scenario.namespace)


def _finish(real: RealCluster, scenario: Scenario) -> Scenario:
    scenario.result = wait_runs(real.api, scenario.namespace, scenario.runs)
    return scenario


def test_pipelineruns_two_claim_templates_on_one_node(
    real: RealCluster, started: dict[str, Scenario]
) -> None:
    api = real.api
    s = _finish(real, started["pipelineruns"])
    ns, run = s.namespace, "two-templates"
    assert_succeeded(s.result, api, ns, run)
    pods = task_pods(api, ns, run)
    assert set(pods) == {"write", "build", "lint", "check", "report"}, describe(api, ns)
    nodes = {p["spec"]["nodeName"] for p in pods.values()}
    placeholder = placeholder_name(ns, run)
    assert len(nodes) == 1, f"the run's pods ran on {nodes}\n{describe(api, ns)}"
    assert s.seen.placeholder_nodes(placeholder) == nodes, (
        f"placeholder {placeholder} ran on {s.seen.placeholder_nodes(placeholder)}, "
        f"the run on {nodes}\n{describe(api, ns)}"
    )
    # Data flowed: the finally task printed what write and build wrote.
    report = real.pod_log(ns, pods["report"]["metadata"]["name"], "step-report")
    assert f"data of {run}" in report, report
    assert "built" in report, report
    # Exactly one volume per workspace, both provisioned on the run's node.
    volumes = [
        v
        for v in api.list("PersistentVolume")
        if ((v.get("spec") or {}).get("claimRef") or {}).get("namespace") == ns
    ]
    assert len(volumes) == 2, describe(api, ns)
    assert {volume_node(v) for v in volumes} == nodes, describe(api, ns)
    # The tasks mounted exactly the claims of those two volumes, whichever claims they are
    # (the engine's, or the placeholder's in their place).
    mounted = {
        v["persistentVolumeClaim"]["claimName"]
        for pod in pods.values()
        for v in pod["spec"].get("volumes") or []
        if v.get("persistentVolumeClaim")
    }
    assert mounted == {v["spec"]["claimRef"]["name"] for v in volumes}, describe(api, ns)


def _until(what: str, timeout: float, look: Callable[[], str | None]) -> None:
    """Poll ``look`` (None: done; else what is still wrong) every second until ``timeout``."""
    deadline = time.monotonic() + timeout
    while (wrong := look()) is not None:
        assert time.monotonic() < deadline, f"{timeout:.0f} s {what}: {wrong}"
        time.sleep(1)


def _volumes_of(api: Api, namespace: str) -> list[str]:
    return [
        v["metadata"]["name"]
        for v in api.list("PersistentVolume")
        if ((v.get("spec") or {}).get("claimRef") or {}).get("namespace") == namespace
    ]


def test_pipelineruns_teardown_leaves_nothing(
    real: RealCluster, started: dict[str, Scenario]
) -> None:
    """After the run: no StatefulSet of ours, no claim of ours (not even Terminating), and no
    claim left Pending (one volume per workspace: Tekton's claims are mounted, none is left
    unused); after the PipelineRun is deleted, no claim and no volume."""
    api = real.api
    s = _finish(real, started["pipelineruns"])
    ns, run = s.namespace, "two-templates"
    placeholder = placeholder_name(ns, run)

    def after_run() -> str | None:
        statefulsets = [x["metadata"]["name"] for x in api.list("StatefulSet", ns)]
        claims = api.list("PersistentVolumeClaim", ns)
        ours = [c["metadata"]["name"] for c in claims if placeholder in c["metadata"]["name"]]
        pending = [
            c["metadata"]["name"]
            for c in claims
            if (c.get("status") or {}).get("phase") == "Pending"
        ]
        if statefulsets or ours or pending:
            return (
                f"StatefulSets {statefulsets}, our claims {ours}, pending claims {pending}\n"
                + describe(api, ns)
            )
        return None

    _until("after the run", 90, after_run)
    api.delete("PipelineRun", run, ns, propagation="Background")

    def after_delete() -> str | None:
        claims = [c["metadata"]["name"] for c in api.list("PersistentVolumeClaim", ns)]
        volumes = _volumes_of(api, ns)
        if claims or volumes:
            return f"claims {claims}, volumes {volumes}\n{describe(api, ns)}"
        return None

    _until("after deleting the PipelineRun", 90, after_delete)


def test_workspaces_claim_shared_by_two_runs(
    real: RealCluster, started: dict[str, Scenario]
) -> None:
    api = real.api
    s = _finish(real, started["workspaces"])
    ns = s.namespace
    assert_succeeded(s.result, api, ns, "shared-a", "shared-b")
    claim = api.must_get("PersistentVolumeClaim", "shared", ns)
    volume = api.must_get("PersistentVolume", claim["spec"]["volumeName"])
    node = volume_node(volume)
    placements = {
        name: {p["spec"]["nodeName"] for p in task_pods(api, ns, name).values()}
        for name in ("shared-a", "shared-b")
    }
    assert placements == {"shared-a": {node}, "shared-b": {node}}, describe(api, ns)
    placeholder = claim_placeholder_name(ns, "shared")
    assert s.seen.placeholder_nodes(placeholder) == {node}, describe(api, ns)
    if real.provisioner is not None:  # the suite's stack: the volume is a folder here
        folder = real.provisioner.root / volume["metadata"]["name"]
        assert {p.name for p in folder.iterdir()} == {"shared-a", "shared-b"}


def test_workspaces_run_deleted_takes_its_claim_and_placeholder(
    real: RealCluster, started: dict[str, Scenario]
) -> None:
    """A run whose workspace is a claim of its own (Tekton's, from a template) in
    `workspaces` mode: all on the claim's node with the claim's placeholder, Succeeded; once
    the PipelineRun is deleted its claim, volume and placeholder go within seconds, not after
    the idle grace (found by bench/real_latency: the placeholder held the Terminating claim
    for 5 minutes). The shared claim's placeholder is not touched."""
    api = real.api
    s = _finish(real, started["workspaces"])
    ns = s.namespace
    assert_succeeded(s.result, api, ns, "own")
    [claim] = [
        c
        for c in api.list("PersistentVolumeClaim", ns)
        if c["metadata"]["name"] != "shared"
        and any(o.get("name") == "own" for o in c["metadata"].get("ownerReferences") or [])
    ]
    name = claim["metadata"]["name"]
    node = volume_node(api.must_get("PersistentVolume", claim["spec"]["volumeName"]))
    pods = task_pods(api, ns, "own")
    assert {p["spec"]["nodeName"] for p in pods.values()} == {node}, describe(api, ns)
    placeholder = claim_placeholder_name(ns, name)
    assert s.seen.placeholder_nodes(placeholder) == {node}, describe(api, ns)
    shared = claim_placeholder_name(ns, "shared")
    api.delete("PipelineRun", "own", ns, propagation="Background")

    def gone() -> str | None:
        claims = [c["metadata"]["name"] for c in api.list("PersistentVolumeClaim", ns)]
        volumes = _volumes_of(api, ns)
        statefulsets = [x["metadata"]["name"] for x in api.list("StatefulSet", ns)]
        if claims != ["shared"] or len(volumes) != 1 or placeholder in statefulsets:
            return f"claims {claims}, volumes {volumes}, StatefulSets {statefulsets}\n" + describe(
                api, ns
            )
        return None

    _until("after deleting the PipelineRun", 60, gone)
    # The shared claim's placeholder stays for the idle grace (another run may come).
    assert shared in [x["metadata"]["name"] for x in api.list("StatefulSet", ns)], describe(api, ns)


def test_isolate_two_runs_on_two_nodes(real: RealCluster, started: dict[str, Scenario]) -> None:
    real.require("two-nodes")
    api = real.api
    s = _finish(real, started["isolate"])
    ns = s.namespace
    assert_succeeded(s.result, api, ns, "isolated-a", "isolated-b")
    placements: dict[str, str] = {}
    for run in s.runs:
        nodes = {p["spec"]["nodeName"] for p in task_pods(api, ns, run).values()}
        assert len(nodes) == 1, f"{run} ran on {nodes}\n{describe(api, ns)}"
        placeholder = placeholder_name(ns, run)
        assert s.seen.placeholder_nodes(placeholder) == nodes, describe(api, ns)
        placements[run] = nodes.pop()
    assert placements["isolated-a"] != placements["isolated-b"], describe(api, ns)
