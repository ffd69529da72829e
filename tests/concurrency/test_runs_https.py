"""``POST /mutate-runs`` of the real ``coschedule serve`` process with a cluster: over HTTPS
with its own certificate, its answers come from the watch-fed ConcurrencyControl and
namespace caches that the kmock emulator feeds (the other caches start from empty lists)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import jsonpatch
import orjson
import pytest

from coschedule.server.cache_gate import SYNC_WAIT_SECONDS
from tests.concurrency.runs import control, pipeline_run, workflow
from tests.conftest import (
    PATIENCE_SECONDS,
    RunningServer,
    launch_server,
    trust,
    write_kubeconfig,
)
from tests.fixtures import admission_review
from tests.reconcile.apiserver import MiniApi

Obj = dict[str, Any]

ENABLED = {"coschedule.dev/enabled": "true"}
CANCEL_BY_BRANCH: Obj = {"selector": {}, "strategy": "Cancel", "key": "$(params.branch)"}
QUEUE_PER_NAMESPACE: Obj = {
    "selector": {},
    "strategy": "Queue",
    "maxRunning": 1,
    "key": "$(context.namespace)",
}
WITHIN = PATIENCE_SECONDS  # a start-up or a watch event; polled, so green runs do not wait


def namespace(name: str, labels: dict[str, str] | None = None) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/metadata.name": name, **(labels or {})},
        },
    }


def seed(api: MiniApi) -> None:
    api.put("namespaces", namespace("ci", ENABLED))
    api.put("namespaces", namespace("deploy", ENABLED))
    api.put("namespaces", namespace("team", ENABLED))  # no control until a test adds one
    api.put("namespaces", namespace("sandbox"))  # not enabled
    api.put("concurrencycontrols", control("builds", CANCEL_BY_BRANCH, namespace="ci"))
    api.put("concurrencycontrols", control("releases", QUEUE_PER_NAMESPACE, namespace="deploy"))
    # A control in the namespace that is not enabled: only the missing label spares its runs.
    api.put("concurrencycontrols", control("builds", CANCEL_BY_BRANCH, namespace="sandbox"))


@pytest.fixture
async def serve(api: MiniApi, tmp_path: Path) -> AsyncIterator[Callable[[], RunningServer]]:
    """Starts ``coschedule serve --kubeconfig`` pointed at the seeded emulator (not awaited
    ready), so that a test can arrange the emulator before the process first calls it."""
    seed(api)
    started: list[RunningServer] = []

    def start() -> RunningServer:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
        started.append(launch_server(tmp_path, kubeconfig=kubeconfig))
        return started[-1]

    yield start
    for running in started:
        running.process.terminate()
        try:
            await asyncio.to_thread(running.process.wait, 30)
        except subprocess.TimeoutExpired:
            running.process.kill()
            await asyncio.to_thread(running.process.wait)


@pytest.fixture
async def server(serve: Callable[[], RunningServer]) -> RunningServer:
    """The server, once its /readyz says ready."""
    running = serve()
    await until(running, lambda: is_ready(running))
    return running


async def until(server: RunningServer, check: Callable[[], Awaitable[bool]]) -> None:
    """Poll ``check`` (the emulator keeps serving meanwhile) until true, or fail with the
    server's log after ``WITHIN`` seconds."""
    deadline = time.monotonic() + WITHIN
    while not await check():
        if server.process.poll() is not None:
            raise AssertionError(f"serve exited {server.process.returncode}:\n{server.log()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {WITHIN} s:\n{server.log()}")
        await asyncio.sleep(0.05)


async def readyz(server: RunningServer) -> tuple[int, Obj]:
    async with httpx.AsyncClient(timeout=5) as http:
        answer = await http.get(server.health_url + "/readyz")
    body: Obj = answer.json()
    return answer.status_code, body


async def is_ready(server: RunningServer) -> bool:
    with contextlib.suppress(httpx.TransportError):
        return (await readyz(server))[0] == 200
    return False


def https(server: RunningServer) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=server.url, verify=trust(server.ca), timeout=10)


async def admit(http: httpx.AsyncClient, review: Obj) -> Obj:
    answer = await http.post(
        "/mutate-runs",
        content=orjson.dumps(review),
        headers={"Content-Type": "application/json"},
    )
    assert answer.status_code == 200, answer.text
    doc: Obj = answer.json()
    assert doc["apiVersion"] == "admission.k8s.io/v1"
    assert doc["kind"] == "AdmissionReview"
    response: Obj = doc["response"]
    assert response["uid"] == review["request"]["uid"]
    return response


def patched(review: Obj, response: Obj) -> Obj:
    assert response["patchType"] == "JSONPatch"
    ops = orjson.loads(base64.b64decode(response["patch"]))
    result: Obj = jsonpatch.apply_patch(review["request"]["object"], ops)
    return result


def pr_review(name: str, ns: str, branch: str = "main") -> Obj:
    return admission_review(
        pipeline_run(name, namespace=ns, params={"branch": branch}), kind="PipelineRun"
    )


def wf_review(name: str, ns: str, branch: str = "main") -> Obj:
    return admission_review(
        workflow(name, namespace=ns, params={"branch": branch}), kind="Workflow"
    )


async def test_readyz_and_run_admission_wait_for_the_controls_cache(
    api: MiniApi, serve: Callable[[], RunningServer]
) -> None:
    # The first list of ConcurrencyControls is held: every other cache syncs meanwhile.
    gate = api.holds[("GET", "concurrencycontrols")] = asyncio.Event()
    server = serve()

    async def others_synced() -> bool:
        with contextlib.suppress(httpx.TransportError):
            checks = (await readyz(server))[1]["checks"]
            others = ("namespace-cache", "claim-cache", "volume-cache", "certificate", "config")
            return all(checks[name]["ok"] for name in others)
        return False

    await until(server, others_synced)
    status, body = await readyz(server)
    assert status == 503
    assert body["checks"]["concurrency-controls"]["ok"] is False
    assert body["checks"]["concurrency-controls"]["detail"].startswith(
        "ConcurrencyControl cache not synced yet"
    )
    async with https(server) as http:
        # Not read within the webhook's wait: the run is refused with a retryable 503
        # rather than admitted ungrouped.
        began = time.monotonic()
        response = await admit(http, pr_review("pr-early", "ci"))
        assert time.monotonic() - began >= SYNC_WAIT_SECONDS * 0.9  # it waited first
        assert response["allowed"] is False
        assert response["status"]["code"] == 503
        assert "concurrency-cache-not-synced" in response["status"]["message"]
        assert "patch" not in response

        gate.set()
        await until(server, lambda: is_ready(server))
        status, body = await readyz(server)
        assert body["checks"]["concurrency-controls"] == {"ok": True}
        # Synced: the same run is now grouped.
        review = pr_review("pr-early", "ci")
        stored = patched(review, await admit(http, review))
        assert stored["metadata"]["labels"]["concurrency.coschedule.dev/builds"] == "main"
    async with httpx.AsyncClient() as plain:
        metrics = (await plain.get(server.health_url + "/metrics")).text
    assert (
        'coschedule_admission_requests_total{allowed="false",code="503",mode="concurrency"} 1.0'
        in metrics
    )


async def test_a_run_made_while_the_controls_cache_syncs_is_decided_normally(
    api: MiniApi, serve: Callable[[], RunningServer]
) -> None:
    """The webhook's first second: the run waits for the ConcurrencyControls (bounded, on
    the cache's own sync), then is grouped and held as any other; nothing is refused."""
    gate = api.holds[("GET", "concurrencycontrols")] = asyncio.Event()
    server = serve()

    async def listening() -> bool:
        with contextlib.suppress(httpx.TransportError):
            async with https(server) as http:
                return (await http.get("/livez")).status_code == 200
        return False

    await until(server, listening)
    assert (await readyz(server))[0] == 503
    review = pr_review("pr-first", "ci")
    async with https(server) as http:
        posted = asyncio.create_task(admit(http, review))
        await asyncio.sleep(0.5)
        assert not posted.done()
        gate.set()
        run = patched(review, await posted)
    assert run["metadata"]["labels"]["concurrency.coschedule.dev/builds"] == "main"
    assert run["spec"]["status"] == "PipelineRunPending"
    async with httpx.AsyncClient() as plain:
        metrics = (await plain.get(server.health_url + "/metrics")).text
    assert 'code="503"' not in metrics
    assert "concurrency-cache-not-synced" not in server.log()


async def test_runs_are_grouped_and_held_by_the_clusters_controls(
    server: RunningServer,
) -> None:
    async with https(server) as http:
        # Cancel, keyed on the branch: a PipelineRun is grouped under its branch and created
        # pending (spec.status), its own labels kept.
        review = pr_review("pr-main", "ci", "main")
        response = await admit(http, review)
        assert response["allowed"] is True
        assert "warnings" not in response
        run = patched(review, response)
        assert run["metadata"]["labels"] == {
            "tekton.dev/pipeline": "build-and-test",
            "coschedule.dev/concurrency": "grouped",
            "concurrency.coschedule.dev/builds": "main",
        }
        assert run["metadata"]["annotations"] == {"coschedule.dev/pending-by": "concurrency"}
        assert run["spec"]["status"] == "PipelineRunPending"
        assert run["spec"]["params"] == [{"name": "branch", "value": "main"}]

        # A key that is no valid label value: the label holds its hash, the annotation the
        # key; an Argo Workflow is held by spec.suspend.
        review = wf_review("wf-login", "ci", "feature/login")
        run = patched(review, await admit(http, review))
        hashed = hashlib.sha256(b"feature/login").hexdigest()[:16]
        assert run["metadata"]["labels"]["concurrency.coschedule.dev/builds"] == hashed
        assert run["metadata"]["labels"]["coschedule.dev/concurrency"] == "grouped"
        assert run["metadata"]["annotations"] == {
            "concurrency.coschedule.dev/builds": "feature/login",
            "coschedule.dev/pending-by": "concurrency",
        }
        assert run["spec"]["suspend"] is True

        # Queue: held pending as well (the reconciler starts it when the queue lets it).
        for review, held in (
            (wf_review("wf-release", "deploy"), ("suspend", True)),
            (pr_review("pr-release", "deploy"), ("status", "PipelineRunPending")),
        ):
            run = patched(review, await admit(http, review))
            assert run["metadata"]["labels"]["concurrency.coschedule.dev/releases"] == "deploy"
            assert run["metadata"]["labels"]["coschedule.dev/concurrency"] == "grouped"
            assert run["metadata"]["annotations"]["coschedule.dev/pending-by"] == "concurrency"
            assert run["spec"][held[0]] == held[1]

        # The namespace that is not enabled: untouched, although a control there matches.
        for review in (pr_review("pr-sandbox", "sandbox"), wf_review("wf-sandbox", "sandbox")):
            response = await admit(http, review)
            assert response == {"uid": review["request"]["uid"], "allowed": True}


async def test_a_control_is_picked_up_and_dropped_through_the_watch(
    api: MiniApi, server: RunningServer
) -> None:
    async with https(server) as http:
        response = await admit(http, pr_review("pr-0", "team"))
        assert response == {"uid": response["uid"], "allowed": True}

        api.put("concurrencycontrols", control("late", CANCEL_BY_BRANCH, namespace="team"))
        grouped: list[Obj] = []

        async def grouped_now() -> bool:
            review = pr_review(f"pr-{len(grouped) + 1}", "team")
            response = await admit(http, review)
            if "patch" not in response:
                return False
            grouped.append(patched(review, response))
            return True

        await until(server, grouped_now)
        labels = grouped[0]["metadata"]["labels"]
        assert labels["concurrency.coschedule.dev/late"] == "main"
        assert labels["coschedule.dev/concurrency"] == "grouped"
        assert grouped[0]["spec"]["status"] == "PipelineRunPending"

        api.remove("concurrencycontrols", "team", "late")

        async def untouched_now() -> bool:
            response = await admit(http, wf_review("wf-after", "team"))
            return response == {"uid": response["uid"], "allowed": True}

        await until(server, untouched_now)
