"""The reconciler's decision: ``plan(observed, settings, now) -> actions``. Pure.

Level-based: for one placeholder, compare what should exist with what does, every time.
- a live marked pod and no StatefulSet: create it;
- a StatefulSet that drifted from what we own (replicas, labels, template, owner): patch;
- its pod on a node that is cordoned or tainted against it: delete that pod (not the set),
  unless its volumes can be used on that node only: then it stays, explained; on a node
  whose kubelet stopped reporting (or left a delete unfinished), force-delete it: a
  placeholder runs nothing, and the StatefulSet makes it again only once it is gone;
- no live pod: tear down when the run is done (owner complete or gone; or, with no
  owner, idle for ``idle_grace_seconds``, or at once when a workspaces group's claim is
  being deleted), else look again later.
"""

from __future__ import annotations

from collections.abc import Sequence

from coschedule import marks
from coschedule.config.settings import Settings
from coschedule.k8s.constants import HOSTNAME
from coschedule.k8s.nodes import Node, kubelet_silent, not_ready
from coschedule.k8s.taints import eviction_reason
from coschedule.marks import ANNOTATION_MODE, ClaimTemplate, Mode
from coschedule.reconcile import owners
from coschedule.reconcile.model import (
    Action,
    CreateStatefulSet,
    DeleteClaim,
    DeletePlaceholderPod,
    DeleteStatefulSet,
    HoldPinnedPlaceholder,
    MarkedPod,
    Obj,
    Observed,
    ObservedSet,
    OwnerRef,
    OwnerState,
    OwnerStatus,
    PatchStatefulSet,
    PlaceholderPod,
    Plan,
    RecordEvent,
    ReleaseClaim,
    Requeue,
)
from coschedule.reconcile.placeholder import (
    ANNOTATION_TEMPLATE_HASH,
    UPDATE_STRATEGY,
    GroupSpec,
    build_statefulset,
    group_spec,
    steered_template,
    template_patch,
)

OWNER_RECHECK_SECONDS = 30.0  # how often a quiet run's owner is asked whether it is done
# A run's last pod usually ends a moment before its owner reports completion: ask again
# soon, then less often as the quiet lasts (2, 4, 8, 16 s ... up to the period above).
FIRST_OWNER_RECHECK_SECONDS = 2.0
DELETING_RECHECK_SECONDS = 1.0
# The owner lookup failed while pods wait: the placeholder is created without an owner
# and the lookup tried again this soon (the owner is patched in once it works).
OWNER_RETRY_SECONDS = 5.0
# A placeholder pod still there this long after its grace period ended, on a node whose
# kubelet reports it not ready: that kubelet will not finish the delete; force it.
STRANDED_DELETE_SECONDS = 5.0
# A node silent (Ready Unknown) this long, whose kubelet has not renewed its Lease for as
# long either, is taken for dead: its placeholder pod is forced off. Kubelets renew their
# Lease every 10 s and post again within about 10 s of a control plane's return.
NODE_DOWN_SECONDS = 20.0
NODE_DOWN = "node-down"  # the evictions metric label of a force-delete


def plan(
    observed: Observed,
    settings: Settings,
    now: float,
    *,
    owner_recheck: float = OWNER_RECHECK_SECONDS,
) -> Plan:
    """The actions for one group and when to look at it again. Pure."""
    sts = observed.statefulset
    live = any(pod.live for pod in observed.pods)
    owner = observed.owner
    lookup_failed = owner is not None and owner.status is OwnerStatus.LOOKUP_FAILED
    if lookup_failed and (not live or sts is not None):
        # Nothing waits on the owner: decide nothing on half the facts; retry with backoff.
        return Plan(retry=owner.detail if owner is not None else "")
    moves = Plan()
    if sts is not None and not sts.deleting:
        moves = evictions(observed, now)
    return moves.then(_converge(observed, settings, now, owner_recheck))


def _converge(observed: Observed, settings: Settings, now: float, owner_recheck: float) -> Plan:
    """Create, patch or tear down the StatefulSet (its pods' moves are ``evictions``')."""
    sts = observed.statefulset
    # A seed stands in for the run's pods until the first one exists (``run_seed``).
    seeded = observed.seed is not None and not observed.pods
    live = seeded or any(pod.live for pod in observed.pods)
    owner = observed.owner
    lookup_failed = owner is not None and owner.status is OwnerStatus.LOOKUP_FAILED
    pods = (observed.seed,) if seeded and observed.seed is not None else observed.pods
    group = group_spec(observed.namespace, observed.name, pods, observed.claims_kept)
    actions: list[Action] = []
    if seeded:
        # Looked at again when the seed expires: a run with no pod by then gives it back.
        wait = max(0.05, observed.seed_until - now)
        later = Plan(requeue=Requeue(wait, "placeholder made before the run's first pod"))
        return _converge_live(observed, settings, group, owner, lookup_failed, seeded).then(later)
    if live:
        return _converge_live(observed, settings, group, owner, lookup_failed, seeded)
    if sts is None:
        released = released_claims(observed)
        if released:
            return Plan(tuple(actions) + released)
        note = "no live pod and no StatefulSet: nothing to do" if observed.pods else None
        return Plan(tuple(actions), note=note)
    if sts.deleting:
        return Plan(tuple(actions))

    done, why, wait = _run_done(observed, sts, settings, now, owner_recheck)
    if not done:
        patch = drift(sts, group, settings, owner, observed.claim_templates)
        if patch is not None:
            actions.append(patch)
        return Plan(tuple(actions), Requeue(wait, why))
    actions.append(
        RecordEvent(observed.namespace, sts.name, "PlaceholderDeleted", f"run done: {why}")
    )
    actions.append(DeleteStatefulSet(observed.namespace, sts.name, why))
    actions.extend(DeleteClaim(observed.namespace, claim) for claim in observed.claims_to_delete)
    return Plan(tuple(actions))


def _converge_live(
    observed: Observed,
    settings: Settings,
    group: GroupSpec | None,
    owner: OwnerState | None,
    lookup_failed: bool,
    seeded: bool,
) -> Plan:
    """A group with a live pod (or a seed): create its StatefulSet, or put back what drifted."""
    sts = observed.statefulset
    actions: list[Action] = []
    assert group is not None  # live pods make a group
    if (
        sts is None
        and not seeded
        and group.mode is not Mode.WORKSPACES
        and owner is not None
        and owner.status is OwnerStatus.DONE
    ):
        # Its engine makes no pod for a done run: its last pods are ending or being deleted
        # (a run deleted while its last pod ran: the garbage collector took the StatefulSet
        # first). A placeholder made now would be torn down at once.
        return Plan(note=f"run done, no placeholder made for its last pods: {owner.detail}")
    if sts is None:
        root = _owner_for(group, owner)
        body = build_statefulset(group, settings, root, observed.claim_templates)
        event = RecordEvent(
            observed.namespace,
            observed.name,
            "PlaceholderCreated",
            f"placeholder for {_describe(group)} created"
            + (f", owned by {root.kind} {root.name}" if root else "")
            + (", before the run's first pod" if seeded else "")
            + _left_out(group),
            "Warning" if group.excluded else "Normal",
        )
        actions.append(CreateStatefulSet(observed.namespace, observed.name, body, event))
        if lookup_failed:
            # Pods wait for their placeholder: create it now without an owner; the
            # owner is patched in once the lookup works (the StatefulSet then drifts).
            assert owner is not None
            return Plan(
                tuple(actions),
                Requeue(OWNER_RETRY_SECONDS, "owner lookup failed"),
                warning="owner lookup failed; creating the placeholder without an owner "
                f"for now: {owner.detail}",
            )
        return Plan(tuple(actions))
    if sts.deleting:
        return Plan(
            tuple(actions),
            Requeue(DELETING_RECHECK_SECONDS, "the StatefulSet is being deleted; recreate it"),
        )
    patch = drift(sts, group, settings, owner, observed.claim_templates)
    if patch is not None:
        actions.append(patch)
    return Plan(tuple(actions))


def released_claims(observed: Observed) -> tuple[ReleaseClaim, ...]:
    """After teardown (no StatefulSet, no placeholder pod, no live pod of the run): the
    claims our volumeClaimTemplates made for the run, whose deletion the run's finished pods
    would hold up until the engine deletes them. None while anything could still use them."""
    if observed.statefulset is not None or observed.placeholder_pods:
        return ()
    if not observed.pods or any(pod.live for pod in observed.pods):
        return ()
    return tuple(
        ReleaseClaim(observed.namespace, marks.placeholder_claim(t.name, observed.name))
        for t in observed.claim_templates
    )


def _left_out(group: GroupSpec) -> str:
    if not group.excluded:
        return ""
    return (
        f"; pod(s) {', '.join(group.excluded)} left out of where it may go: their nodeSelector "
        "and required node affinity allow no node the run's earlier pods allow, so they cannot "
        "join it (give every pod of the run constraints that agree)"
    )


def _describe(group: GroupSpec) -> str:
    if group.mode is Mode.WORKSPACES:
        return f"claim {group.claims[0]} (mode workspaces)"
    return f"run {group.run} (mode {group.mode.value})"


def _owner_for(group: GroupSpec, owner: OwnerState | None) -> OwnerRef | None:
    # Workspaces groups follow a claim that many runs may share: no single owner. (A done
    # run's group gets no new StatefulSet: ``_converge_live``.)
    if group.mode is Mode.WORKSPACES or owner is None:
        return None
    return owner.root


def evictions(observed: Observed, now: float) -> Plan:
    """Placeholder pods that must leave their node: deleted so that the StatefulSet makes
    them again elsewhere; force-deleted where the node's kubelet cannot finish a graceful
    delete (``_off_dead_node``); held, explained, where their volumes can be used on that
    node only."""
    actions: list[Action] = []
    soonest: float | None = None
    for pod in observed.placeholder_pods:
        if not pod.node_name:
            continue
        node = observed.nodes.get(pod.node_name)
        if node is None:  # a vanished node's pods are the pod garbage collector's (~40 s)
            continue
        silent = kubelet_silent(node)
        renewed = observed.node_renewed.get(node.name)
        if silent and renewed is not None and now - renewed < NODE_DOWN_SECONDS:
            # Its kubelet renews its Lease: alive, only its Ready status behind (a control
            # plane back from an outage marks nodes Unknown until they post again, which
            # under load takes longer than NODE_DOWN_SECONDS). Nothing moves for that.
            alive_for = renewed + NODE_DOWN_SECONDS - now
            soonest = alive_for if soonest is None else min(soonest, alive_for)
            continue
        if silent or (pod.deleting and not_ready(node)):
            action, wait = _off_dead_node(observed, pod, node, silent, now)
            if action is not None:
                actions.append(action)
            if wait is not None:
                soonest = wait if soonest is None else min(soonest, wait)
            continue
        if pod.deleting:
            continue
        reason, why = eviction_reason(node, pod.tolerations)
        if not reason:
            continue
        pins = pinned_by(observed, node.name)
        if pins:
            actions.append(_hold(observed, pod, node.name, reason, why, pins))
            continue
        event = RecordEvent(
            observed.namespace,
            observed.name,
            "PlaceholderMoved",
            f"deleted placeholder pod {pod.name}: {why}; its StatefulSet makes it again on a "
            "node that admits it once the pod is gone",
            "Warning",
        )
        actions.append(
            DeletePlaceholderPod(
                observed.namespace, pod.name, observed.name, node.name, reason, why, event
            )
        )
    requeue = None
    if soonest is not None:
        requeue = Requeue(soonest, "a placeholder pod on a node that does not report")
    return Plan(tuple(actions), requeue)


def _hold(
    observed: Observed, pod: PlaceholderPod, node: str, reason: str, why: str, pins: list[str]
) -> HoldPinnedPlaceholder:
    message = (
        f"placeholder pod {pod.name} stays on node {node} although {why}: "
        f"the run's data is there, on volume(s) usable on that node only "
        f"({'; '.join(pins)}); moved, it could run nowhere. The run's next pods "
        f"wait for the node: uncordon or untaint it, or delete the run to free it"
    )
    event = RecordEvent(observed.namespace, observed.name, "PlaceholderPinned", message, "Warning")
    return HoldPinnedPlaceholder(
        observed.namespace, pod.name, observed.name, node, reason, message, event
    )


def _off_dead_node(
    observed: Observed, pod: PlaceholderPod, node: Node, silent: str, now: float
) -> tuple[Action | None, float | None]:
    """A placeholder pod on a node whose kubelet stopped reporting (``silent``), or being
    deleted on a node whose kubelet says NotReady: (the action, look again after).

    Silent: force-deleted once the node has been silent ``NODE_DOWN_SECONDS`` (a control
    plane that was away a moment marks every node Unknown until their kubelets post again:
    nothing moves for that), and never while every node is silent (the node lifecycle
    controller's full disruption: the cause is on the control plane's side). NotReady: its
    kubelet gets the pod's grace period and ``STRANDED_DELETE_SECONDS``, then forced."""
    pins = pinned_by(observed, node.name)
    if pins:  # moved, it could run nowhere
        if pod.deleting:
            return None, None
        return _hold(observed, pod, node.name, NODE_DOWN, silent, pins), None
    if silent:
        if observed.all_nodes_silent:
            return None, None
        # No transition time (a taint without a Ready condition): taken as long silent.
        since = node.ready_since if node.ready_since is not None else now - NODE_DOWN_SECONDS
        due = since + NODE_DOWN_SECONDS
        if now < due:
            return None, due - now
        return _force(observed, pod, node.name, silent), None
    due = (pod.deletion_due if pod.deletion_due is not None else now) + STRANDED_DELETE_SECONDS
    if now < due:
        return None, due - now
    why = f"{not_ready(node)}, and the pod's graceful delete did not finish"
    return _force(observed, pod, node.name, why), None


def _force(observed: Observed, pod: PlaceholderPod, node: str, why: str) -> DeletePlaceholderPod:
    event = RecordEvent(
        observed.namespace,
        observed.name,
        "PlaceholderMoved",
        f"force-deleted placeholder pod {pod.name} (grace period 0): {why}. Its kubelet "
        "cannot finish a graceful delete and a placeholder runs nothing, so its StatefulSet "
        "makes it again on another node now",
        "Warning",
    )
    return DeletePlaceholderPod(
        observed.namespace,
        pod.name,
        observed.name,
        node,
        NODE_DOWN,
        why,
        event,
        force=True,
        uid=pod.uid,
    )


def pinned_by(observed: Observed, node: str) -> list[str]:
    """The placeholder's volumes that can be used on ``node`` and nowhere else (a bound
    node-local volume), described; empty when moving the placeholder could help."""
    pins = []
    for claim, volume in observed.placeholder_volumes:
        hosts = volume.pinned(HOSTNAME)
        if hosts and hosts <= {node}:
            pins.append(f"claim {claim}, volume {volume.name}")
    return pins


def drift(
    sts: ObservedSet,
    group: GroupSpec | None,
    settings: Settings,
    owner: OwnerState | None,
    claim_templates: Sequence[ClaimTemplate] = (),
) -> PatchStatefulSet | None:
    """A strategic merge patch putting back the fields we own, or None when nothing drifted.

    Never a delete-and-recreate: that would restart the placeholder under a live run, and
    volumeClaimTemplates are immutable anyway.
    """
    spec: Obj = {}
    meta: Obj = {}
    reasons: list[str] = []
    if sts.replicas != 1:
        spec["replicas"] = 1
        reasons.append(f"replicas {sts.replicas} -> 1")
    if sts.update_strategy != UPDATE_STRATEGY:
        spec["updateStrategy"] = {"type": UPDATE_STRATEGY, "rollingUpdate": None}
        reasons.append(f"updateStrategy {sts.update_strategy} -> {UPDATE_STRATEGY}")
    wanted = marks.placeholder_labels(sts.name)
    wrong = {k: v for k, v in wanted.items() if sts.labels.get(k) != v}
    if wrong:
        meta["labels"] = wrong
        reasons.append(f"labels {sorted(wrong)}")
    if group is not None:
        template, annotations = steered_template(group, settings, claim_templates, sts.annotations)
        if sts.annotations.get(ANNOTATION_TEMPLATE_HASH) != annotations[ANNOTATION_TEMPLATE_HASH]:
            spec["template"] = template_patch(template)
            meta["annotations"] = annotations
            reasons.append("pod template")
        root = _owner_for(group, owner)
        if root is not None and root.uid not in {r.get("uid") for r in sts.owner_references}:
            meta["ownerReferences"] = [*sts.owner_references, root.as_owner_reference()]
            reasons.append(f"owner {root.kind} {root.name}")
    if not reasons:
        return None
    # The resourceVersion makes the patch conditional: a 409 means we planned from a stale
    # cache; the retry plans again from the newer object.
    meta["resourceVersion"] = sts.resource_version
    patch: Obj = {"metadata": meta}
    if spec:
        patch["spec"] = spec
    return PatchStatefulSet(sts.namespace, sts.name, patch, ", ".join(reasons))


def per_run(pods: Sequence[MarkedPod], sts: ObservedSet) -> bool:
    """Whether a group is a run's (its pods' mode, else its StatefulSet's): False for a
    workspaces group, which follows a claim."""
    if pods:
        return pods[0].marks.mode.per_run
    mode = Mode.parse(sts.annotations.get(ANNOTATION_MODE, ""))
    return mode is not None and mode.per_run


def _run_done(
    observed: Observed, sts: ObservedSet, settings: Settings, now: float, owner_recheck: float
) -> tuple[bool, str, float]:
    """(done, why, seconds until the next look) for a group with no live pod."""
    owner = observed.owner
    root = owner.root if owner is not None else None
    run = per_run(observed.pods, sts)
    if run and not observed.pods and observed.run_begun is not None and not sts.templates:
        # Made from the run's seed and no pod came: the idle grace from the run's beginning,
        # even while it runs (its first pod, if ever, gets a placeholder as any first pod).
        grace = float(settings.idle_grace_seconds)
        if now - observed.run_begun >= grace:
            return True, f"the run made no pod within the idle grace ({int(grace)} s)", 0.0
    if run and owner is not None and root is not None:
        if owner.status is OwnerStatus.DONE:
            return True, owner.detail or f"{root.kind} {root.name} is done", 0.0
        # Never tear down a run whose owner runs (or cannot be asked right now), however
        # long the gap between its tasks.
        checked = owner.checked_at if owner.checked_at is not None else now
        interval = recheck_interval(now - idle_since(observed, now), owner_recheck)
        wait = max(0.05, checked + interval - now)
        state = "still running" if owner.status is OwnerStatus.RUNNING else "not known yet"
        return False, f"{root.kind} {root.name} {state}: check again", wait
    if observed.claims_gone:
        gone = ", ".join(observed.claims_gone)
        return True, f"claim {gone} deleted: no pod can mount it again", 0.0
    since = idle_since(observed, now)
    grace = float(settings.idle_grace_seconds)
    if now - since >= grace:
        return True, f"no live pod for {int(now - since)} s (idle grace {int(grace)} s)", 0.0
    wait = since + grace - now
    if not run:
        # A workspaces group's claim deleted meanwhile (its run deleted) frees the
        # placeholder at once: look again (the controller reads the claim) as often as a
        # quiet run's owner is asked, not only when the grace ends.
        wait = min(wait, recheck_interval(now - since, owner_recheck))
    return False, "no live pod: waiting out the idle grace", wait


def idle_since(observed: Observed, now: float) -> float:
    """When the group went quiet: its last pod's end if known, else when first seen quiet."""
    return quiet_since(observed.pods, observed.idle_since, now)


def quiet_since(pods: Sequence[MarkedPod], first_seen_quiet: float | None, now: float) -> float:
    finished = [p.finished_at for p in pods if p.finished_at is not None]
    if finished:
        return max(finished)
    return first_seen_quiet if first_seen_quiet is not None else now


def recheck_interval(quiet_for: float, owner_recheck: float = OWNER_RECHECK_SECONDS) -> float:
    """How long after the last answer a quiet run's owner is asked again."""
    return min(owner_recheck, max(FIRST_OWNER_RECHECK_SECONDS, quiet_for))


def owner_check_due(
    observed_pods_live: bool,
    owner: OwnerState | None,
    now: float,
    owner_recheck: float = OWNER_RECHECK_SECONDS,
    quiet_for: float | None = None,
) -> bool:
    """Ask the root owner for its status only when the group is quiet and the last answer
    is older than the re-check interval (a running run with live pods needs no question)."""
    if observed_pods_live or owner is None or owner.root is None:
        return False
    if owner.status is OwnerStatus.DONE:
        return False
    interval = owner_recheck if quiet_for is None else recheck_interval(quiet_for, owner_recheck)
    return owner.checked_at is None or now - owner.checked_at >= interval


def known_root(sts: ObservedSet | None) -> OwnerRef | None:
    return owners.root_from_statefulset(sts) if sts is not None else None


def claim_templates(
    pods: Sequence[MarkedPod], sts: ObservedSet | None
) -> tuple[tuple[ClaimTemplate, ...], tuple[str, ...], tuple[str, ...]]:
    """Volume co-location (TEP-0135): (the run's volumeClaimTemplates, the claims the
    StatefulSet made, for teardown; template names the pods disagree on).

    Once the StatefulSet exists its templates (immutable) are the decision. Before, the
    webhook's decision travels on the pods: the union of their ``claim-templates``, so that
    every claim any pod was pointed at will exist. Pods agree unless a claim's binding
    changed between their admissions; then the earliest pod's spec wins."""
    if sts is not None:
        templates = tuple(
            ClaimTemplate(name=t, claim=c, spec={}) for t, c in sorted(sts.templates.items())
        )
        return (
            templates,
            tuple(marks.placeholder_claim(t, sts.name) for t in sorted(sts.templates)),
            (),
        )
    chosen: dict[str, ClaimTemplate] = {}
    conflicts: list[str] = []
    for pod in sorted(pods, key=lambda p: (p.created, p.name)):
        for template in pod.marks.claim_templates or ():
            previous = chosen.setdefault(template.name, template)
            if previous.claim != template.claim or previous.spec != template.spec:
                conflicts.append(template.name)
    return tuple(chosen[name] for name in sorted(chosen)), (), tuple(conflicts)
