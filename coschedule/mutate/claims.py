"""The claims step of ``decide``: which claims group the pod (skipped and shared ones do not),
the claims-conflict pre-flight, and the rewrite of a run's template claims to its
placeholder's. Pure; it reads the claim and volume caches through their views.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from coschedule import marks
from coschedule.config.settings import Settings
from coschedule.k8s.nodeaffinity import required_terms
from coschedule.marks import Mode
from coschedule.mutate import claim_rewrite as claims_mod
from coschedule.mutate import volume_conflict
from coschedule.mutate.claim_rewrite import ClaimView
from coschedule.mutate.context import AdmissionContext
from coschedule.mutate.outcome import Decision, deny
from coschedule.wire import jsonpatch
from coschedule.wire.jsonpatch import Op

# The rule of a pod refused until the claim cache has read what a rewrite needs (the
# pod endpoint waits for it and decides once more).
CLAIM_CACHE_NOT_SYNCED = "claim-cache-not-synced"


def claims_step(
    pod_spec: Mapping[str, Any],
    volumes: list[tuple[int, str, str]],
    ctx: AdmissionContext,
    mode: Mode,
    run: str,
    decision: Decision,
) -> tuple[list[str], ClaimView | None] | None:
    """The claims that group the pod, and the claim view to rewrite them with (None: none);
    None when the pod is denied."""
    settings = ctx.settings
    view = ctx.claims
    if view is not None and not view.synced:
        if not (volumes and mode.per_run and settings.rewrite_claims):
            view = None  # grouping as mounted is safe; only a rewrite needs the cache
        else:
            deny(
                decision,
                CLAIM_CACHE_NOT_SYNCED,
                "coschedule has not finished reading the cluster's claims since it started, "
                "so it cannot tell which claims of this run it co-locates. This is temporary: "
                "retry the pod in a few seconds.",
            )
            return None
    claims: list[str] = []
    for _, _, claim in volumes:
        if claim in claims:
            continue
        known = view.get(ctx.namespace, claim) if view is not None else None
        if view is not None and known is None and not marks.is_placeholder_claim(claim):
            decision.missing_claims += (claim,)
        if not claims_mod.groupable(known, settings.group_shared_claims):
            why = (
                "labelled coschedule.dev/skip=true" if known and known.skip else "shared (RWX/ROX)"
            )
            if decision.trace:
                decision.reasons.append(f"claim {claim!r}: {why}: neither grouped nor rewritten")
            continue
        claims.append(claim)
    if decision.missing_claims and mode.per_run and settings.rewrite_claims:
        deny(
            decision,
            "claim-unknown",
            f"claim(s) {', '.join(decision.missing_claims)} are not in coschedule's claim cache "
            "yet, so it cannot tell whether the run's placeholder provisions them. Retry the "
            "pod in a few seconds; if the claim does not exist, create it first.",
        )
        return None
    if view is not None and mode.per_run:
        conflict = _claims_conflict(pod_spec, ctx, view, run, claims)
        if conflict is not None:
            deny(decision, volume_conflict.RULE, conflict)
            return None
    return claims, view


def _claims_conflict(
    pod_spec: Mapping[str, Any],
    ctx: AdmissionContext,
    view: ClaimView,
    run: str,
    claims: list[str],
) -> str | None:
    """Rule claims-conflict: the run's bound claims cannot be used in one place."""
    volumes = ctx.volumes
    if volumes is None or not volumes.synced:
        return None

    def bound(info: claims_mod.ClaimInfo | None) -> volume_conflict.BoundClaim | None:
        if info is None or not info.volume:
            return None
        topology = volumes.get(info.volume)
        if topology is None or not topology.terms:
            return None
        return volume_conflict.BoundClaim(info.name, topology)

    own = [b for c in claims if (b := bound(view.get(ctx.namespace, c))) is not None]
    run_claims = [b for info in view.run_claims(ctx.namespace, run) if (b := bound(info))]
    if not own and not run_claims:
        return None
    selector = pod_spec.get("nodeSelector")
    return volume_conflict.check(
        own,
        run_claims,
        ctx.settings.topology_key,
        {k: v for k, v in selector.items() if isinstance(v, str)}
        if isinstance(selector, dict)
        else {},
        required_terms(pod_spec.get("affinity")),
    )


def rewrite_claims(
    namespace: str,
    run: str,
    placeholder: str,
    volumes: list[tuple[int, str, str]],
    claims: list[str],
    view: claims_mod.ClaimView,
    settings: Settings,
    ops: list[Op],
    decision: Decision,
) -> list[str]:
    """Point the run's template claims at the placeholder's; return the claims the
    placeholder must mount as they are (bound ones, the user's: they may hold data)."""
    reasons = decision.reasons
    existing = view.placeholder_templates(namespace, placeholder)
    earlier = view.pod_decision(namespace, placeholder) if existing is None else None
    if existing is not None:
        # The StatefulSet exists: its (immutable) templates are the run's decision.
        chosen = {claim: template for template, claim in existing.items()}
        if decision.trace:
            reasons.append(f"claims: following the {len(chosen)} template(s) of {placeholder}")
    elif earlier is not None:
        # An earlier pod of the run carries the decision: follow it, even if a claim got
        # bound since (Immediate binding): the run's pods must all agree.
        decision.templates = earlier
        chosen = {t.claim: t.name for t in earlier}
        if decision.trace:
            reasons.append(
                f"claims: following the run's earlier pods: the placeholder provisions "
                f"{sorted(chosen) or 'none'}"
            )
    elif not settings.rewrite_claims:
        # The default: the placeholder mounts the engine's own claims, so a workspace has
        # one volume whatever its class's binding mode (WaitForFirstConsumer: the
        # placeholder is the first consumer, as the run's pods wait for it; Immediate: the
        # run goes where the volume is). An earlier decision (above) is still followed.
        decision.templates = ()
        chosen = {}
        if decision.trace:
            reasons.append("claims: rewrite-claims is off: the placeholder mounts them as they are")
    else:
        templates = claims_mod.run_templates(
            view.run_claims(namespace, run), run, settings.group_shared_claims
        )
        decision.templates = templates
        chosen = {t.claim: t.name for t in templates}
        if decision.trace:
            reasons.append(
                f"claims: the run's unbound template claims are {sorted(chosen) or 'none'}; "
                "the placeholder provisions them"
            )
    mounted: list[str] = []
    for index, _, claim in volumes:
        if claim not in claims:
            continue  # skipped or shared: left as it is
        if marks.is_placeholder_claim(claim, placeholder):
            if decision.trace:
                reasons.append(f"claim {claim!r}: already the placeholder's")
            continue
        template = chosen.get(claim)
        if template is not None:
            target = marks.placeholder_claim(template, placeholder)
            ops.append(
                jsonpatch.replace(f"/spec/volumes/{index}/persistentVolumeClaim/claimName", target)
            )
            if decision.trace:
                reasons.append(f"claim {claim!r}: rewritten to {target!r} (template {template!r})")
            continue
        info = view.get(namespace, claim)
        if info is not None and info.bound:
            why = "bound (it may hold data)"
        elif info is not None and not info.belongs_to(run):
            why = "not made for this run"
        else:
            why = "not in the placeholder's templates"
        if decision.trace:
            reasons.append(f"claim {claim!r}: kept, {why}; the placeholder mounts it")
        if claim not in mounted:
            mounted.append(claim)
    return mounted
