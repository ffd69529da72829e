"""Watch events and list pages decoded without their objects' ``managedFields``.

Every cache drops ``metadata.managedFields`` (no decision reads it), and it is the largest
part of a pod's event: on a Tekton pod about half of a whole pod and most of its metadata,
which is all the webhook's pod cache asks for. Parsing it whole and freeing it again was
the biggest single cost of reading a watch. msgspec scans past it instead, building no
Python object for it (``python -m bench.watch_decode``; docs/benchmarks.md). The client
decodes every list page and watch event this way, so no cache has to drop it again.

The result is what ``orjson.loads`` gives with ``managedFields`` popped from the object's
metadata. Anything the event's declared shape does not cover (an object with a top-level
key other than those of a spec/status kind or of a Status, a metadata field newer than
this list, a field of the wrong type) is parsed whole instead, so no key is ever dropped
unseen; malformed JSON raises ``orjson.JSONDecodeError`` as the whole parse does.

A cache that reads only some fields of its objects can ask for those alone
(``POD_CACHE``: the reconciler's pod caches): of a Tekton pod, whose steps' scripts, args,
env and mounts and whose container statuses are most of it, only a few hundred bytes are
built. There a field the shape does not declare is dropped, which is its purpose; one of a
declared field's wrong type still sends the event to the whole parse.
"""

from __future__ import annotations

from typing import Any, TypedDict

import msgspec
import orjson
from msgspec import UNSET, Raw, Struct, UnsetType


class _Metadata(Struct, forbid_unknown_fields=True):
    """Every ObjectMeta field (PartialObjectMetadata's too); ``managedFields`` left raw."""

    name: Any = UNSET
    generateName: Any = UNSET
    namespace: Any = UNSET
    selfLink: Any = UNSET
    uid: Any = UNSET
    resourceVersion: Any = UNSET
    generation: Any = UNSET
    creationTimestamp: Any = UNSET
    deletionTimestamp: Any = UNSET
    deletionGracePeriodSeconds: Any = UNSET
    labels: Any = UNSET
    annotations: Any = UNSET
    ownerReferences: Any = UNSET
    finalizers: Any = UNSET
    managedFields: Raw | UnsetType = UNSET  # scanned, never built; not kept


class _Object(Struct, forbid_unknown_fields=True):
    """A spec/status kind (pods, nodes, StatefulSets, claims, runs...), or the Status an
    ERROR event carries."""

    apiVersion: Any = UNSET
    kind: Any = UNSET
    metadata: _Metadata | UnsetType | None = UNSET
    spec: Any = UNSET
    status: Any = UNSET
    code: Any = UNSET
    reason: Any = UNSET
    message: Any = UNSET
    details: Any = UNSET


class _PodContainer(TypedDict, total=False):
    resources: Any  # its requests (stuck detection: does the run fit its node?)
    restartPolicy: Any  # an init container's "Always": a sidecar, counted with the app


class _ContainerStatus(TypedDict, total=False):
    state: Any  # when it ended (an idle run's last activity)


# TypedDicts: msgspec builds each as a plain dict of the keys the object has, the rest
# skipped in C (a Tekton pod's steps: their images, scripts, args, env and mounts).
class _PodSpec(TypedDict, total=False):
    nodeName: Any
    nodeSelector: Any
    tolerations: Any
    schedulerName: Any
    schedulingGates: Any
    affinity: Any
    topologySpreadConstraints: Any
    containers: list[_PodContainer] | None
    initContainers: list[_PodContainer] | None
    overhead: Any


class _PodStatus(TypedDict, total=False):
    phase: Any
    conditions: Any
    containerStatuses: list[_ContainerStatus] | None


class _PodReads(Struct):
    """A pod as the reconciler's pod caches keep it (``POD_CACHE``), or an ERROR event's
    Status; other top-level keys skipped."""

    apiVersion: Any = UNSET
    kind: Any = UNSET
    metadata: _Metadata | UnsetType | None = UNSET
    spec: _PodSpec | UnsetType | None = UNSET
    status: _PodStatus | UnsetType | None = UNSET
    code: Any = UNSET
    reason: Any = UNSET
    message: Any = UNSET
    details: Any = UNSET


class EventShape:
    """How a cache's watch events and list pages are decoded: the object's declared shape.
    Anything that does not fit it (a field of another type, and for ``EVERY_FIELD`` a key
    it does not list) is parsed whole instead, ``managedFields`` popped."""

    def __init__(self, obj: type[Struct]) -> None:
        self._keys = obj.__struct_fields__
        optional = obj | UnsetType | None
        event = msgspec.defstruct(
            "Event",
            [("type", Any, UNSET), ("object", optional, UNSET)],
            forbid_unknown_fields=True,
        )
        page = msgspec.defstruct(
            "List",
            [
                ("apiVersion", Any, UNSET),
                ("kind", Any, UNSET),
                ("metadata", Any, UNSET),  # ListMeta: resourceVersion, continue
                ("items", list[obj] | UnsetType | None, UNSET),  # type: ignore[valid-type]
            ],
            forbid_unknown_fields=True,
        )
        # Typed Any: their structs are made here, so their fields are unknown to mypy.
        self._event: msgspec.json.Decoder[Any] = msgspec.json.Decoder(event)
        self._page: msgspec.json.Decoder[Any] = msgspec.json.Decoder(page)

    def event(self, line: bytes) -> Any:
        """One line of a watch stream: the event as plain JSON values."""
        try:
            event = self._event.decode(line)
        except msgspec.ValidationError:  # a shape not declared: parsed whole
            return _whole(line)
        except msgspec.DecodeError:  # not JSON: the whole parse's error
            return orjson.loads(line)
        found: dict[str, Any] = {}
        if event.type is not UNSET:
            found["type"] = event.type
        obj = event.object
        if obj is None:
            found["object"] = None
        elif obj is not UNSET:
            found["object"] = self._plain(obj)
        return found

    def page(self, body: bytes) -> Any:
        """A list's page (``items`` of the declared kind)."""
        try:
            page = self._page.decode(body)
        except msgspec.ValidationError:
            return _whole_list(body)
        except msgspec.DecodeError:
            return orjson.loads(body)
        found: dict[str, Any] = {}
        for key in ("apiVersion", "kind", "metadata"):
            value = getattr(page, key)
            if value is not UNSET:
                found[key] = value
        if page.items is not UNSET:
            found["items"] = None if page.items is None else [self._plain(i) for i in page.items]
        return found

    def _plain(self, obj: Struct) -> dict[str, Any]:
        plain: dict[str, Any] = {}
        for key in self._keys:
            value = getattr(obj, key)
            if value is UNSET:
                continue
            if key == "metadata" and value is not None:
                value = {k: v for k in _META_KEYS if (v := getattr(value, k)) is not UNSET}
            plain[key] = value
        return plain


_META_KEYS = tuple(name for name in _Metadata.__struct_fields__ if name != "managedFields")

EVERY_FIELD = EventShape(_Object)
"""Every field but ``managedFields``: what ``orjson.loads`` gives with it popped."""

POD_CACHE = EventShape(_PodReads)
"""Of a pod, only what the reconciler's pod caches read (``reconcile.shapes``' and
``reconcile.stuck``'s transforms; tests/wire/test_watch_events.py records every read they
make and fails on one not declared here): metadata, the spec's scheduling inputs, each
container's resources, the status' phase, conditions and container states."""

# What ``POD_CACHE`` builds of a pod, but its metadata (all of it): declared once, above.
POD_CACHE_READS: dict[str, tuple[str, ...]] = {
    "spec": tuple(_PodSpec.__annotations__),
    "spec.containers[]": tuple(_PodContainer.__annotations__),  # initContainers[] too
    "status": tuple(_PodStatus.__annotations__),
    "status.containerStatuses[]": tuple(_ContainerStatus.__annotations__),
}

decode_event = EVERY_FIELD.event
decode_list = EVERY_FIELD.page


def _whole(line: bytes) -> Any:
    event = orjson.loads(line)
    _drop_managed_fields(event.get("object") if isinstance(event, dict) else None)
    return event


def _whole_list(body: bytes) -> Any:
    page = orjson.loads(body)
    items = page.get("items") if isinstance(page, dict) else None
    for item in items if isinstance(items, list) else ():
        _drop_managed_fields(item)
    return page


def _drop_managed_fields(obj: Any) -> None:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
