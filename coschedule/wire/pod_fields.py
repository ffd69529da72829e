"""Typed, validated reads of a raw pod dict: only what the decisions use, nothing copied.

kube-apiserver only sends pods it has decoded, so a shape error here means the request
did not come from it; ``MalformedPod`` names the field so the answer is a clear HTTP 400.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from itertools import compress, count, repeat
from operator import is_not
from typing import Any, overload

_EMPTY: Mapping[str, Any] = {}
_PVC = "persistentVolumeClaim"


class MalformedPod(ValueError):
    """A field the decision reads has the wrong JSON type."""


# metadata, spec and string_map run a few times per admission: an object is returned
# straight away, and only an absent, null or malformed one takes sub_object's way.


def metadata(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    value = pod.get("metadata")
    return value if isinstance(value, dict) else sub_object(pod, "metadata", "pod", _EMPTY)


def spec(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    value = pod.get("spec")
    return value if isinstance(value, dict) else sub_object(pod, "spec", "pod", _EMPTY)


def string_map(meta: Mapping[str, Any], key: str) -> Mapping[str, str]:
    """``labels`` or ``annotations``: an object of strings (absent or null means empty)."""
    value = meta.get(key)
    if not isinstance(value, dict):
        value = sub_object(meta, key, "pod.metadata", _EMPTY)
    try:
        "".join(value.values())  # checks every value is a string, in C: this runs per admission
    except TypeError:
        for k, v in value.items():
            if not isinstance(v, str):
                raise MalformedPod(f"pod.metadata.{key}[{k!r}] must be a string") from None
    return value


def claim_volumes(pod_spec: Mapping[str, Any]) -> list[tuple[int, str, str]]:
    """(index in spec.volumes, volume name, claimName) of every PVC volume."""
    volumes = sub_list(pod_spec, "volumes", "pod.spec")
    if not volumes:
        return []
    try:
        # Every volume's claim source in C (a Tekton pod has a dozen volumes, one a claim);
        # ``dict.get`` refuses a volume that is not an object: the loop below names it.
        sources = list(map(dict.get, volumes, repeat(_PVC, len(volumes))))
    except TypeError:
        return _claim_volumes(volumes, range(len(volumes)))
    if sources.count(None) == len(sources):
        return []
    return _claim_volumes(volumes, compress(count(), map(is_not, sources, repeat(None))))


def _claim_volumes(volumes: list[Any], indexes: Iterable[int]) -> list[tuple[int, str, str]]:
    """The checked claims of the volumes at ``indexes`` (in order: the first bad one is named)."""
    found = []
    for index in indexes:
        volume = volumes[index]
        if not isinstance(volume, dict):
            raise MalformedPod(f"pod.spec.volumes[{index}] must be an object")
        source = volume.get(_PVC)
        if source is None:
            continue
        if not isinstance(source, dict):
            raise MalformedPod(f"pod.spec.volumes[{index}].persistentVolumeClaim must be an object")
        claim = source.get("claimName")
        if not isinstance(claim, str) or not claim:
            raise MalformedPod(
                f"pod.spec.volumes[{index}].persistentVolumeClaim.claimName must be a "
                "non-empty string"
            )
        name = volume.get("name")
        found.append((index, name if isinstance(name, str) else "", claim))
    return found


@overload
def sub_object(parent: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any] | None: ...


@overload
def sub_object(
    parent: Mapping[str, Any], key: str, where: str, empty: Mapping[str, Any]
) -> Mapping[str, Any]: ...


def sub_object(
    parent: Mapping[str, Any], key: str, where: str, empty: Mapping[str, Any] | None = None
) -> Mapping[str, Any] | None:
    """An optional nested object: ``empty`` (None unless given) when absent or null."""
    value = parent.get(key)
    if value is None:
        return empty
    if not isinstance(value, dict):
        raise MalformedPod(f"{where}.{key} must be an object, not {type(value).__name__}")
    return value


def sub_list(parent: Mapping[str, Any], key: str, where: str) -> list[Any] | None:
    """An optional nested array: None when absent or null."""
    value = parent.get(key)
    if value is None:
        return None
    if not isinstance(value, list):
        raise MalformedPod(f"{where}.{key} must be an array, not {type(value).__name__}")
    return value
