"""Each mode with real PipelineRuns, started together (independent namespaces) and judged by
Tekton's own verdict and by what ran where."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from tests.e2e.kube import ApiError, Obj
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
    out["workspaces"] = Scenario(ns, ["shared-a", "shared-b"], recorder.watch(ns))
    for name in ("shared-a", "shared-b"):
        api.create(_shared_claim_run(ns, name))

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
        name: {p["spec"]["nodeName"] for p in task_pods(api, ns, name).values()} for name in s.runs
    }
    assert placements == {"shared-a": {node}, "shared-b": {node}}, describe(api, ns)
    placeholder = claim_placeholder_name(ns, "shared")
    assert s.seen.placeholder_nodes(placeholder) == {node}, describe(api, ns)
    if real.provisioner is not None:  # the suite's stack: the volume is a folder here
        folder = real.provisioner.root / volume["metadata"]["name"]
        assert {p.name for p in folder.iterdir()} == {"shared-a", "shared-b"}


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
