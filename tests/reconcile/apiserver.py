"""A small stateful Kubernetes API behind kmock's HTTP server, for what kmock's own
``KubernetesEmulator`` (0.8) does not do:

- no ``resourceVersion`` on objects, and the list's is the literal ``"..."``: no resume,
  no optimistic concurrency (a stale PATCH/PUT is never 409);
- ``labelSelector`` is ignored on list and watch;
- a watch replays every object as ADDED and never sends BOOKMARK or 410 Gone;
- PUT is not routed (404), and writes are applied to its store even when a test reaction
  answers them, so an injected 409 would still change the object;
- ``/api/v1/namespaces[/NAME]`` (the cluster-scoped Namespaces) cannot be parsed: it reads
  ``namespaces`` as the prefix of a namespaced path (a list is a 500): ``Scaffold`` fixes that.

So the state lives here and kmock serves it: ``kmock.KubernetesScaffold`` gives the real
HTTP server (aiohttp), request parsing into (action, resource, namespace, name) and
Kubernetes ``Status`` error bodies; ``MiniApi.handle`` is the reaction for each resource.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import kmock

from coschedule.wire import jsonpatch

Obj = dict[str, Any]
Key = tuple[str, str | None, str]  # (resource path, namespace, name)

# What kmock routes the Namespaces under (see ``Scaffold``); ``MiniApi`` says "namespaces".
NAMESPACES_ALIAS = "kmock-namespaces"
_NAMESPACES_PATH = re.compile(r"^/api/v1/namespaces(/[^/]+)?/?$")


class Scaffold(kmock.KubernetesScaffold):
    """kmock's scaffold, with ``/api/v1/namespaces[/NAME]`` served as the cluster-scoped
    resource it is (kmock 0.8 cannot parse it): such a request is routed as
    ``/api/v1/kmock-namespaces[/NAME]``, with its query (``watch``, ``resourceVersion``)."""

    async def __call__(self, raw_request: Any) -> Any:  # aiohttp's request and response
        found = _NAMESPACES_PATH.match(raw_request.path)
        if found is not None:
            path = f"/api/v1/{NAMESPACES_ALIAS}{found.group(1) or ''}"
            query = raw_request.query_string
            raw_request = raw_request.clone(rel_url=f"{path}?{query}" if query else path)
        return await super().__call__(raw_request)


RESOURCES = {
    "namespaces": ("", "v1"),  # served through ``Scaffold`` only
    "pods": ("", "v1"),
    "nodes": ("", "v1"),
    "events": ("", "v1"),
    "persistentvolumeclaims": ("", "v1"),
    "persistentvolumes": ("", "v1"),
    "statefulsets": ("apps", "v1"),
    "leases": ("coordination.k8s.io", "v1"),
    "pipelineruns": ("tekton.dev", "v1"),
    "taskruns": ("tekton.dev", "v1"),
    "workflows": ("argoproj.io", "v1alpha1"),
    "jobs": ("batch", "v1"),
    "concurrencycontrols": ("coschedule.dev", "v1alpha1"),
    "secrets": ("", "v1"),
    "mutatingwebhookconfigurations": ("admissionregistration.k8s.io", "v1"),
}

# Lists a strategic merge patch merges by a key (Kubernetes' patchMergeKey), for what the
# code under test patches that way: a webhook configuration's webhooks, by name.
_MERGE_KEYS = {"webhooks": "name"}


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """A strategic merge patch, for the lists in ``_MERGE_KEYS`` and the ``$patch: replace``
    directive (the map replaced whole); else a merge patch."""
    if isinstance(patch, dict) and patch.get("$patch") == "replace":
        return copy.deepcopy({k: v for k, v in patch.items() if k != "$patch"})
    if not isinstance(patch, dict) or not isinstance(target, dict):
        return merge_patch(target, patch)
    result = dict(target)
    for key, value in patch.items():
        merge_key = _MERGE_KEYS.get(key)
        if merge_key and isinstance(value, list) and isinstance(result.get(key), list):
            items = [copy.deepcopy(item) for item in result[key]]
            for change in value:
                found = [
                    i
                    for i, item in enumerate(items)
                    if item.get(merge_key) == change.get(merge_key)
                ]
                if found:
                    items[found[0]] = strategic_merge_patch(items[found[0]], change)
                else:
                    items.append(copy.deepcopy(change))
            result[key] = items
        elif value is None:
            result.pop(key, None)
        else:
            result[key] = strategic_merge_patch(result.get(key), value)
    return result


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _fields_match(obj: Obj, selector: str | None) -> bool:
    """``fieldSelector`` terms ``a.b=v`` / ``a.b!=v`` on dotted paths (as for pods'
    ``spec.nodeName`` and ``status.phase``); a missing field is the empty string."""
    for term in (selector or "").split(","):
        if not term.strip():
            continue
        negate = "!=" in term
        path, _, wanted = term.partition("!=" if negate else "=")
        value: Any = obj
        for part in path.strip().split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if (str(value or "") == wanted.strip()) == negate:
            return False
    return True


def _matches(labels: dict[str, str], selector: str | None) -> bool:
    for term in (selector or "").split(","):
        term = term.strip()
        if not term:
            continue
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.split("=", 1)
            if labels.get(key) != value.lstrip("="):
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


@dataclass
class _Watch:
    plural: str
    namespace: str | None
    selector: str | None
    queue: asyncio.Queue[Obj | None] = field(default_factory=asyncio.Queue)


class MiniApi:
    def __init__(
        self, handler: kmock.KubernetesScaffold, *, without: frozenset[str] = frozenset()
    ) -> None:
        self.objects: dict[Key, Obj] = {}
        self.history: list[tuple[int, str, Obj]] = []  # (rv, plural, event)
        self.compacted_before = 0  # watches from an older resourceVersion get 410
        self._rv = itertools.count(100)
        self.version = 100
        self.watches: list[_Watch] = []
        self.url = ""
        # (verb, plural, namespace, name, query): verb is WATCH for watches, else the method.
        self.requests: list[tuple[str, str, str | None, str | None, dict[str, str]]] = []
        # (verb, plural, the Accept header): answered as plain JSON whatever it asks, as a
        # server that does not convert to PartialObjectMetadata does.
        self.accepts: list[tuple[str, str, str]] = []
        self.deletes: list[tuple[str, str | None, str, Any]] = []  # with the DeleteOptions
        self.delays: dict[tuple[str, str], float] = {}  # (VERB, plural) -> seconds to hang
        self.faults: dict[tuple[str, str], list[int]] = {}  # (METHOD, plural) -> statuses
        self.bookmarks = True
        # When set, a request must carry one of these bearer tokens or is answered 401.
        self.tokens: set[str] | None = None
        # (VERB, plural) -> the request is answered only once the event is set (a gate the
        # test opens, e.g. to observe a cache before its first list is answered).
        self.holds: dict[tuple[str, str], asyncio.Event] = {}
        self.muted = False  # writes reach the store and history but no open watch
        for plural, (group, version) in RESOURCES.items():
            if plural in without:  # a CRD that is not installed: not served, not discovered
                continue
            routed = NAMESPACES_ALIAS if plural == "namespaces" else plural
            handler[kmock.resource(group, version, routed)] << self.handle

    # ---- direct access for tests (as a controller or a user would act) ----------------

    def _next_rv(self) -> str:
        self.version = next(self._rv)
        return str(self.version)

    def _publish(self, plural: str, event_type: str, obj: Obj, old: Obj | None = None) -> None:
        event = {"type": event_type, "object": copy.deepcopy(obj)}
        self.history.append((self.version, plural, event))
        if self.muted:
            return
        meta = obj.get("metadata") or {}
        old_meta = (old or {}).get("metadata") or {}
        for watch in self.watches:
            if watch.plural != plural:
                continue
            now_in, was_in = (
                self._visible(watch, meta),
                old is not None and self._visible(watch, old_meta),
            )
            # As the apiserver does for a selector: leaving it is DELETED, entering is ADDED.
            if now_in:
                kind = "ADDED" if event_type == "MODIFIED" and not was_in else event_type
            elif was_in and event_type == "MODIFIED":
                kind = "DELETED"
            else:
                continue
            watch.queue.put_nowait({"type": kind, "object": copy.deepcopy(obj)})

    @staticmethod
    def _visible(watch: _Watch, meta: Obj) -> bool:
        if watch.namespace is not None and meta.get("namespace") != watch.namespace:
            return False
        return _matches(meta.get("labels") or {}, watch.selector)

    def put(self, plural: str, obj: Obj) -> Obj:
        """Create or overwrite (a user's ``kubectl apply``)."""
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        key = (plural, meta.get("namespace"), meta["name"])
        old = self.objects.get(key)
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", "2026-11-21T06:00:00Z")
        meta["resourceVersion"] = self._next_rv()
        # As kube-apiserver keeps it: 1 at creation, moved by a change of anything but the
        # metadata and the status (a test may set one of its own).
        if old is None:
            meta.setdefault("generation", 1)
        elif meta.get("generation") == old["metadata"].get("generation"):
            meta["generation"] = (old["metadata"].get("generation") or 1) + (
                _spec_part(obj) != _spec_part(old)
            )
        self.objects[key] = obj
        self._publish(plural, "MODIFIED" if old is not None else "ADDED", obj, old)
        return obj

    def edit(self, plural: str, namespace: str | None, name: str, patch: Obj) -> Obj:
        return self.put(plural, merge_patch(self.objects[(plural, namespace, name)], patch))

    def remove(self, plural: str, namespace: str | None, name: str) -> None:
        obj = self.objects.pop((plural, namespace, name))
        obj["metadata"]["resourceVersion"] = self._next_rv()
        self._publish(plural, "DELETED", obj)

    def get(self, plural: str, namespace: str | None, name: str) -> Obj | None:
        return self.objects.get((plural, namespace, name))

    def compact(self) -> None:
        """Forget history, as etcd compaction does: older watches must relist (410)."""
        self.history.clear()
        self.compacted_before = self.version

    def send_bookmarks(self) -> None:
        """A BOOKMARK with the current resourceVersion to every open watch (as the
        apiserver sends about once a minute)."""
        mark = {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": str(self.version)}}}
        for watch in self.watches:
            watch.queue.put_nowait(copy.deepcopy(mark))

    def end_watches(self) -> None:
        """The server ends every open watch (as it does at its timeout)."""
        for watch in list(self.watches):
            watch.queue.put_nowait(None)

    def count(self, method: str, plural: str) -> int:
        return sum(1 for r in self.requests if r[0] == method and r[1] == plural)

    def calls(
        self, method: str, plural: str
    ) -> list[tuple[str | None, str | None, dict[str, str]]]:
        return [(r[2], r[3], r[4]) for r in self.requests if r[0] == method and r[1] == plural]

    # ---- the HTTP side ------------------------------------------------------------------

    async def handle(self, request: kmock.Request) -> Any:
        assert request.resource is not None
        plural = str(request.resource.plural)
        plural = "namespaces" if plural == NAMESPACES_ALIAS else plural
        method = str(request.method.value)
        verb = "WATCH" if request.action == kmock.action.WATCH else method
        self.requests.append((verb, plural, request.namespace, request.name, dict(request.params)))
        self.accepts.append((verb, plural, str(request.headers.get("Accept") or "")))
        if self.tokens is not None:
            sent = str(request.headers.get("Authorization") or "").removeprefix("Bearer ")
            if sent not in self.tokens:
                raise kmock.KubernetesError(status=401, reason="Unauthorized", message="token")
        hold = self.holds.get((verb, plural))
        if hold is not None:
            await hold.wait()
        delay = self.delays.get((verb, plural))
        if delay:
            await asyncio.sleep(delay)
        faults = self.faults.get((verb, plural))
        if faults:
            status = faults.pop(0)
            raise kmock.KubernetesError(status=status, reason="Injected", message=f"{status}")
        ns, name = request.namespace, request.name
        if request.action == kmock.action.WATCH:
            return self._watch(plural, ns, dict(request.params))
        if method == "GET" and name is None:
            return self._list(plural, ns, dict(request.params))
        if method == "GET":
            found = self.objects.get((plural, ns, str(name)))
            if found is None:
                raise kmock.KubernetesError(status=404, reason="NotFound", message=f"{name}")
            return found
        if method == "POST":
            body = request.data or {}
            meta = body.setdefault("metadata", {})
            meta.setdefault("namespace", ns)
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
            if (plural, ns, meta.get("name")) in self.objects:
                raise kmock.KubernetesError(status=409, reason="AlreadyExists", message="exists")
            return self.put(plural, body)
        current = self.objects.get((plural, ns, str(name)))
        if current is None:
            raise kmock.KubernetesError(status=404, reason="NotFound", message=f"{name}")
        if method == "DELETE":
            preconditions = (request.data or {}).get("preconditions") or {}
            for field_name in ("uid", "resourceVersion"):
                wanted = preconditions.get(field_name)
                if wanted and wanted != current["metadata"].get(field_name):
                    raise kmock.KubernetesError(
                        status=409,
                        reason="Conflict",
                        message=f"Precondition failed: {field_name} in precondition: {wanted}, "
                        f"{field_name} in object meta: {current['metadata'].get(field_name)}",
                    )
            self.deletes.append((plural, ns, str(name), request.data))
            self.remove(plural, ns, str(name))
            return {"kind": "Status", "status": "Success"}
        if method == "PATCH" and "json-patch" in str(request.headers.get("Content-Type")):
            return self._json_patch(plural, current, request.data)
        body = request.data or {}
        wanted = (body.get("metadata") or {}).get("resourceVersion")
        if wanted and wanted != current["metadata"]["resourceVersion"]:
            raise kmock.KubernetesError(
                status=409,
                reason="Conflict",
                message="the object has been modified; please apply your changes to the "
                "latest version and try again",
            )
        if method == "PUT":
            body.setdefault("metadata", {})["uid"] = current["metadata"]["uid"]
            return self.put(plural, body)
        if method == "PATCH":
            patch = copy.deepcopy(body)
            patch.get("metadata", {}).pop("resourceVersion", None)
            if "strategic-merge" in str(request.headers.get("Content-Type")):
                return self.put(plural, strategic_merge_patch(current, patch))
            return self.put(plural, merge_patch(current, patch))
        raise kmock.KubernetesError(status=405, reason="MethodNotAllowed", message=method)

    def _json_patch(self, plural: str, current: Obj, ops: Any) -> Obj:
        """RFC 6902 as kube-apiserver applies it: a failed ``test`` (or a path that is not
        there) is 422 and changes nothing; a pod's node affinity may change only while a
        scheduling gate holds it (the KEP-3838 rule), else 422 too."""
        try:
            patched = jsonpatch.apply(current, ops)
        except (jsonpatch.PatchTestFailed, KeyError, IndexError, ValueError, TypeError) as exc:
            raise kmock.KubernetesError(status=422, reason="Invalid", message=str(exc)) from exc
        if plural == "pods":
            old, new = current.get("spec") or {}, patched.get("spec") or {}
            if old.get("affinity") != new.get("affinity") and not old.get("schedulingGates"):
                raise kmock.KubernetesError(
                    status=422,
                    reason="Invalid",
                    message="spec: Forbidden: pod updates may not change fields other than ...",
                )
        return self.put(plural, patched)

    def _list(self, plural: str, ns: str | None, params: dict[str, str]) -> Obj:
        selector = params.get("labelSelector")
        fields = params.get("fieldSelector")
        items = [
            copy.deepcopy(obj)
            for (p, o_ns, _), obj in self.objects.items()
            if p == plural
            and (ns is None or o_ns == ns)
            and _matches(obj["metadata"].get("labels") or {}, selector)
            and _fields_match(obj, fields)
        ]
        return {"kind": "List", "metadata": {"resourceVersion": str(self.version)}, "items": items}

    def _watch(self, plural: str, ns: str | None, params: dict[str, str]) -> AsyncIterator[Obj]:
        since = int(params.get("resourceVersion") or 0)
        watch = _Watch(plural, ns, params.get("labelSelector"))
        gone = since < self.compacted_before
        backlog = [
            event
            for rv, p, event in self.history
            if rv > since and p == plural and self._visible(watch, event["object"]["metadata"])
        ]
        if not gone:
            self.watches.append(watch)
        bookmarks = self.bookmarks and params.get("allowWatchBookmarks") == "true"

        async def stream() -> AsyncIterator[Obj]:
            if gone:
                yield {
                    "type": "ERROR",
                    "object": {
                        "kind": "Status",
                        "code": 410,
                        "reason": "Expired",
                        "message": f"too old resource version: {since}",
                    },
                }
                return
            try:
                for event in backlog:
                    yield event
                if bookmarks:
                    yield {
                        "type": "BOOKMARK",
                        "object": {
                            "kind": "Bookmark",
                            "metadata": {"resourceVersion": str(self.version)},
                        },
                    }
                while (live := await watch.queue.get()) is not None:
                    yield live
            finally:
                if watch in self.watches:
                    self.watches.remove(watch)

        return stream()


def _spec_part(obj: Obj) -> Obj:
    """What a change of moves ``metadata.generation``."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}
