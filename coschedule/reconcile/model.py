"""The reconciler's plain data: what it observed of one group, and the actions it decides.

Frozen dataclasses only; built by the controllers from their caches, read by the planners
(``plan.plan``, ``stuck_runs.plan_stuck``, ``run_plan``), carried out by the one
``Executor``. The run concurrency actions (start, cancel, waiting mark) are the concurrency
planner's own (``concurrency.plan``), named here so that ``Action`` is every action.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from coschedule.concurrency.plan import CancelRun as CancelRun
from coschedule.concurrency.plan import MarkWaiting as MarkWaiting
from coschedule.concurrency.plan import StartRun as StartRun
from coschedule.concurrency.runs import Run
from coschedule.k8s.node_constraints import NodeConstraints
from coschedule.k8s.nodes import Node
from coschedule.k8s.volumes import VolumeTopology
from coschedule.marks import ClaimTemplate, Marks

Obj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class OwnerRef:
    """An object reference as in ``metadata.ownerReferences``."""

    api_version: str
    kind: str
    name: str
    uid: str

    def as_owner_reference(self) -> dict[str, Any]:
        # blockOwnerDeletion false: no finalizer RBAC on the engines' kinds is needed.
        return {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "name": self.name,
            "uid": self.uid,
            "controller": False,
            "blockOwnerDeletion": False,
        }


@dataclass(frozen=True, slots=True)
class MarkedPod:
    """A pod the webhook marked, as far as the reconciler reads it: its ``marks`` (see
    ``marks.parse``) and what the placeholder follows."""

    namespace: str
    name: str
    uid: str
    created: str  # creationTimestamp (RFC 3339 sorts as text)
    marks: Marks
    node_selector: Mapping[str, str]
    tolerations: tuple[Mapping[str, Any], ...]
    owner: OwnerRef | None  # the pod's controller ownerReference
    live: bool  # phase not Succeeded/Failed and not being deleted
    finished_at: float | None = None  # when its last container ended, for idle grace
    scheduler_name: str = ""  # spec.schedulerName; the placeholder follows it
    # Placement by node name (``node_pins``): where it is bound, which version was seen (a
    # delete is conditional on it), the node our pin names, whether its controller
    # recreates it when deleted before it starts, and, while our scheduling gate holds it,
    # the pod as ``node_pin.release_ops`` reads it (annotations, gates, affinity).
    node_name: str = ""  # spec.nodeName ("" while unscheduled)
    resource_version: str = ""
    deleting: bool = False
    pinned_node: str | None = None
    recreated: bool = False
    gated: Mapping[str, Any] | None = None  # None: not held by our gate
    # Other placeholders its required pod affinity pins it to: Tekton's own Affinity
    # Assistant's, when that is on too (``assistant_conflict``).
    other_assistants: tuple[str, ...] = ()
    # Its required node-affinity terms without our pin, with an ``Exists`` of each
    # DoNotSchedule spread constraint's key (``k8s.node_constraints``); None: no requirement.
    node_terms: tuple[Mapping[str, Any], ...] | None = None

    def constraints(self) -> NodeConstraints:
        """Where this pod may go, as its placeholder must follow."""
        return NodeConstraints(self.node_selector, self.node_terms, self.tolerations)


@dataclass(frozen=True, slots=True)
class PlaceholderPod:
    namespace: str
    name: str
    node_name: str  # "" while unscheduled
    tolerations: tuple[Mapping[str, Any], ...]
    deleting: bool
    uid: str = ""
    # deletionTimestamp: when its graceful delete should have ended (None: not deleted)
    deletion_due: float | None = None


@dataclass(frozen=True, slots=True)
class ObservedSet:
    """A managed StatefulSet as cached (the raw dict stays available for patches)."""

    namespace: str
    name: str
    uid: str
    resource_version: str
    replicas: int | None
    update_strategy: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    owner_references: tuple[Mapping[str, Any], ...]
    deleting: bool
    templates: Mapping[str, str] = field(default_factory=dict)  # template -> original claim


class OwnerStatus(enum.Enum):
    RUNNING = "running"
    DONE = "done"  # completed, failed, or deleted
    UNKNOWN = "unknown"  # not checked yet, or the last check failed
    # Finding the root failed (429, 5xx, network): nothing is known; ``detail`` says why.
    LOOKUP_FAILED = "lookup-failed"


@dataclass(frozen=True, slots=True)
class OwnerState:
    """The run's root owner (None: no resolvable owner) and what its last check said."""

    root: OwnerRef | None
    status: OwnerStatus = OwnerStatus.UNKNOWN
    checked_at: float | None = None
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Observed:
    """Everything ``plan`` needs for one placeholder (namespace/name), and nothing else."""

    namespace: str
    name: str
    pods: tuple[MarkedPod, ...] = ()
    statefulset: ObservedSet | None = None
    placeholder_pods: tuple[PlaceholderPod, ...] = ()
    nodes: Mapping[str, Node] = field(default_factory=dict)
    owner: OwnerState | None = None  # None: not resolved (yet) or not applicable
    idle_since: float | None = None  # first time seen with no live pod (controller memory)
    claim_templates: tuple[ClaimTemplate, ...] = ()
    claims_to_delete: tuple[str, ...] = ()  # claims the StatefulSet created (volume issue)
    # The placeholder's bound claims and where their volumes can be used: (claim, volume).
    # Read only while one of its pods is on a node it would otherwise leave (rare).
    placeholder_volumes: tuple[tuple[str, VolumeTopology], ...] = ()
    # A quiet workspaces group's claims found deleted or being deleted: no pod can mount
    # them again, so their placeholder goes at once. Read only while such a group is quiet.
    claims_gone: tuple[str, ...] = ()
    # A run's claims its StatefulSet records that no pod of it in the cache mounts (the pod
    # that did was deleted: moved off a node, remade by its engine, garbage-collected) and
    # that still exist: the placeholder keeps them, or a placeholder remade meanwhile would
    # not hold the run's data where it is. Read only while a claim is so missing (rare).
    claims_kept: tuple[str, ...] = ()
    # Every node's kubelet silent (Ready Unknown): the node lifecycle controller's full
    # disruption, the control plane's problem, not the nodes'. Read only while a
    # placeholder pod is on a silent node.
    all_nodes_silent: bool = False
    # When each silent node's kubelet last renewed its Lease (``kube-node-lease``; seconds
    # since the epoch): a kubelet that renews is alive, its Ready status only behind (after a
    # control-plane outage, under load, it can take longer than ``NODE_DOWN_SECONDS`` to
    # post). Read only while a placeholder pod is on a silent node; absent: not read.
    node_renewed: Mapping[str, float] = field(default_factory=dict)
    # A PipelineRun's first pod as the run says it (``run_seed``), while the run holds a
    # placeholder before any pod of it exists; None: no seed.
    seed: MarkedPod | None = None
    seed_until: float = 0.0  # when the seed stops holding the placeholder
    # When the run began (its creation, or coschedule's start of it: ``run_seed.run_begun``),
    # while the run is cached and not done: a run that made no pod within the idle grace of
    # it gives back the placeholder made from its seed.
    run_begun: float | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


# ---- actions -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RecordEvent:
    """An Event about one group: on its placeholder StatefulSet, or on ``involved`` (the
    stuck pod, the run that owns the group)."""

    namespace: str
    statefulset: str  # the group's placeholder (its log line names it)
    reason: str
    message: str
    type: str = "Normal"
    involved: OwnerRef | None = None  # None: the placeholder StatefulSet itself


@dataclass(frozen=True, slots=True)
class ReportAssistantConflict:
    """A pod of the group is pinned to Tekton's own Affinity Assistant as well as to our
    placeholder: ``event`` (a Warning on the pod, or on its run) once per ``subject``; a pod
    subject is counted in ``coschedule_tekton_assistant_conflicts_total`` and logged."""

    namespace: str
    name: str  # the group's placeholder
    subject: str  # "pod <uid>" or "run <kind>/<name>": what is told, once
    pod: str  # the pod found pinned twice
    assistants: tuple[str, ...]  # the other placeholders it is pinned to
    event: RecordEvent


@dataclass(frozen=True, slots=True)
class CreateStatefulSet:
    """Create the placeholder; ``event`` is recorded once it is created (not when an
    existing one of ours only had its labels put back)."""

    namespace: str
    name: str
    body: Obj
    event: RecordEvent


@dataclass(frozen=True, slots=True)
class PatchStatefulSet:
    """A strategic merge patch of the fields we own (the pod template replaced whole),
    guarded by the observed resourceVersion."""

    namespace: str
    name: str
    patch: Obj
    why: str


@dataclass(frozen=True, slots=True)
class DeletePlaceholderPod:
    """Delete the placeholder pod so that its StatefulSet makes it again elsewhere; ``event``
    is recorded once deleted (not when this very version of the pod was deleted already).

    ``force`` (its node's kubelet stopped reporting, or never finished the graceful delete):
    grace period 0, conditional on the pod's ``uid`` (never the pod made again under the
    same name). A placeholder runs nothing, so nothing is cut short."""

    namespace: str
    name: str
    statefulset: str
    node: str
    reason: str  # "cordoned" | "tainted" | "node-down" (the evictions metric label)
    message: str
    event: RecordEvent
    force: bool = False
    uid: str = ""


@dataclass(frozen=True, slots=True)
class HoldPinnedPlaceholder:
    """A placeholder pod stays on a node it would otherwise leave: its volumes can be used
    there only (moving it would leave it Pending and the run's data behind). Explained by an
    Event and the ``coschedule_pinned_placeholders`` gauge instead."""

    namespace: str
    name: str
    statefulset: str
    node: str
    reason: str  # "cordoned" | "tainted" | "node-down"
    message: str
    event: RecordEvent


@dataclass(frozen=True, slots=True)
class DeleteStatefulSet:
    namespace: str
    name: str
    why: str


@dataclass(frozen=True, slots=True)
class ReleaseClaim:
    """Let a claim the placeholder's volumeClaimTemplates made, deleted at teardown, go: drop
    its ``kubernetes.io/pvc-protection`` finalizer, which the run's finished pods (kept by the
    engine until the run is deleted) would otherwise hold, and with it the storage. Planned
    only once the run is done, its placeholder pod gone and none of its pods live."""

    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class DeleteClaim:
    """Delete a claim the placeholder's volumeClaimTemplates created (volume issue's hook)."""

    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class RelocatePlaceholder:
    """Move the placeholder off ``from_node``: the conditional strategic merge ``patch``
    (relocations annotation, steered template), then delete its pods ``pods`` there (once
    per pod version) so that the StatefulSet controller recreates them from the new
    template."""

    namespace: str
    name: str
    patch: Obj
    pods: tuple[str, ...]
    reason: str  # the cause on the old node (the relocations metric label)
    from_node: str
    to_node: str
    pod: str  # the stuck pod, namespace/name
    why: str


@dataclass(frozen=True, slots=True)
class DeleteStrayPod:
    """Delete a placeholder pod recreated in a domain the placeholder left (from the
    template before the move), once per pod version."""

    namespace: str
    name: str
    statefulset: str
    node: str


@dataclass(frozen=True, slots=True)
class ReleasePod:
    """Lift our scheduling gate from a pod whose placeholder is bound to ``node``: one JSON
    patch (``node_pin.release_ops``: pin, record the pin, a ``test`` on the gate and its
    removal). A stale view fails the patch (409/422); the next look decides again."""

    namespace: str
    name: str
    statefulset: str
    node: str
    ops: tuple[dict[str, Any], ...]  # JSONPatch operations (``wire.jsonpatch.Op``)
    # The pod's version the patch was planned from: the executor does not patch the same
    # version twice (its cache may not show the first patch yet).
    resource_version: str = ""


@dataclass(frozen=True, slots=True)
class DeleteStrandedPod:
    """Delete a never-started pod pinned to a node its run left, so that its engine
    recreates it (pinned to the run's node, or gated until the placeholder is bound). The
    delete is conditional on the observed uid and resourceVersion: a pod bound meanwhile is
    never deleted. ``event`` (on the run) is recorded once it is deleted."""

    namespace: str
    name: str
    uid: str
    resource_version: str
    statefulset: str
    node: str  # where it was pinned
    event: RecordEvent


@dataclass(frozen=True, slots=True)
class MarkStuck:
    """The group is stuck (counted in ``coschedule_stuck_groups``). With ``explained``, a
    new explanation: remembered (so that it is given once per change) and logged."""

    namespace: str
    name: str
    explained: tuple[Any, ...] | None = None  # None: the one given before still holds
    text: str = ""
    pod: str = ""
    node: str = ""
    reason: str = ""


@dataclass(frozen=True, slots=True)
class ClearStuck:
    """The group is not stuck; ``forget`` also drops what was explained (a new stuck
    episode is explained again); ``why`` logs that a stuck group got unstuck."""

    namespace: str
    name: str
    forget: bool = True
    why: str | None = None


@dataclass(frozen=True, slots=True)
class WriteControlStatus:
    """Write a ConcurrencyControl's counts to its status subresource (a merge patch; planned
    only when they changed). A control deleted meanwhile (404) has no status to write."""

    namespace: str
    name: str
    status: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class AdmitHeldRun:
    """Carry out the run webhook's decision on a run the admission policy held while no
    webhook answered: one JSON patch (``ops``, a ``test`` of the resourceVersion read
    first), a log line and an ``AdmittedWithoutWebhook`` Event saying ``message``."""

    run: Run
    ops: tuple[Mapping[str, Any], ...]
    message: str


Action = (
    CreateStatefulSet
    | PatchStatefulSet
    | DeletePlaceholderPod
    | HoldPinnedPlaceholder
    | DeleteStatefulSet
    | DeleteClaim
    | ReleaseClaim
    | RecordEvent
    | RelocatePlaceholder
    | DeleteStrayPod
    | ReleasePod
    | DeleteStrandedPod
    | MarkStuck
    | ClearStuck
    | ReportAssistantConflict
    | StartRun
    | CancelRun
    | MarkWaiting
    | WriteControlStatus
    | AdmitHeldRun
)


@dataclass(frozen=True, slots=True)
class Requeue:
    """Look at this group again after ``after`` seconds (owner re-check, idle grace)."""

    after: float
    why: str


@dataclass(frozen=True, slots=True)
class Plan:
    """What ``plan`` decided for one group (controller-runtime's ``Result`` with the work):
    the actions to carry out in order, and when to look again."""

    actions: tuple[Action, ...] = ()
    requeue: Requeue | None = None  # look again after a delay (None: on the next change)
    # The observation was incomplete (an owner lookup failed): act on nothing, retry the
    # key with backoff; says why.
    retry: str | None = None
    warning: str | None = None  # a log line at warning level (acted on incomplete data)
    note: str | None = None  # why nothing was done (a debug line)

    def then(self, later: Plan) -> Plan:
        """This plan followed by ``later``: both's actions in order, the sooner look."""
        requeue = self.requeue
        if later.requeue is not None and (requeue is None or later.requeue.after < requeue.after):
            requeue = later.requeue
        return Plan(
            (*self.actions, *later.actions),
            requeue,
            self.retry if self.retry is not None else later.retry,
            self.warning if self.warning is not None else later.warning,
            self.note if self.note is not None else later.note,
        )
