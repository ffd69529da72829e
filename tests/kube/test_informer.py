"""The informer over real HTTP: list then watch with bookmarks, resume, 410 relist, backoff."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from coschedule.kube import informer as informer_module
from coschedule.kube.client import KubeClient
from coschedule.kube.informer import Informer
from coschedule.wire.watch_events import POD_CACHE
from tests.reconcile.apiserver import MiniApi
from tests.reconcile.conftest import eventually


def pod(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ci", "labels": labels}, "spec": {}}


@pytest.fixture
async def running() -> AsyncIterator[list[asyncio.Task[None]]]:
    tasks: list[asyncio.Task[None]] = []
    yield tasks
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task


def start(informer: Informer, tasks: list[asyncio.Task[None]]) -> list[tuple[str, str]]:
    seen: list[tuple[str, str]] = []
    informer.add_handler(lambda kind, obj, old: seen.append((kind, obj["metadata"]["name"])))
    tasks.append(asyncio.create_task(informer.run()))
    return seen


async def test_list_then_watch_with_bookmarks_resumes_without_relisting(
    api: MiniApi, client: KubeClient, running: list[asyncio.Task[None]]
) -> None:
    api.put("pods", pod("marked", **{"coschedule.dev/placeholder": "p1"}))
    api.put("pods", pod("other"))
    relists: list[int] = []
    informer = Informer(
        client,
        "/api/v1/pods",
        name="pods",
        label_selector="coschedule.dev/placeholder",
        on_relist=lambda: relists.append(1),
    )
    seen = start(informer, running)
    await asyncio.wait_for(informer.synced.wait(), 3)
    assert set(informer.keys()) == {"ci/marked"}
    await eventually(lambda: api.count("WATCH", "pods") == 1)
    [(_, _, query)] = api.calls("WATCH", "pods")
    assert query["allowWatchBookmarks"] == "true"
    assert query["labelSelector"] == "coschedule.dev/placeholder"
    listed_at = query["resourceVersion"]

    # Other resources move the global resourceVersion on; a bookmark carries it to us.
    api.put("nodes", {"metadata": {"name": "worker-1"}})
    api.send_bookmarks()
    await eventually(lambda: informer.resource_version == str(api.version))
    assert informer.resource_version != listed_at

    # History before the bookmark is compacted and the watch ends: resuming from the
    # bookmark still works, so there is no relist.
    api.compact()
    api.end_watches()
    await eventually(lambda: api.count("WATCH", "pods") == 2)
    assert api.calls("WATCH", "pods")[1][2]["resourceVersion"] == str(api.version)
    api.put("pods", pod("late", **{"coschedule.dev/placeholder": "p2"}))
    await eventually(lambda: "ci/late" in informer)
    assert informer.lists == 1
    assert api.count("GET", "pods") == 1
    assert relists == []
    assert seen == [("ADDED", "marked"), ("ADDED", "late")]


async def test_expired_watch_relists_and_reports_what_was_missed(
    api: MiniApi, client: KubeClient, running: list[asyncio.Task[None]]
) -> None:
    for name in ("a", "b"):
        api.put("pods", pod(name, **{"coschedule.dev/placeholder": "p"}))
    relists: list[int] = []
    informer = Informer(
        client,
        "/api/v1/pods",
        name="pods",
        label_selector="coschedule.dev/placeholder",
        on_relist=lambda: relists.append(1),
    )
    seen = start(informer, running)
    await asyncio.wait_for(informer.synced.wait(), 3)
    await eventually(lambda: api.count("WATCH", "pods") == 1)

    # The connection drops while b is deleted and c created; etcd compacts meanwhile.
    api.muted = True
    api.remove("pods", "ci", "b")
    api.put("pods", pod("c", **{"coschedule.dev/placeholder": "p"}))
    api.muted = False
    api.compact()
    api.end_watches()

    await eventually(lambda: informer.lists == 2)
    await eventually(lambda: set(informer.keys()) == {"ci/a", "ci/c"})
    assert relists == [1]
    assert ("DELETED", "b") in seen
    assert ("ADDED", "c") in seen
    # Only the one relist: the new watch resumes from the relist's version.
    await eventually(lambda: api.count("WATCH", "pods") == 3)
    assert api.calls("WATCH", "pods")[-1][2]["resourceVersion"] == str(api.version)
    assert informer.lists == 2


async def test_410_status_on_the_watch_request_also_relists(
    api: MiniApi, client: KubeClient, running: list[asyncio.Task[None]]
) -> None:
    api.put("nodes", {"metadata": {"name": "n1"}})
    api.faults[("WATCH", "nodes")] = [410]
    relists: list[int] = []
    informer = Informer(client, "/api/v1/nodes", name="nodes", on_relist=lambda: relists.append(1))
    start(informer, running)
    await eventually(lambda: informer.lists == 2)
    assert relists == [1]
    assert set(informer.keys()) == {"n1"}


async def test_watch_errors_back_off_with_jitter_and_recover(
    api: MiniApi,
    client: KubeClient,
    running: list[asyncio.Task[None]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(informer_module, "BACKOFF_START", 0.05)
    api.faults[("WATCH", "nodes")] = [500, 429, 503]
    informer = Informer(client, "/api/v1/nodes", name="nodes")
    start(informer, running)
    await asyncio.wait_for(informer.synced.wait(), 3)
    await eventually(lambda: api.count("WATCH", "nodes") == 4, within=5)
    api.put("nodes", {"metadata": {"name": "n2"}})
    await eventually(lambda: "n2" in informer)
    assert informer.lists == 1  # errors other than 410 resume the watch, never relist


async def test_a_watch_silent_past_its_read_timeout_is_watched_again_without_a_relist(
    api: MiniApi,
    client: KubeClient,
    running: list[asyncio.Task[None]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The emulator's watch stays open and sends nothing (as a connection whose peer is
    gone without a FIN): past the read timeout the informer watches again, from where it
    was, and an object made then arrives."""
    monkeypatch.setattr(informer_module, "WATCH_READ_TIMEOUT_SECONDS", 0.3)
    monkeypatch.setattr(informer_module, "BACKOFF_START", 0.05)
    informer = Informer(client, "/api/v1/nodes", name="nodes")
    start(informer, running)
    await asyncio.wait_for(informer.synced.wait(), 3)
    await eventually(lambda: api.count("WATCH", "nodes") >= 3, within=5)
    assert informer.last_error is not None
    assert "nothing more of the body in 0.3 s" in informer.last_error
    api.put("nodes", {"metadata": {"name": "n2"}})
    await eventually(lambda: "n2" in informer)
    assert informer.lists == 1


def by_run(obj: dict[str, Any]) -> list[str]:
    run = (obj["metadata"].get("labels") or {}).get("run")
    return [run] if run else []


def names(informer: Informer, run: str) -> list[str]:
    return [obj["metadata"]["name"] for obj in informer.by_index("run", run)]


async def test_indexes_follow_adds_updates_deletes_and_relists(
    api: MiniApi, client: KubeClient, running: list[asyncio.Task[None]]
) -> None:
    api.put("pods", pod("a", run="r1"))
    api.put("pods", pod("b", run="r1"))
    informer = Informer(client, "/api/v1/pods", name="pods", indexers={"run": by_run})
    olds: list[tuple[str, str | None]] = []
    informer.add_handler(
        lambda kind, obj, old: olds.append(
            (obj["metadata"]["name"], (old or {}).get("metadata", {}).get("labels", {}).get("run"))
        )
    )
    running.append(asyncio.create_task(informer.run()))
    await asyncio.wait_for(informer.synced.wait(), 3)
    assert names(informer, "r1") == ["a", "b"]
    await eventually(lambda: api.count("WATCH", "pods") == 1)

    # Added, then relabelled to another run: filed under the new value only.
    api.put("pods", pod("c", run="r2"))
    await eventually(lambda: names(informer, "r2") == ["c"])
    api.put("pods", pod("b", run="r2"))
    await eventually(lambda: names(informer, "r2") == ["b", "c"])
    assert names(informer, "r1") == ["a"]
    assert ("b", "r1") in olds  # the handler saw what the cache held before
    # Unlabelled: in no index; deleted: gone, and empty values are dropped.
    api.put("pods", pod("c"))
    await eventually(lambda: names(informer, "r2") == ["b"])
    api.remove("pods", "ci", "a")
    await eventually(lambda: names(informer, "r1") == [])
    assert informer.index_values("run") == {"r2"}

    # Missed while disconnected (b deleted, d added), then a relist: rebuilt from the list.
    api.muted = True
    api.remove("pods", "ci", "b")
    api.put("pods", pod("d", run="r1"))
    api.muted = False
    api.compact()
    api.end_watches()
    await eventually(lambda: informer.lists == 2)
    assert names(informer, "r1") == ["d"]
    assert names(informer, "r2") == []
    assert informer.index_values("run") == {"r1"}


async def test_a_metadata_only_informer_asks_for_metadata_and_takes_whole_objects(
    api: MiniApi, client: KubeClient, running: list[asyncio.Task[None]]
) -> None:
    """The list and the watch ask for PartialObjectMetadata (with plain JSON as the
    fallback); the emulator answers whole pods, as a server that does not convert does, and
    the transform reads them the same. A plain informer asks for plain JSON."""
    whole = pod("a", run="r1")
    whole["spec"] = {"containers": [{"name": "step", "image": "busybox"}]}
    whole["status"] = {"phase": "Running"}
    api.put("pods", whole)
    metadata = Informer(
        client,
        "/api/v1/pods",
        name="marked",
        transform=lambda obj: {"metadata": obj["metadata"]},
        indexers={"run": by_run},
        metadata_only=True,
    )
    plain = Informer(client, "/api/v1/nodes", name="nodes")
    start(metadata, running)
    start(plain, running)
    await asyncio.wait_for(metadata.synced.wait(), 3)
    await eventually(lambda: api.count("WATCH", "pods") == 1 and api.count("WATCH", "nodes") == 1)
    api.put("pods", pod("b", run="r1"))
    await eventually(lambda: names(metadata, "r1") == ["a", "b"])

    accepts = {(verb, plural): accept for verb, plural, accept in api.accepts}
    as_meta = "application/json;as=PartialObjectMetadata{};g=meta.k8s.io;v=v1,application/json"
    assert accepts[("GET", "pods")] == as_meta.format("List")
    assert accepts[("WATCH", "pods")] == as_meta.format("")
    assert accepts[("GET", "nodes")] == accepts[("WATCH", "nodes")] == "application/json"


async def test_a_shaped_informer_keeps_only_the_declared_fields_listed_and_watched(
    api: MiniApi, client: KubeClient, running: list[asyncio.Task[None]]
) -> None:
    """The reconciler's pod caches ask for ``POD_CACHE``: both the list page and the watch
    events come decoded that way, so the cache (the object as decoded) holds no container
    image, volume or pod IP; metadata stays whole."""
    listed = pod("a", run="r1")
    listed["spec"] = {
        "nodeName": "node-a",
        "containers": [
            {"name": "step", "image": "busybox", "resources": {"requests": {"cpu": "1"}}}
        ],
        "volumes": [{"name": "ws", "persistentVolumeClaim": {"claimName": "ws"}}],
    }
    listed["status"] = {"phase": "Running", "podIP": "10.244.0.9"}
    api.put("pods", listed)
    shaped = Informer(client, "/api/v1/pods", name="marked", shape=POD_CACHE)
    start(shaped, running)
    await asyncio.wait_for(shaped.synced.wait(), 3)
    await eventually(lambda: api.count("WATCH", "pods") == 1)
    api.put("pods", {**listed, "metadata": {**listed["metadata"], "name": "b"}})
    await eventually(lambda: "ci/b" in shaped)
    for name in ("a", "b"):
        obj = shaped.get(f"ci/{name}")
        assert obj is not None
        assert obj["spec"] == {
            "nodeName": "node-a",
            "containers": [{"resources": {"requests": {"cpu": "1"}}}],
        }
        assert obj["status"] == {"phase": "Running"}
        assert obj["metadata"]["labels"] == {"run": "r1"}
