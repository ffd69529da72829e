"""A run's first pod, arriving while its placeholder is on its way, waits for the binding.

Through the whole ``coschedule serve`` process (real HTTPS, its caches fed by the kmock
emulator's watches): a Tekton pod posted while its placeholder's pod was made a moment ago
and is not bound yet waits, and the binding delivered by the watch within the bound
(``placeholder-bind-wait-seconds``) gets it pinned at admission, with the same JSONPatch as a
pod admitted once the placeholder was bound; not bound within the bound, it is gated as
without the wait, and the run's next pod is gated at once. A placeholder the scheduler
cannot place, or none at all, is no reason to wait, unless the webhook admitted the pod's
PipelineRun a moment ago (the reconciler is about to make its placeholder). A pod that
waited for the caches first may then wait for the binding too, within the request's total
bound. Counted in the webhook's metrics and logged with the decision.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from coschedule.k8s.timefmt import parse_time, rfc3339
from coschedule.marks import (
    ANNOTATION_PINNED_NODE,
    ANNOTATION_RUN_ADMITTED,
    GATE_PLACEHOLDER,
    placeholder_labels,
)
from coschedule.server.pod_endpoint import TOTAL_WAIT_SECONDS
from tests.concurrency.runs import pipeline_run
from tests.concurrency.test_runs_https import (
    ENABLED,
    Obj,
    https,
    is_ready,
    namespace,
    patched,
    until,
)
from tests.concurrency.test_runs_https import admit as admit_run
from tests.conftest import RunningServer, launch_server, stop_server, write_kubeconfig
from tests.fixtures import admission_review, load_pod
from tests.kube.test_placeholder_cache import placeholder_pod
from tests.mutate.test_placement import placeholder_of
from tests.reconcile.apiserver import MiniApi
from tests.server.test_cache_sync import listening
from tests.server.test_placement_https import admit_pod, node_pin

BOUND = 1.5  # placeholder-bind-wait-seconds in this suite: short, for the tests' sake
CONFIG = {
    "coschedule": "pipelineruns",
    "placement": "auto",
    "placeholder-bind-wait-seconds": str(BOUND),
}
POD = "tekton-taskrun-no-workspace"  # PipelineRun pr-7f3k2 in ci, no claim


@pytest.fixture
async def start(
    api: MiniApi, tmp_path: Path
) -> AsyncIterator[Callable[[], Awaitable[RunningServer]]]:
    """Starts ``serve`` against the emulator (what the test put there is in its first
    lists) and returns it once ready: its caches read."""
    api.put("namespaces", namespace("ci", ENABLED))
    started: list[RunningServer] = []

    async def launch() -> RunningServer:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
        running = launch_server(
            tmp_path, kubeconfig=kubeconfig, config=CONFIG, extra_args=["--log-level", "debug"]
        )
        started.append(running)
        await until(running, lambda: is_ready(running))
        return running

    yield launch
    for running in started:
        await asyncio.to_thread(stop_server, running)


def now() -> str:
    return rfc3339(datetime.now(UTC))


def statefulset(placeholder: str) -> Obj:
    """The placeholder StatefulSet as the reconciler makes it (its labels), made just now."""
    return {
        "metadata": {
            "name": placeholder,
            "namespace": "ci",
            "labels": placeholder_labels(placeholder),
            "creationTimestamp": now(),
        },
        "spec": {"replicas": 1, "template": {"spec": {"containers": []}}},
    }


def young_pod(placeholder: str, **status: Any) -> Obj:
    """The StatefulSet's pod, made just now by kube-controller-manager, not bound yet."""
    obj = placeholder_pod("ci", placeholder)
    obj["metadata"]["creationTimestamp"] = now()
    obj["status"].update(status)
    return obj


async def metrics(server: RunningServer) -> str:
    async with httpx.AsyncClient() as plain:
        return (await plain.get(server.health_url + "/metrics")).text


def ops(response: Obj) -> list[Any]:
    found: list[Any] = orjson.loads(base64.b64decode(response["patch"]))
    return found


async def watched(api: MiniApi, server: RunningServer, http: httpx.AsyncClient) -> None:
    """Until the webhook's pod watch has delivered everything put before: a placeholder pod
    put after them, bound, pins its run's pod (one watch delivers its events in order)."""
    sentinel = load_pod(POD)
    sentinel["metadata"]["labels"]["tekton.dev/pipelineRun"] = "sentinel"
    api.put("pods", placeholder_pod("ci", placeholder_of(sentinel), node="node-z"))

    async def pinned() -> bool:
        return node_pin(patched(r := admission_review(sentinel), await admit_pod(http, r))) == [
            "node-z"
        ]

    await until(server, pinned)


async def unbound(
    api: MiniApi, start: Callable[[], Awaitable[RunningServer]]
) -> tuple[RunningServer, Obj, str]:
    """The webhook ready, then the run's placeholder made just now (its StatefulSet, and its
    pod by kube-controller-manager), not bound yet (kube-scheduler's turn): worth a wait.
    Returns the server, the run's first pod and its placeholder."""
    server = await start()
    pod = load_pod(POD)
    placeholder = placeholder_of(pod)
    api.put("statefulsets", statefulset(placeholder))
    api.put("pods", young_pod(placeholder))
    return server, pod, placeholder


async def timed_admit(http: httpx.AsyncClient, review: Obj) -> tuple[Obj, float]:
    began = time.monotonic()
    response = await admit_pod(http, review)
    return response, time.monotonic() - began


async def test_a_pod_before_its_placeholder_is_bound_waits_and_is_pinned_at_admission(
    api: MiniApi, start: Callable[[], Awaitable[RunningServer]]
) -> None:
    server, pod, placeholder = await unbound(api, start)
    async with https(server) as http:
        await watched(api, server, http)
        review = admission_review(pod)
        posted = asyncio.create_task(timed_admit(http, review))
        await asyncio.sleep(0.4)
        assert not posted.done()  # held for the binding, not gated at once
        api.edit("pods", "ci", f"{placeholder}-0", {"spec": {"nodeName": "node-b"}})
        response, waited = await posted
        assert 0.35 <= waited < BOUND  # answered on the watch's event, not at the bound
        first = patched(review, response)
        assert node_pin(first) == ["node-b"]
        assert not first["spec"].get("schedulingGates")
        assert first["metadata"]["annotations"][ANNOTATION_PINNED_NODE] == "node-b"

        # The same JSONPatch as a pin at admission of a pod that found it already bound.
        review = admission_review(pod)
        again, quick = await timed_admit(http, review)
        assert quick < 0.35
        assert ops(again) == ops(response)
        # Admitted once more on its own output (reinvocation): nothing to add, no wait.
        review = admission_review(first)
        same, quick = await timed_admit(http, review)
        assert quick < 0.35
        assert "patch" not in same or ops(same) == []

    text = await metrics(server)
    assert 'coschedule_placeholder_bind_waits_total{outcome="pinned"} 1.0' in text
    assert 'coschedule_placeholder_bind_waits_total{outcome="gated"}' not in text
    assert "coschedule_placeholder_bind_wait_seconds_count 1.0" in text
    assert 'coschedule_placeholder_bind_wait_seconds_bucket{le="0.25"} 0.0' in text
    assert 'coschedule_placeholder_bind_wait_seconds_bucket{le="1.5"} 1.0' in text
    [line] = [line for line in server.log().splitlines() if "bind_wait_ms" in line]
    assert "pinned=true" in line, line


async def test_not_bound_within_the_bound_the_pod_is_gated_and_the_runs_next_pod_waits_not(
    api: MiniApi, start: Callable[[], Awaitable[RunningServer]]
) -> None:
    server, pod, _ = await unbound(api, start)  # and nobody binds it
    async with https(server) as http:
        await watched(api, server, http)
        review = admission_review(pod)
        response, waited = await timed_admit(http, review)
        assert BOUND * 0.9 <= waited < BOUND + 1.0
        gated = patched(review, response)
        assert gated["spec"]["schedulingGates"] == [{"name": GATE_PLACEHOLDER}]
        assert node_pin(gated) is None

        # The run's next pod: its placeholder made one pod wait in vain, so no wait now.
        later = load_pod(POD)
        later["metadata"]["name"] = "pr-7f3k2-test-pod"
        review = admission_review(later)
        response, quick = await timed_admit(http, review)
        assert quick < 0.5
        assert patched(review, response)["spec"]["schedulingGates"] == [{"name": GATE_PLACEHOLDER}]

    text = await metrics(server)
    assert 'coschedule_placeholder_bind_waits_total{outcome="gated"} 1.0' in text
    assert 'coschedule_placeholder_bind_waits_total{outcome="pinned"}' not in text


@pytest.mark.parametrize(
    "what",
    ["no placeholder", "unschedulable", "unbound for long", "statefulset old, no pod"],
)
async def test_a_placeholder_not_on_its_way_is_no_reason_to_wait(
    api: MiniApi, start: Callable[[], Awaitable[RunningServer]], what: str
) -> None:
    pod = load_pod(POD)
    placeholder = placeholder_of(pod)
    if what == "unschedulable":
        api.put("statefulsets", statefulset(placeholder))
        condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
        api.put("pods", young_pod(placeholder, conditions=[condition]))
    elif what == "unbound for long":
        api.put("statefulsets", statefulset(placeholder))
        api.put("pods", placeholder_pod("ci", placeholder))  # made days ago (the emulator's)
    elif what == "statefulset old, no pod":
        old = statefulset(placeholder)
        del old["metadata"]["creationTimestamp"]  # the emulator's: days ago
        api.put("statefulsets", old)
    server = await start()  # ready: its first lists hold what was put above
    async with https(server) as http:
        review = admission_review(pod)
        response, quick = await timed_admit(http, review)
        assert quick < 0.5, what
        assert patched(review, response)["spec"]["schedulingGates"] == [{"name": GATE_PLACEHOLDER}]
    assert "coschedule_placeholder_bind_waits_total{" not in await metrics(server)


# A pod that comes before the reconciler has made its placeholder at all: its PipelineRun,
# admitted by this webhook a moment ago, says the placeholder is on its way.


def run_review(name: str = "pr-7f3k2", *, generate: bool = False, **kwargs: Any) -> Obj:
    """A PipelineRun's CREATE as kube-apiserver sends it to ``/mutate-runs``; with
    ``generate``, made with ``generateName`` (no name yet at admission)."""
    run = pipeline_run(name, **kwargs)
    if generate:
        run["metadata"]["generateName"] = run["metadata"].pop("name")
    return admission_review(run, kind="PipelineRun")


async def admitted_run(http: httpx.AsyncClient, review: Obj) -> None:
    response = await admit_run(http, review)
    assert response["allowed"] is True


@pytest.mark.parametrize(
    "run",
    [run_review(), run_review("pr-", generate=True)],
    ids=["named", "generateName"],
)
async def test_a_pod_before_its_placeholder_exists_waits_when_its_run_was_admitted_here(
    api: MiniApi, start: Callable[[], Awaitable[RunningServer]], run: Obj
) -> None:
    server = await start()
    pod = load_pod(POD)  # of run pr-7f3k2: "pr-" and 5 generated characters
    placeholder = placeholder_of(pod)
    async with https(server) as http:
        await watched(api, server, http)
        await admitted_run(http, run)
        review = admission_review(pod)
        posted = asyncio.create_task(timed_admit(http, review))
        await asyncio.sleep(0.3)
        assert not posted.done()  # nothing of the placeholder seen, and yet held
        # The reconciler makes the StatefulSet, kube-controller-manager its pod, then
        # kube-scheduler binds it: each seen through the watches.
        api.put("statefulsets", statefulset(placeholder))
        api.put("pods", young_pod(placeholder))
        await asyncio.sleep(0.2)
        assert not posted.done()
        api.edit("pods", "ci", f"{placeholder}-0", {"spec": {"nodeName": "node-b"}})
        response, waited = await posted
        assert 0.45 <= waited < BOUND
        first = patched(review, response)
        assert node_pin(first) == ["node-b"]
        assert not first["spec"].get("schedulingGates")

        # The same JSONPatch as a pod that found the placeholder bound.
        again, quick = await timed_admit(http, admission_review(pod))
        assert quick < 0.35
        assert ops(again) == ops(response)

    text = await metrics(server)
    assert 'coschedule_placeholder_bind_waits_total{outcome="pinned"} 1.0' in text


async def test_a_pod_waits_when_another_replica_admitted_its_run(
    api: MiniApi, tmp_path: Path
) -> None:
    """Two webhook replicas: the run's CREATE reaches one, its first pod the other, which
    never saw the run. The run's stamp, copied onto the pod by Tekton, says that its
    placeholder is on its way: the pod waits and is pinned, as on the replica that
    admitted the run. Without the stamp it is gated at once."""
    api.put("namespaces", namespace("ci", ENABLED))
    replicas = []
    for name in ("a", "b"):
        kubeconfig = write_kubeconfig(tmp_path / f"{name}.kubeconfig", api.url)
        replicas.append(launch_server(tmp_path / name, kubeconfig=kubeconfig, config=CONFIG))
    try:
        one, other = replicas
        await until(one, lambda: is_ready(one))
        await until(other, lambda: is_ready(other))
        review = run_review()
        async with https(one) as http:
            run = patched(review, await admit_run(http, review))
        stamp = run["metadata"]["annotations"][ANNOTATION_RUN_ADMITTED]
        assert abs(parse_time(stamp) - time.time()) < 5  # type: ignore[operator]
        pod = load_pod(POD)
        unstamped = admission_review(pod)
        # Tekton copies the run's annotations onto its TaskRuns, and theirs onto the pods.
        pod["metadata"].setdefault("annotations", {}).update(run["metadata"]["annotations"])
        placeholder = placeholder_of(pod)
        async with https(other) as http:
            await watched(api, other, http)
            response, quick = await timed_admit(http, unstamped)
            assert quick < 0.5
            assert patched(unstamped, response)["spec"]["schedulingGates"] == [
                {"name": GATE_PLACEHOLDER}
            ]
            stamped = admission_review(pod)
            posted = asyncio.create_task(timed_admit(http, stamped))
            await asyncio.sleep(0.3)
            assert not posted.done()  # nothing of the placeholder seen here, and yet held
            api.put("statefulsets", statefulset(placeholder))
            api.put("pods", young_pod(placeholder, phase="Pending"))
            api.edit("pods", "ci", f"{placeholder}-0", {"spec": {"nodeName": "node-b"}})
            response, waited = await posted
            assert waited < BOUND
            assert node_pin(patched(stamped, response)) == ["node-b"]
    finally:
        for replica in replicas:
            await asyncio.to_thread(stop_server, replica)


async def test_a_run_admitted_here_whose_placeholder_never_comes_gates_its_pod_after_the_bound(
    api: MiniApi, start: Callable[[], Awaitable[RunningServer]]
) -> None:
    server = await start()
    async with https(server) as http:
        await watched(api, server, http)
        await admitted_run(http, run_review())
        review = admission_review(load_pod(POD))
        response, waited = await timed_admit(http, review)
        assert BOUND * 0.9 <= waited < BOUND + 1.0
        gated = patched(review, response)
        assert gated["spec"]["schedulingGates"] == [{"name": GATE_PLACEHOLDER}]
        assert node_pin(gated) is None
    text = await metrics(server)
    assert 'coschedule_placeholder_bind_waits_total{outcome="gated"} 1.0' in text


@pytest.mark.parametrize(
    "run",
    [
        run_review(namespace="team"),  # the same name in another namespace
        run_review("pr-other"),  # another run
        run_review("pr-7f3", generate=True),  # a prefix that does not make this name
        run_review(status="PipelineRunPending"),  # held: no placeholder until started
        admission_review(pipeline_run("pr-7f3k2"), kind="PipelineRun", dry_run=True),
    ],
    ids=["other namespace", "other run", "other prefix", "held", "dry run"],
)
async def test_a_run_admitted_here_that_is_not_the_pods_seeded_run_is_no_reason_to_wait(
    api: MiniApi, start: Callable[[], Awaitable[RunningServer]], run: Obj
) -> None:
    server = await start()
    async with https(server) as http:
        await watched(api, server, http)
        await admitted_run(http, run)
        review = admission_review(load_pod(POD))
        response, quick = await timed_admit(http, review)
        assert quick < 0.5
        assert patched(review, response)["spec"]["schedulingGates"] == [{"name": GATE_PLACEHOLDER}]
    assert "coschedule_placeholder_bind_waits_total{" not in await metrics(server)


@contextlib.asynccontextmanager
async def serving(
    api: MiniApi, tmp_path: Path, config: dict[str, str], *, ready: bool = True
) -> AsyncIterator[RunningServer]:
    """``serve`` with ``config``, once ready (or, not ``ready``, once it listens: a cache
    list the test holds keeps it unready); stopped after the block."""
    api.put("namespaces", namespace("ci", ENABLED))
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
    server = launch_server(tmp_path, kubeconfig=kubeconfig, config=config)
    try:
        await until(server, lambda: is_ready(server) if ready else listening(server))
        yield server
    finally:
        for hold in api.holds.values():
            hold.set()
        await asyncio.to_thread(stop_server, server)


async def on_its_way_now(api: MiniApi) -> str:
    """The run's placeholder made just now (its StatefulSet and its unbound pod)."""
    placeholder = placeholder_of(load_pod(POD))
    api.put("statefulsets", statefulset(placeholder))
    api.put("pods", young_pod(placeholder))
    return placeholder


async def pinned_once_bound(
    api: MiniApi,
    server: RunningServer,
    placeholder: str,
    review: Obj,
    posted: asyncio.Task[tuple[Obj, float]],
) -> float:
    """The placeholder's pod bound now: the waiting pod is pinned there at admission, and
    counted so; returns how long its request took."""
    api.edit("pods", "ci", f"{placeholder}-0", {"spec": {"nodeName": "node-b"}})
    response, waited = await posted
    first = patched(review, response)
    assert node_pin(first) == ["node-b"]
    assert not first["spec"].get("schedulingGates")
    text = await metrics(server)
    assert 'coschedule_placeholder_bind_waits_total{outcome="pinned"} 1.0' in text
    return waited


# A request that waited for something else first (here: the caches, at the webhook's
# start) may then wait for the binding too, within the request's total bound.


async def test_after_a_wait_for_the_caches_a_pod_waits_for_the_binding_too(
    api: MiniApi, tmp_path: Path
) -> None:
    hold = api.holds[("GET", "namespaces")] = asyncio.Event()
    async with serving(api, tmp_path, CONFIG, ready=False) as server:
        placeholder = await on_its_way_now(api)
        async with https(server) as http:
            await asyncio.sleep(0.3)  # the placeholder pod's watch delivers it
            review = admission_review(load_pod(POD))
            posted = asyncio.create_task(timed_admit(http, review))
            await asyncio.sleep(0.4)
            assert not posted.done()  # waiting for the namespaces
            hold.set()
            await asyncio.sleep(0.4)
            assert not posted.done()  # decided once more: now waiting for the binding
            waited = await pinned_once_bound(api, server, placeholder, review, posted)
            assert 0.7 <= waited < TOTAL_WAIT_SECONDS


async def test_after_a_wait_for_the_caches_the_bind_wait_is_cut_to_the_total_bound(
    api: MiniApi, tmp_path: Path
) -> None:
    """The caches read only after 1.8 s, the placeholder never bound: the bind wait gets
    what is left of the request's total bound, not its own 3 s."""
    hold = api.holds[("GET", "namespaces")] = asyncio.Event()
    config = {**CONFIG, "placeholder-bind-wait-seconds": "3"}
    async with serving(api, tmp_path, config, ready=False) as server:
        await on_its_way_now(api)
        async with https(server) as http:
            await asyncio.sleep(0.3)
            review = admission_review(load_pod(POD))
            posted = asyncio.create_task(timed_admit(http, review))
            await asyncio.sleep(1.8)
            hold.set()
            response, waited = await posted
            assert 2.5 <= waited < TOTAL_WAIT_SECONDS + 0.5  # not 1.8 + 3
            gated = patched(review, response)
            assert gated["spec"]["schedulingGates"] == [{"name": GATE_PLACEHOLDER}]


def run_claim(name: str) -> Obj:
    """The claim Tekton makes from the run's volumeClaimTemplate just before its pod."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": name,
            "namespace": "ci",
            "ownerReferences": [
                {
                    "apiVersion": "tekton.dev/v1",
                    "kind": "PipelineRun",
                    "name": "pr-7f3k2",
                    "uid": "u",
                }
            ],
        },
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}},
            "storageClassName": "wait-for-first-consumer",
        },
    }


async def test_after_a_wait_for_a_late_claim_a_pod_waits_for_the_binding_too(
    api: MiniApi, tmp_path: Path
) -> None:
    """rewrite-claims: a pod whose claim the cache has not seen yet waits for it; decided
    once more, its placeholder on its way but not bound, it waits for the binding as well
    (before, it was gated then), and is pinned at admission, all within the total bound."""
    pod = load_pod("tekton-taskrun")  # of the same run; mounts its claim pvc-1f1344866c
    [claim] = [
        v["persistentVolumeClaim"]["claimName"]
        for v in pod["spec"]["volumes"]
        if "persistentVolumeClaim" in v
    ]
    config = {**CONFIG, "rewrite-claims": "true"}
    async with serving(api, tmp_path, config) as server, https(server) as http:
        await watched(api, server, http)
        placeholder = await on_its_way_now(api)
        review = admission_review(pod)
        posted = asyncio.create_task(timed_admit(http, review))
        await asyncio.sleep(0.3)
        assert not posted.done()  # waiting for the claim
        api.put("persistentvolumeclaims", run_claim(claim))
        await asyncio.sleep(0.3)
        assert not posted.done()  # decided once more: now waiting for the binding
        waited = await pinned_once_bound(api, server, placeholder, review, posted)
        assert 0.5 <= waited < TOTAL_WAIT_SECONDS
