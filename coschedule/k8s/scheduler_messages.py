"""kube-scheduler's ``PodScheduled=False`` (reason ``Unschedulable``) message, parsed. Pure.

The message counts nodes per filter failure, the first failing filter of each node:

    0/4 nodes are available: 1 Insufficient cpu, 3 node(s) didn't match pod affinity
    rules. preemption: 0/4 nodes are available: 1 No preemption victims found for incoming
    pod, 3 Preemption is not helpful for scheduling.

The group's node hosts the placeholder, so it passes the pod-affinity filter (the last
filter plugin); when it fails, it fails for another reason, which the message counts. The
reason strings are the scheduler plugins' (``pkg/scheduler/framework/plugins``):
noderesources (``Insufficient <resource>``, ``Too many pods``), nodeunschedulable,
tainttoleration (1.36: ``node(s) had untolerated taint(s)``; earlier releases named the
taint, ``{key: value}``), nodeaffinity, volumebinding (1.36: ``node(s) didn't match
PersistentVolume's node affinity``; earlier: ``had volume node affinity conflict``),
volumezone, interpodaffinity. The message does not say which node failed for what: the
reconciler works that out itself (``stuck.diagnose``).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, replace


class Cause(enum.StrEnum):
    """Why nodes were rejected; the values label ``coschedule_relocations_total``."""

    RESOURCES = "insufficient-resources"
    PODS = "too-many-pods"
    TAINT = "untolerated-taint"
    UNSCHEDULABLE = "node-unschedulable"
    NODE_AFFINITY = "node-affinity"
    VOLUME = "volume-node-affinity"
    # The pin to the placeholder (pod affinity; or node name: ``SchedulerMessage.pinned``):
    # other nodes, not the group's.
    POD_AFFINITY = "pod-affinity"
    ANTI_AFFINITY = "pod-anti-affinity"
    OTHER = "other"


@dataclass(frozen=True, slots=True)
class Reason:
    count: int
    text: str  # as the scheduler wrote it
    cause: Cause
    detail: str = ""  # the resource ("cpu") or the taint ("key: value")


@dataclass(frozen=True, slots=True)
class SchedulerMessage:
    nodes: int | None  # the N of "0/N nodes are available"; None when not that shape
    reasons: tuple[Reason, ...]

    @property
    def blocking(self) -> tuple[Reason, ...]:
        """Reasons other than the pin to the placeholder: one of them is the group's node's."""
        return tuple(r for r in self.reasons if r.cause is not Cause.POD_AFFINITY)

    def pinned(self) -> SchedulerMessage:
        """The message of a pod pinned to one node by name (placement by node name): every
        other node fails the node-affinity filter on the pin, so ``nodes - 1`` of the
        node-affinity count are the pin to the placeholder (as the pod-affinity count is for
        a pod tied by pod affinity); what is left is the pinned node's own reason."""
        if self.nodes is None:
            return self
        others = self.nodes - 1
        reasons: list[Reason] = []
        for reason in self.reasons:
            if reason.cause is Cause.NODE_AFFINITY and others > 0:
                share = min(others, reason.count)
                others -= share
                reasons.append(Reason(share, reason.text, Cause.POD_AFFINITY, "pin"))
                if reason.count > share:
                    reasons.append(replace(reason, count=reason.count - share))
                continue
            reasons.append(reason)
        return SchedulerMessage(self.nodes, tuple(reasons))


_HEAD = re.compile(r"^\s*0/(\d+) nodes are available(?::\s*(.*))?$", re.DOTALL)
_ITEM = re.compile(r"^(\d+)\s+(.*)$", re.DOTALL)
_SPLIT = re.compile(r",\s+(?=\d+\s)")
_INSUFFICIENT = re.compile(r"^Insufficient (\S+)$")
_TAINT = re.compile(r"^node\(s\) had (?:untolerated )?taint[s(]*\)?\s*\{(.*)\}")

_FIXED: tuple[tuple[str, Cause], ...] = (
    ("Too many pods", Cause.PODS),
    ("node(s) were unschedulable", Cause.UNSCHEDULABLE),
    ("node(s) had untolerated taint", Cause.TAINT),
    ("node(s) had taints that the pod didn't tolerate", Cause.TAINT),
    ("node(s) didn't match pod affinity rules", Cause.POD_AFFINITY),
    ("node(s) didn't match pod affinity/anti-affinity", Cause.POD_AFFINITY),
    ("node(s) didn't match pod anti-affinity rules", Cause.ANTI_AFFINITY),
    ("node(s) didn't satisfy existing pods anti-affinity rules", Cause.ANTI_AFFINITY),
    ("node(s) didn't match Pod's node affinity", Cause.NODE_AFFINITY),
    ("node(s) didn't match scheduler-enforced node affinity", Cause.NODE_AFFINITY),
    # 1.36, a pod pinned by name (``matchFields metadata.name``): NodeAffinity's PreFilter
    # keeps only that node, and every other one is counted with this wording.
    ("node(s) didn't satisfy plugin(s) [NodeAffinity]", Cause.NODE_AFFINITY),
    ("node(s) had volume node affinity conflict", Cause.VOLUME),
    ("node(s) didn't match PersistentVolume's node affinity", Cause.VOLUME),
    ("node(s) had no available volume zone", Cause.VOLUME),
    ("node(s) didn't find available persistent volumes to bind", Cause.VOLUME),
    ("node(s) did not have enough free storage", Cause.VOLUME),
)


def _body(text: str) -> str:
    """The reason list: up to the sentence end (" preemption: ..." and DRA notes follow)."""
    end = text.find(". ")
    body = text if end < 0 else text[:end]
    return body.rstrip().removesuffix(".")


def classify(text: str) -> Reason:
    """One "N <reason>" item's reason (count 1 here; ``parse`` sets the real count)."""
    match = _INSUFFICIENT.match(text)
    if match:
        return Reason(1, text, Cause.RESOURCES, match.group(1))
    match = _TAINT.match(text)
    if match:
        return Reason(1, text, Cause.TAINT, match.group(1).strip())
    for prefix, cause in _FIXED:
        if text.startswith(prefix):
            return Reason(1, text, cause)
    return Reason(1, text, Cause.OTHER)


def parse(message: str) -> SchedulerMessage:
    """Parse; a message of another shape gives ``nodes=None`` and no reasons."""
    head = _HEAD.match(message or "")
    if head is None:
        return SchedulerMessage(None, ())
    body = _body(head.group(2) or "")
    reasons = []
    for item in _SPLIT.split(body) if body else ():
        match = _ITEM.match(item.strip())
        if match is None:
            continue
        reason = classify(match.group(2).strip())
        reasons.append(Reason(int(match.group(1)), reason.text, reason.cause, reason.detail))
    return SchedulerMessage(int(head.group(1)), tuple(reasons))
