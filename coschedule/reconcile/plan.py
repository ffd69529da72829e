"""The reconciler's decision: ``plan(observed, settings, now) -> actions``. Pure.

Level-based: for one placeholder, compare what should exist with what does, every time.
- a live marked pod and no StatefulSet: create it;
- a StatefulSet that drifted from what we own (replicas, labels, template, owner): patch;
- its pod on a node that is cordoned or tainted against it: delete that pod (not the set),
  unless its volumes can be used on that node only: then it stays, explained;
- no live pod: tear down when the run is done (owner complete or gone; or, with no
  owner, idle for ``idle_grace_seconds``, or at once when a workspaces group's claim is
  being deleted), else look again later.
"""

from __future__ import annotations

from collections.abc import Sequence

from coschedule import marks
from coschedule.config.settings import Settings
from coschedule.k8s.constants import HOSTNAME
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
)

OWNER_RECHECK_SECONDS = 30.0  # how often a quiet run's owner is asked whether it is done
# A run's last pod usually ends a moment before its owner reports completion: ask again
# soon, then less often as the quiet lasts (2, 4, 8, 16 s ... up to the period above).
FIRST_OWNER_RECHECK_SECONDS = 2.0
DELETING_RECHECK_SECONDS = 1.0
# The owner lookup failed while pods wait: the placeholder is created without an owner
# and the lookup tried again this soon (the owner is patched in once it works).
OWNER_RETRY_SECONDS = 5.0


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
    group = group_spec(observed.namespace, observed.name, observed.pods)
    actions: list[Action] = []

    if sts is not None and not sts.deleting:
        actions.extend(_evictions(observed))

    if live:
        assert group is not None  # live pods make a group
        if sts is None:
            root = _owner_for(group, owner)
            body = build_statefulset(group, settings, root, observed.claim_templates)
            event = RecordEvent(
                observed.namespace,
                observed.name,
                "PlaceholderCreated",
                f"placeholder for {_describe(group)} created"
                + (f", owned by {root.kind} {root.name}" if root else "")
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
    # Workspaces groups follow a claim that many runs may share: no single owner. An owner
    # already gone must not own a new StatefulSet (the garbage collector would delete it).
    if group.mode is Mode.WORKSPACES or owner is None or owner.status is OwnerStatus.DONE:
        return None
    return owner.root


def _evictions(observed: Observed) -> list[Action]:
    actions: list[Action] = []
    for pod in observed.placeholder_pods:
        if pod.deleting or not pod.node_name:
            continue
        node = observed.nodes.get(pod.node_name)
        if node is None:  # a vanished node is the node lifecycle controller's to handle
            continue
        reason, why = eviction_reason(node, pod.tolerations)
        if not reason:
            continue
        pins = pinned_by(observed, node.name)
        if pins:
            message = (
                f"placeholder pod {pod.name} stays on node {node.name} although {why}: "
                f"the run's data is there, on volume(s) usable on that node only "
                f"({'; '.join(pins)}); moved, it could run nowhere. The run's next pods "
                f"wait for the node: uncordon or untaint it, or delete the run to free it"
            )
            event = RecordEvent(
                observed.namespace, observed.name, "PlaceholderPinned", message, "Warning"
            )
            actions.append(
                HoldPinnedPlaceholder(
                    observed.namespace, pod.name, observed.name, node.name, reason, message, event
                )
            )
            continue
        event = RecordEvent(
            observed.namespace,
            observed.name,
            "PlaceholderMoved",
            f"deleted placeholder pod {pod.name} so that it moves: {why}",
            "Warning",
        )
        actions.append(
            DeletePlaceholderPod(
                observed.namespace, pod.name, observed.name, node.name, reason, why, event
            )
        )
    return actions


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
    """A merge patch putting back the fields we own, or None when nothing drifted.

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
            spec["template"] = template
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
