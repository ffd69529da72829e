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
"""

from __future__ import annotations

from typing import Any

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


class _Event(Struct, forbid_unknown_fields=True):
    type: Any = UNSET
    object: _Object | UnsetType | None = UNSET


class _List(Struct, forbid_unknown_fields=True):
    apiVersion: Any = UNSET
    kind: Any = UNSET
    metadata: Any = UNSET  # ListMeta: resourceVersion, continue
    items: list[_Object] | UnsetType | None = UNSET


_DECODER = msgspec.json.Decoder(_Event)
_LIST_DECODER = msgspec.json.Decoder(_List)
_META_KEYS = tuple(name for name in _Metadata.__struct_fields__ if name != "managedFields")
_OBJECT_KEYS = _Object.__struct_fields__


def decode_event(line: bytes) -> Any:
    """One line of a watch stream: the event as plain JSON values, without managedFields."""
    try:
        event = _DECODER.decode(line)
    except msgspec.ValidationError:  # a shape not declared above: parsed whole
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
        found["object"] = _plain(obj)
    return found


def decode_list(body: bytes) -> Any:
    """A list's page (``items`` of a spec/status kind) without the items' managedFields."""
    try:
        page = _LIST_DECODER.decode(body)
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
        found["items"] = None if page.items is None else [_plain(item) for item in page.items]
    return found


def _plain(obj: _Object) -> dict[str, Any]:
    plain: dict[str, Any] = {}
    for key in _OBJECT_KEYS:
        value = getattr(obj, key)
        if value is UNSET:
            continue
        if key == "metadata" and value is not None:
            value = {k: v for k in _META_KEYS if (v := getattr(value, k)) is not UNSET}
        plain[key] = value
    return plain


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
