"""What stuck-run planning reads beyond the caches, and what the reconciler remembers of it.

Reading: the claims and volumes of a stuck run (GET) and the requests of the pods bound to
a node (LIST by ``spec.nodeName``), only what ``stuck_runs.step`` asks for (a pod is
stuck: rare). Remembering: which groups are stuck (the ``coschedule_stuck_groups``
gauge) and what was explained about each, so that an explanation is given once per change.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from decimal import Decimal
from typing import Any

from prometheus_client import Gauge

from coschedule.config.settings import Settings
from coschedule.k8s import fit
from coschedule.k8s.constants import TERMINAL_PHASES
from coschedule.k8s.volumes import volume_topology
from coschedule.kube.client import KubeClient, object_path
from coschedule.reconcile import stuck
from coschedule.reconcile.model import Observed, Plan
from coschedule.reconcile.stuck_runs import StuckFacts, Wanted, step


class StuckMemory:
    """The groups counted stuck, and the last explanation given for each (its fingerprint)."""

    def __init__(self, gauge: Gauge) -> None:
        self.gauge = gauge
        self._stuck: set[str] = set()
        self._explained: dict[str, tuple[Any, ...]] = {}

    def is_stuck(self, key: str) -> bool:
        return key in self._stuck

    def explained(self, key: str) -> tuple[Any, ...] | None:
        return self._explained.get(key)

    def mark(self, key: str, explained: tuple[Any, ...] | None) -> None:
        self._stuck.add(key)
        self.gauge.set(len(self._stuck))
        if explained is not None:
            self._explained[key] = explained

    def clear(self, key: str, *, forget: bool = True) -> bool:
        """Not stuck (``forget``: and nothing explained); whether it was stuck."""
        was = key in self._stuck
        self._stuck.discard(key)
        self.gauge.set(len(self._stuck))
        if forget:
            self._explained.pop(key, None)
        return was


async def read_and_plan(
    client: KubeClient, observed: Observed, facts: StuckFacts, settings: Settings, now: float
) -> tuple[StuckFacts, Plan]:
    """``facts`` with everything the stuck-run plan wants read (usually nothing), and that
    plan: each step is decided once (a reconcile's every group goes through here)."""
    while isinstance(planned := step(observed, facts, settings, now), Wanted):
        if planned.claims is not None:
            facts = replace(
                facts, claims=tuple(await claims(client, observed.namespace, planned.claims))
            )
        if planned.usage:
            read = {node: await usage(client, node) for node in planned.usage}
            facts = replace(facts, usage={**facts.usage, **read})
    return facts, planned


async def usage(client: KubeClient, node: str) -> dict[str, Decimal]:
    """What the non-terminated pods bound to ``node`` request."""
    listed = await client.list("/api/v1/pods", {"fieldSelector": f"spec.nodeName={node}"})
    return fit.used(
        fit.pod_requests(item.get("spec") or {})
        for item in listed.get("items") or ()
        if (item.get("status") or {}).get("phase") not in TERMINAL_PHASES
        and (item.get("spec") or {}).get("nodeName") == node
    )


async def claims(
    client: KubeClient, namespace: str, names: Sequence[str]
) -> list[stuck.ClaimState]:
    """Each claim: bound or not, and where its volume can be used."""
    result = []
    for name in dict.fromkeys(names):
        claim = await client.get(object_path("v1", "persistentvolumeclaims", namespace, name))
        volume_name = str(((claim or {}).get("spec") or {}).get("volumeName") or "")
        if not volume_name:
            result.append(stuck.ClaimState(name, False, None))
            continue
        pv = await client.get(object_path("v1", "persistentvolumes", None, volume_name))
        result.append(stuck.ClaimState(name, True, volume_topology(pv) if pv is not None else None))
    return result


async def claims_gone(client: KubeClient, namespace: str, names: Sequence[str]) -> tuple[str, ...]:
    """The claims of ``names`` that are deleted (404) or being deleted."""
    gone = []
    for name in dict.fromkeys(names):
        claim = await client.get(object_path("v1", "persistentvolumeclaims", namespace, name))
        if claim is None or (claim.get("metadata") or {}).get("deletionTimestamp"):
            gone.append(name)
    return tuple(gone)
