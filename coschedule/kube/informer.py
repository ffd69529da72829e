"""List-then-watch caches of plain dicts (client-go's reflector, in a page of asyncio).

List, then watch from the list's resourceVersion with bookmarks; on 410 Gone relist and
turn the difference into events; on any other error back off with jitter and resume.
A cache tells how long it has not heard from the API server while its watch is down
(``silent_for``: no list, event, bookmark or accepted watch for that long): for ``/readyz``
and ``coschedule_cache_stale_seconds``; an established watch is fresh however quiet.
Handlers see every change once, in order, as ``(event_type, obj, old)`` (``old``: the
object as the cache held it before, None if new). Indexes (controller-runtime's
``IndexField``, kopf's ``@kopf.index``) are kept by the informer on every change, before
handlers run: ``Informer(indexers={"run": fn})`` then ``by_index("run", value)``.
A cache whose transform reads only metadata is ``metadata_only`` (client-go's metadata
informer): the API server sends each object's metadata alone (PartialObjectMetadata), far
less to read and decode than a whole pod; a server that does not convert sends the whole
object, which the transform reads the same. The same list and watch verbs: no new RBAC.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from coschedule.kube.client import (
    METADATA_ACCEPT,
    METADATA_LIST_ACCEPT,
    ApiError,
    KubeClient,
)
from coschedule.kube.reachability import describe, is_unreachable
from coschedule.wire.watch_events import EVERY_FIELD, EventShape

log = logging.getLogger("coschedule.informer")

Obj = dict[str, Any]
Handler = Callable[[str, Obj, Obj | None], None]
# An index function: the values an object is filed under (none: not in that index).
IndexFunc = Callable[[Obj], Iterable[str]]

WATCH_TIMEOUT_SECONDS = 290  # the server ends each watch; we resume from the last version
# A watch silent this long is dead (the server ends every one at WATCH_TIMEOUT_SECONDS): a
# connection whose peer vanished without a FIN or RST would otherwise be waited on forever.
WATCH_READ_TIMEOUT_SECONDS = WATCH_TIMEOUT_SECONDS + 60
BACKOFF_START = 0.5
BACKOFF_MAX = 30.0
# An API server that does not answer (restarting, upgraded) is tried again at least this
# often: once it is back, the caches resume within seconds, not after a long backoff. One
# connection attempt per cache, so cheap.
UNREACHABLE_BACKOFF_MAX = 4.0
# A cache that has not heard from the API server for this long while its watch is down is
# stale: said in /readyz (the reconciler turns not ready; the webhook stays ready).
STALE_AFTER_SECONDS = 10.0


def object_key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace")
    name = meta.get("name", "")
    return f"{namespace}/{name}" if namespace else str(name)


def as_listed(obj: Obj) -> Obj:
    """The default transform: the object as the client decoded it (already without its
    managedFields, which no decision reads and which cost a big cache the most memory)."""
    return obj


class Expired(Exception):
    """The watch's resourceVersion is too old (410 Gone): relist."""


class Informer:
    def __init__(
        self,
        client: KubeClient,
        path: str,
        *,
        name: str,
        label_selector: str | None = None,
        field_selector: str | None = None,
        transform: Callable[[Obj], Obj] = as_listed,
        on_relist: Callable[[], None] | None = None,
        page_size: int = 500,
        indexers: Mapping[str, IndexFunc] | None = None,
        metadata_only: bool = False,
        shape: EventShape = EVERY_FIELD,
    ) -> None:
        self.client = client
        # The fields decoded: a transform that reads only some can ask for those alone.
        self.shape = shape
        # Only for a transform that reads nothing but ``metadata``.
        self.metadata_only = metadata_only
        self.path = path
        self.name = name
        self.selectors: dict[str, str] = {}
        if label_selector:
            self.selectors["labelSelector"] = label_selector
        if field_selector:
            self.selectors["fieldSelector"] = field_selector
        self.transform = transform
        self.on_relist = on_relist
        self.page_size = page_size
        self.store: dict[str, Obj] = {}
        self.indexers: dict[str, IndexFunc] = dict(indexers or {})
        # index name -> value -> object keys; and object key -> its values, per index
        self._indexes: dict[str, dict[str, set[str]]] = {name: {} for name in self.indexers}
        self._filed: dict[str, dict[str, tuple[str, ...]]] = {name: {} for name in self.indexers}
        self.handlers: list[Handler] = []
        self.synced = asyncio.Event()
        self.resource_version = ""
        self.lists = 0  # how many full lists were made: relists must stay rare
        self.last_error: str | None = None  # of the last failed list or watch, for readyz
        self.watching = False  # a watch is established (the server accepted it)
        self.heard_at: float | None = None  # monotonic: last list, watch accepted, event

    def _heard(self) -> None:
        self.heard_at = time.monotonic()

    def _opened(self) -> None:
        self.watching = True
        self._heard()

    def silent_for(self, now: float | None = None) -> float:
        """Seconds since the cache last heard from the API server while its watch is down;
        0 while a watch is established (or before the first list: not synced is said
        elsewhere)."""
        if self.watching or self.heard_at is None:
            return 0.0
        return max(0.0, (time.monotonic() if now is None else now) - self.heard_at)

    def add_handler(self, handler: Handler) -> None:
        self.handlers.append(handler)

    # ---- reading the cache ---------------------------------------------------------------

    def get(self, key: str) -> Obj | None:
        return self.store.get(key)

    def __contains__(self, key: str) -> bool:
        return key in self.store

    def __len__(self) -> int:
        return len(self.store)

    def keys(self) -> Iterator[str]:
        return iter(self.store)

    def values(self) -> list[Obj]:
        return list(self.store.values())

    def view(self) -> Mapping[str, Obj]:
        """The cache as a read-only mapping, for code that reads many keys."""
        return MappingProxyType(self.store)

    def by_index(self, name: str, value: str) -> list[Obj]:
        """The objects filed under ``value`` in index ``name``, in key order."""
        keys = self._indexes[name].get(value, ())
        return [self.store[key] for key in sorted(keys)]

    def index_count(self, name: str, value: str) -> int:
        """How many objects are filed under ``value`` in index ``name``."""
        return len(self._indexes[name].get(value, ()))

    def index_values(self, name: str) -> set[str]:
        """Every value that index ``name`` holds objects under."""
        return set(self._indexes[name])

    # ---- keeping it --------------------------------------------------------------------

    def _file(self, key: str, obj: Obj | None) -> None:
        for name, fn in self.indexers.items():
            index = self._indexes[name]
            for value in self._filed[name].pop(key, ()):
                members = index.get(value)
                if members is not None:
                    members.discard(key)
                    if not members:
                        del index[value]
            if obj is None:
                continue
            values = tuple(dict.fromkeys(fn(obj)))
            if values:
                self._filed[name][key] = values
                for value in values:
                    index.setdefault(value, set()).add(key)

    def apply(self, event_type: str, obj: Obj) -> None:
        """One watch event (already transformed) into the cache, its indexes, the handlers."""
        key = object_key(obj)
        old = self.store.get(key)
        if event_type == "DELETED":
            self.store.pop(key, None)
            self._file(key, None)
        elif event_type in ("ADDED", "MODIFIED"):
            self.store[key] = obj
            self._file(key, obj)
        else:
            return
        self._emit(event_type, obj, old)

    def _emit(self, event_type: str, obj: Obj, old: Obj | None) -> None:
        for handler in self.handlers:
            try:
                handler(event_type, obj, old)
            except Exception:  # one bad handler must not stop the cache
                log.exception("informer handler failed", extra={"informer": self.name})

    async def _list(self) -> None:
        items: dict[str, Obj] = {}
        params: dict[str, Any] = {**self.selectors, "limit": self.page_size}
        while True:
            page = await self.client.list(
                self.path,
                params,
                accept=METADATA_LIST_ACCEPT if self.metadata_only else None,
                shape=self.shape,
            )
            for item in page.get("items") or ():
                if isinstance(item, dict):
                    obj = self.transform(item)
                    items[object_key(obj)] = obj
            meta = page.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                self.resource_version = str(meta.get("resourceVersion", ""))
                break
            params = {**self.selectors, "limit": self.page_size, "continue": token}
        old = self.store
        self.store = items
        self._indexes = {name: {} for name in self.indexers}
        self._filed = {name: {} for name in self.indexers}
        for key, obj in items.items():
            self._file(key, obj)
        self.lists += 1
        self._heard()
        for key, obj in old.items():
            if key not in items:
                self._emit("DELETED", obj, obj)
        for key, obj in items.items():
            previous = old.get(key)
            if previous is None:
                self._emit("ADDED", obj, None)
            elif previous.get("metadata", {}).get("resourceVersion") != obj.get("metadata", {}).get(
                "resourceVersion"
            ):
                self._emit("MODIFIED", obj, previous)
        self.synced.set()

    async def _watch(self) -> None:
        params = {
            **self.selectors,
            "resourceVersion": self.resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": WATCH_TIMEOUT_SECONDS,
        }
        accept = METADATA_ACCEPT if self.metadata_only else None
        async for event in self.client.watch(
            self.path,
            params,
            opened=self._opened,
            accept=accept,
            read_timeout=WATCH_READ_TIMEOUT_SECONDS,
            shape=self.shape,
        ):
            self._heard()
            event_type = event.get("type")
            obj = event.get("object")
            if not isinstance(obj, dict):
                continue
            if event_type == "ERROR":
                if obj.get("code") == 410:
                    raise Expired(str(obj.get("message", "")))
                raise ApiError(
                    int(obj.get("code") or 500),
                    str(obj.get("reason", "")),
                    str(obj.get("message", "")),
                )
            version = (obj.get("metadata") or {}).get("resourceVersion")
            if version:
                self.resource_version = str(version)
            if event_type == "BOOKMARK":
                continue
            self.apply(str(event_type), self.transform(obj))

    async def run(self) -> None:
        """Forever: list, watch, resume; relist only when the server says 410."""
        backoff = BACKOFF_START
        need_list = True
        loop = asyncio.get_running_loop()
        while True:
            try:
                if need_list:
                    await self._list()
                    need_list = False
                    self.last_error = None
                started = loop.time()
                try:
                    await self._watch()
                finally:
                    self.watching = False
                self._heard()  # the server ended the watch: it answered
                if loop.time() - started < 1.0:
                    # A watch the server ends at once, again and again, must not spin.
                    await asyncio.sleep(_jitter(backoff))
                    backoff = min(backoff * 2, BACKOFF_MAX)
                else:
                    backoff = BACKOFF_START
            except asyncio.CancelledError:
                raise
            except Expired as exc:
                log.info("watch expired, relisting", extra={"informer": self.name, "why": str(exc)})
                need_list = True
                if self.on_relist is not None:
                    self.on_relist()
            except ApiError as exc:
                if exc.status == 410:
                    need_list = True
                    if self.on_relist is not None:
                        self.on_relist()
                    continue
                self.last_error = str(exc)
                log.warning("watch failed", extra={"informer": self.name, "error": str(exc)})
                await asyncio.sleep(_jitter(backoff))
                backoff = min(backoff * 2, BACKOFF_MAX)
            except Exception as exc:
                self.last_error = describe(exc)
                unreachable = is_unreachable(exc)
                if not unreachable:  # the client's reachability says that, once
                    log.warning("watch failed", extra={"informer": self.name, "error": repr(exc)})
                await asyncio.sleep(_jitter(backoff))
                backoff = min(backoff * 2, UNREACHABLE_BACKOFF_MAX if unreachable else BACKOFF_MAX)


def _jitter(seconds: float) -> float:
    return seconds * (0.5 + random.random())


def stale_detail(
    informers: Sequence[Informer],
    client: KubeClient,
    stale_after: float | None = None,
    now: float | None = None,
) -> str | None:
    """Which synced caches have not heard from the API server for ``stale_after`` seconds
    (default ``STALE_AFTER_SECONDS``) while their watch is down, for how long, and why; None
    when all are fresh."""
    stale_after = STALE_AFTER_SECONDS if stale_after is None else stale_after
    stale = [
        (informer.name, silent)
        for informer in informers
        if informer.synced.is_set() and (silent := informer.silent_for(now)) >= stale_after
    ]
    if not stale:
        return None
    caches = ", ".join(f"{name} {silent:.0f} s" for name, silent in stale)
    why = client.reachability.waiting_detail() or next(
        (f"{i.name}: {i.last_error}" for i in informers if i.last_error and not i.watching), None
    )
    detail = f"caches stale (no word from the API server, watch down): {caches}"
    return f"{detail}; {why}" if why else detail


def caches_readiness(
    informers: Sequence[Informer], client: KubeClient, stale_after: float | None = None
) -> tuple[bool, str | None]:
    """Ready when every cache has synced and none is stale (``stale_detail``); else which,
    and why (for readyz)."""
    waiting = [informer for informer in informers if not informer.synced.is_set()]
    if not waiting:
        stale = stale_detail(informers, client, stale_after)
        return stale is None, stale
    detail = f"caches not synced: {', '.join(informer.name for informer in waiting)}"
    why = client.reachability.waiting_detail() or next(
        (f"{i.name}: {i.last_error}" for i in waiting if i.last_error), None
    )
    return False, f"{detail}; {why}" if why else detail
