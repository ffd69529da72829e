"""``coschedule release-held`` against the kmock API emulator: it starts exactly the runs
concurrency control holds pending (PipelineRuns and Workflows, each through the engine's own
start patch with its resourceVersion, and a Started Event), leaves every other run alone,
prints each, respects the namespaces asked for and ``--dry-run``, reads a run again after a
409, and finds nothing the second time. The command itself runs as a process."""

from __future__ import annotations

import asyncio
import copy
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kmock
import pytest

from coschedule.cli.release_held import pods_summary, release_gated, release_held, summary
from coschedule.kube.client import KubeClient
from tests.concurrency.runs import pipeline_run, workflow
from tests.conftest import PATIENCE_SECONDS, ROOT, write_kubeconfig
from tests.reconcile.apiserver import MiniApi, Scaffold
from tests.reconcile.conftest import eventually

Obj = dict[str, Any]
PENDING_BY_US = {"coschedule.dev/pending-by": "concurrency"}


def grouped(obj: Obj, value: str = "main", *, ours: bool = True, control: str = "ci") -> Obj:
    obj = copy.deepcopy(obj)
    obj["metadata"]["labels"].update(
        {"coschedule.dev/concurrency": "grouped", f"concurrency.coschedule.dev/{control}": value}
    )
    if ours:
        obj["metadata"]["annotations"] = {
            **PENDING_BY_US,
            "coschedule.dev/waiting": "waiting: 2nd in queue",
        }
    return obj


def seed(api: MiniApi) -> None:
    held = "PipelineRunPending"
    api.put("pipelineruns", grouped(pipeline_run("held-1", status=held)))
    api.put("pipelineruns", grouped(pipeline_run("held-2", status=held, namespace="deploy")))
    # Made pending by its author: not ours to start.
    api.put("pipelineruns", grouped(pipeline_run("author", status=held), ours=False))
    # Running, and cancelled (stopping): not held.
    api.put("pipelineruns", grouped(pipeline_run("running")))
    api.put("pipelineruns", grouped(pipeline_run("stopping", status="Cancelled")))
    # Pending by us but never grouped by the webhook (no label): not listed, not touched.
    ungrouped = pipeline_run("ungrouped", status=held, annotations=dict(PENDING_BY_US))
    api.put("pipelineruns", ungrouped)
    api.put("workflows", grouped(workflow("wf-held", suspend=True)))
    api.put("workflows", grouped(workflow("wf-running")))


def started(api: MiniApi) -> set[str]:
    """kind/namespace/name of every run patched."""
    return {
        f"{plural}/{ns}/{name}"
        for plural in ("pipelineruns", "workflows")
        for ns, name, _ in api.calls("PATCH", plural)
    }


def events(api: MiniApi) -> list[Obj]:
    return [obj for (plural, _, _), obj in api.objects.items() if plural == "events"]


async def run_release(
    client: KubeClient, namespaces: list[str] | None = None, dry_run: bool = False
) -> list[str]:
    lines: list[str] = []
    outcomes = await release_held(client, namespaces, dry_run=dry_run, say=lines.append)
    lines.append(summary(outcomes, dry_run))
    return lines


async def test_it_starts_exactly_the_held_runs(api: MiniApi, client: KubeClient) -> None:
    seed(api)
    lines = await run_release(client)
    assert lines == [
        "released PipelineRun ci/held-1 (held by ConcurrencyControl ci, key main)",
        "released PipelineRun deploy/held-2 (held by ConcurrencyControl ci, key main)",
        "released Workflow ci/wf-held (held by ConcurrencyControl ci, key main)",
        "released 3 held run(s)",
    ]
    assert started(api) == {
        "pipelineruns/ci/held-1",
        "pipelineruns/deploy/held-2",
        "workflows/ci/wf-held",
    }
    # The engine's start: Tekton's spec.status removed, Argo's suspend false; our marks gone.
    run = api.get("pipelineruns", "ci", "held-1")
    assert run is not None
    assert "status" not in run["spec"]
    assert "coschedule.dev/pending-by" not in run["metadata"]["annotations"]
    assert "coschedule.dev/waiting" not in run["metadata"]["annotations"]
    # Not stamped: no reconciler is left to seed its placeholder, so its first pod must not
    # wait for one.
    assert "coschedule.dev/run-admitted-at" not in run["metadata"]["annotations"]
    wf = api.get("workflows", "ci", "wf-held")
    assert wf is not None
    assert wf["spec"]["suspend"] is False
    # Each patch was conditional on the version the decision read.
    for _, _, query in api.calls("PATCH", "pipelineruns"):
        assert query == {}
    # One Started Event per released run, on the run.
    started_events = sorted(
        (e["involvedObject"]["kind"], e["involvedObject"]["name"], e["reason"]) for e in events(api)
    )
    assert started_events == [
        ("PipelineRun", "held-1", "Started"),
        ("PipelineRun", "held-2", "Started"),
        ("Workflow", "wf-held", "Started"),
    ]
    assert all("released by coschedule release-held" in e["message"] for e in events(api))
    # The author's pending run and the ungrouped one are as they were.
    author = api.get("pipelineruns", "ci", "author")
    assert author is not None
    assert author["spec"]["status"] == "PipelineRunPending"
    ungrouped = api.get("pipelineruns", "ci", "ungrouped")
    assert ungrouped is not None
    assert ungrouped["spec"]["status"] == "PipelineRunPending"

    # Idempotent: the second time there is nothing to release and nothing is written.
    patches = len(api.calls("PATCH", "pipelineruns"))
    assert await run_release(client) == ["no run is held pending by coschedule"]
    assert len(api.calls("PATCH", "pipelineruns")) == patches


async def test_a_stale_patch_is_read_again(api: MiniApi, client: KubeClient) -> None:
    """The start patch carries the resourceVersion the list read: a run changed since is
    read again and started only if it is still held."""
    seed(api)
    gate = asyncio.Event()
    api.holds[("PATCH", "pipelineruns")] = gate
    task = asyncio.create_task(run_release(client))
    await eventually(lambda: api.calls("PATCH", "pipelineruns"))
    # Listed, the first start on its way: one run changes (still held), the other is
    # started by someone else (the reconciler).
    api.edit("pipelineruns", "ci", "held-1", {"metadata": {"labels": {"x": "y"}}})
    api.edit(
        "pipelineruns",
        "deploy",
        "held-2",
        {
            "metadata": {"annotations": {"coschedule.dev/pending-by": None}},
            "spec": {"status": None},
        },
    )
    gate.set()
    lines = await asyncio.wait_for(task, 10)
    assert lines[:2] == [
        "released PipelineRun ci/held-1 (held by ConcurrencyControl ci, key main)",
        "left PipelineRun deploy/held-2 (no longer held: running)",
    ]
    assert lines[-1] == "released 2 held run(s), left 1"
    # held-1: a 409, then the patch on the version read again; held-2: the 409 only.
    patched = [name for _, name, _ in api.calls("PATCH", "pipelineruns")]
    assert patched == ["held-1", "held-1", "held-2"]
    assert [name for _, name, _ in api.calls("GET", "pipelineruns") if name] == [
        "held-1",
        "held-2",
    ]


async def test_namespaces_and_dry_run(api: MiniApi, client: KubeClient) -> None:
    seed(api)
    lines = await run_release(client, ["deploy"], dry_run=True)
    assert lines == [
        "would release PipelineRun deploy/held-2 (held by ConcurrencyControl ci, key main)",
        "1 held run(s) would be released (dry run: nothing changed)",
    ]
    assert started(api) == set()
    assert events(api) == []
    # Each namespace asked for is listed in that namespace only.
    assert {ns for ns, _, _ in api.calls("GET", "pipelineruns")} == {"deploy"}

    lines = await run_release(client, ["deploy"])
    assert lines[-1] == "released 1 held run(s)"
    assert started(api) == {"pipelineruns/deploy/held-2"}


@pytest.fixture
async def no_workflows() -> AsyncIterator[MiniApi]:
    async with Scaffold() as handler, kmock.Server(handler) as server:
        state = MiniApi(handler, without=frozenset({"workflows"}))
        state.url = str(server.url).rstrip("/")
        yield state
        state.end_watches()


async def test_an_engine_not_installed_is_said_and_skipped(no_workflows: MiniApi) -> None:
    api = no_workflows
    api.put("pipelineruns", grouped(pipeline_run("held-1", status="PipelineRunPending")))
    client = KubeClient(_creds(api), timeout=5.0)
    try:
        lines = await run_release(client)
    finally:
        await client.aclose()
    assert lines == [
        "released PipelineRun ci/held-1 (held by ConcurrencyControl ci, key main)",
        "Workflows: not served by this cluster (CRD not installed)",
        "released 1 held run(s)",
    ]


def _creds(api: MiniApi) -> Any:
    from coschedule.kube.client import Credentials

    return Credentials(server=api.url)


async def _command(*args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "coschedule.cli.main",
        "release-held",
        *args,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), PATIENCE_SECONDS)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_the_command(api: MiniApi, tmp_path: Path) -> None:
    seed(api)
    kubeconfig = str(write_kubeconfig(tmp_path / "kubeconfig", api.url))
    code, out, _ = await _command("--kubeconfig", kubeconfig, "--dry-run", "-n", "ci")
    assert code == 0
    assert out.splitlines() == [
        "would release PipelineRun ci/held-1 (held by ConcurrencyControl ci, key main)",
        "would release Workflow ci/wf-held (held by ConcurrencyControl ci, key main)",
        "2 held run(s) would be released (dry run: nothing changed)",
        "no pod is held by the coschedule.dev/placeholder gate",
    ]
    assert started(api) == set()

    code, out, _ = await _command("--kubeconfig", kubeconfig)
    assert code == 0
    assert out.splitlines()[-2] == "released 3 held run(s)"
    code, out, _ = await _command("--kubeconfig", kubeconfig)
    assert (code, out) == (
        0,
        "no run is held pending by coschedule\n"
        "no pod is held by the coschedule.dev/placeholder gate\n",
    )


async def test_the_command_refuses_in_one_line(tmp_path: Path) -> None:
    code, _, err = await _command("--kubeconfig", str(tmp_path / "absent"))
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("coschedule release-held: ")
    code, _, err = await _command("--kubeconfig", str(tmp_path / "absent"), "-n", "Not_A_Name")
    assert code == 2
    assert "'Not_A_Name' is not a namespace name" in err
    # Nothing listens there: the cluster cannot be read (exit 1, one line).
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", "http://127.0.0.1:9")
    code, _, err = await _command("--kubeconfig", str(kubeconfig))
    assert code == 1
    assert err.startswith("coschedule release-held: cannot read or patch the runs or pods: ")
    assert "connection refused" in err
    assert len(err.strip().splitlines()) == 1


GATE = {"name": "coschedule.dev/placeholder"}


def gated_pod(name: str, namespace: str, labels: dict[str, str], gates: list[Obj]) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"containers": [{"name": "main", "image": "pause"}], "schedulingGates": gates},
    }


def seed_pods(api: MiniApi) -> None:
    marked = {"coschedule.dev/placeholder": "affinity-assistant-0123456789"}
    policy = {"coschedule.dev/gated-by": "admission-policy"}
    # Marked by the webhook and waiting for its placeholder; another gate is kept.
    api.put("pods", gated_pod("marked", "ci", marked, [{"name": "example.com/quota"}, GATE]))
    # Gated by the admission policy while the webhook was away.
    api.put("pods", gated_pod("policy", "deploy", policy, [GATE]))
    # Marked and already released (pinned): not gated, not touched.
    api.put("pods", gated_pod("pinned", "ci", marked, []))
    # Someone else's gate only: not ours.
    api.put("pods", gated_pod("other", "ci", marked, [{"name": "example.com/quota"}]))


async def test_it_lifts_our_gate_from_every_pod_and_places_nothing(
    api: MiniApi, client: KubeClient
) -> None:
    seed_pods(api)
    lines: list[str] = []
    dry = await release_gated(client, None, dry_run=True, say=lines.append)
    assert pods_summary(dry, True) == "2 gated pod(s) would be ungated (dry run: nothing changed)"
    assert api.calls("PATCH", "pods") == []
    lines.clear()
    outcomes = await release_gated(client, None, dry_run=False, say=lines.append)
    assert lines == [
        "ungated Pod ci/marked (waiting for placeholder affinity-assistant-0123456789)",
        "ungated Pod deploy/policy (gated by the admission policy, never marked)",
    ]
    assert pods_summary(outcomes, False) == "ungated 2 pod(s)"
    marked = api.get("pods", "ci", "marked")
    assert marked is not None
    assert marked["spec"]["schedulingGates"] == [{"name": "example.com/quota"}]
    assert "affinity" not in marked["spec"]  # placed nowhere: no pin
    policy = api.get("pods", "deploy", "policy")
    assert policy is not None
    assert policy["spec"]["schedulingGates"] == []
    other = api.get("pods", "ci", "other")
    assert other is not None
    assert other["spec"]["schedulingGates"] == [{"name": "example.com/quota"}]
    # Run again: nothing left.
    again = await release_gated(client, ["ci", "deploy"], dry_run=False, say=lines.append)
    assert pods_summary(again, False) == "no pod is held by the coschedule.dev/placeholder gate"
