"""The hot path's AdmissionReview decoder: only the fields the decision reads are built.

msgspec decodes the body into Structs and TypedDicts that declare just those fields;
everything else (the containers, their env and scripts, the sources of the volumes, status,
managedFields) is scanned past without building a single Python object. On a Tekton pod
that is ~5x cheaper than parsing the whole review.

The pod handed to the decision is a plain dict holding exactly the keys of ``POD_READS``
that the request has (each volume: only its name and claim), with the values the full
parse would give. Anything the fast path is
not sure of goes to ``review.decode_review`` (orjson, the whole body), so a bad request
gets the same HTTP 400 message, and a pod whose ``metadata`` or ``spec`` has none of the
read keys (where "empty or not" would be unknowable) is decided on the whole pod.

Known differences from the full parse, both for bodies kube-apiserver never sends (it
re-encodes what it decoded): a number out of the double range in a field the decision does
not read is not refused, and an integer beyond 64 bits in a read field stays an int.
"""

from __future__ import annotations

from typing import Any, Final, Literal, TypedDict

import msgspec
from msgspec import Struct

from coschedule.wire.review import Review, decode_review

# The pod fields the decision (coschedule.mutate) reads, and the ones logged; a test records
# every read the decision makes over the fixtures and fails if one is missing here.
POD_READS: Final[dict[str, tuple[str, ...]]] = {
    "metadata": ("name", "generateName", "labels", "annotations", "ownerReferences"),
    "spec": (
        "volumes",
        "affinity",
        "nodeSelector",
        "tolerations",
        "schedulerName",
        "schedulingGates",
        "nodeName",
    ),
    "spec.volumes[]": ("name", "persistentVolumeClaim"),
}


# TypedDicts, not Structs: msgspec builds each as a plain dict holding only the keys the
# request has (the others are skipped in C), which is the view the decision reads.
class _Metadata(TypedDict, total=False):
    name: Any
    generateName: Any
    labels: Any
    annotations: Any
    ownerReferences: Any  # placement by node name: does the pod's owner recreate it?


class _Volume(TypedDict, total=False):
    # Of a volume the decision reads only these; its source (emptyDir, secret, a projected
    # token...) is skipped. Not an object: the full parse answers (a MalformedPod 400).
    name: Any
    persistentVolumeClaim: Any


class _Spec(TypedDict, total=False):
    volumes: list[_Volume] | None
    affinity: Any
    nodeSelector: Any
    tolerations: Any
    schedulerName: Any
    schedulingGates: Any
    nodeName: Any  # a pod created on its node is left alone


class _Pod(Struct):
    metadata: _Metadata | None = None
    spec: _Spec | None = None


# The review's own fields are typed, so msgspec checks them in C: a field of another type
# or a required one absent fails the decode, and the full parse answers (as it would have).
class _Kind(Struct):
    version: str
    kind: str
    group: str | None = None


class _Request(Struct):
    uid: str
    kind: _Kind
    operation: str
    namespace: str | None = None
    dryRun: bool | None = None
    object: _Pod | None = None


class _Review(Struct):
    apiVersion: Literal["admission.k8s.io/v1"]
    kind: Literal["AdmissionReview"]
    request: _Request


_decoder: Final = msgspec.json.Decoder(_Review)


def decode(body: bytes) -> Review:
    """As ``review.decode_review``: the same Review or the same ``BadReview``; the Pod
    object holds only the keys of ``POD_READS``."""
    review = _fast(body)
    return review if review is not None else decode_review(body)


def _fast(body: bytes) -> Review | None:
    """The Review of a well-formed request, or None: let the full parse decide."""
    if not body.isascii():
        try:
            body.decode()  # orjson refuses invalid UTF-8 anywhere; msgspec only where read
        except UnicodeDecodeError:
            return None
    try:
        doc = _decoder.decode(body)
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        return None
    request = doc.request
    uid = request.uid
    if not uid:
        return None
    kind = request.kind
    operation = request.operation
    namespace = request.namespace
    group = kind.group or ""
    if not (operation == "CREATE" and kind.kind == "Pod" and group == "" and kind.version == "v1"):
        # Not a Pod CREATE: the object is not read (as review.pod_create).
        return Review(
            uid,
            group,
            kind.version,
            kind.kind,
            operation,
            namespace or "",
            bool(request.dryRun),
            None,
            False,
        )
    pod = request.object
    if pod is None:
        return None
    obj: dict[str, Any] = {}
    # A metadata or spec with none of the read keys might still be non-empty, which the
    # decision tells apart: let the full parse decide those.
    meta = pod.metadata
    if meta is not None:
        if not meta:
            return None
        obj["metadata"] = meta
    spec = pod.spec
    if spec is not None:
        if not spec:
            return None
        obj["spec"] = spec
    dry_run = bool(request.dryRun)
    return Review(uid, group, "v1", "Pod", "CREATE", namespace or "", dry_run, obj, True)
