"""Whether a silent node's kubelet is alive: its Lease in ``kube-node-lease``.

A node whose Ready condition says Unknown has a kubelet that stopped posting status, or a
control plane that has not heard from it yet: after a kube-apiserver outage the node
lifecycle controller marks every node Unknown, and under load a kubelet can take longer
than ``plan.NODE_DOWN_SECONDS`` to post Ready again. Its Lease, renewed every 10 s, is what
the node lifecycle controller itself reads for health; a renewed one means a live kubelet.
Read only for a node a placeholder pod is on while it is silent (a GET, kept a moment so
that the runs on one node share it). A refused read (403 without the Role, a 5xx) counts as
not read: the node's Ready condition decides alone, as before; an unreachable API server
fails the pass, which is retried (nothing is forced on what could not be read).

``renewTime`` is written on the kubelet's clock, not ours: a renewal counts from when this
process saw the value advance, as the node lifecycle controller counts it (its probe
timestamp), so a kubelet whose clock runs ahead cannot keep a dead node "alive" for as long
as its clock is off. A first sight trusts the value back in time only (a dead node is found
as soon as today); a later value that did not advance keeps the first sight's time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from coschedule.k8s.timefmt import parse_time
from coschedule.kube.client import ApiError, KubeClient, object_path

log = logging.getLogger(__name__)

NODE_LEASE_NAMESPACE = "kube-node-lease"
KEEP_SECONDS = 2.0  # a read serves the passes of every run on the node this long


def renewal_seen(
    before: tuple[float, float] | None, renew_time: float, now: float
) -> tuple[float, float]:
    """``(renewTime, when we count it renewed)`` after reading ``renew_time`` at ``now``,
    from what the last read left (``before``; None at a first sight)."""
    if before is not None:
        last_value = before[0]
        if renew_time == last_value:
            return before  # not renewed since: the silence goes on counting
        if renew_time > last_value:
            return renew_time, now  # renewed between the reads
    # A first sight, or a Lease made again (its time went back): no later than now.
    return renew_time, min(renew_time, now)


class NodeLeases:
    def __init__(self, client: KubeClient, clock: Callable[[], float]) -> None:
        self.client = client
        self.clock = clock
        # node -> (read at, what ``renewal_seen`` made of it; None: not read, no renew time)
        self._read: dict[str, tuple[float, tuple[float, float] | None]] = {}

    async def renewed(self, nodes: Iterable[str]) -> dict[str, float]:
        """When each node's kubelet last renewed its Lease (seconds since the epoch, on this
        process's clock: ``renewal_seen``); a node whose Lease could not be read, or has no
        renew time, is left out."""
        found: dict[str, float] = {}
        now = self.clock()
        for node in nodes:
            kept = self._read.get(node)
            if kept is None or now - kept[0] >= KEEP_SECONDS:
                renew_time = await self._get(node)
                before = kept[1] if kept is not None else None
                seen = None if renew_time is None else renewal_seen(before, renew_time, now)
                kept = self._read[node] = (now, seen)
            if kept[1] is not None:
                found[node] = kept[1][1]
        for node in [n for n, (at, _) in self._read.items() if now - at >= 60 * KEEP_SECONDS]:
            del self._read[node]
        return found

    async def _get(self, node: str) -> float | None:
        path = object_path("coordination.k8s.io/v1", "leases", NODE_LEASE_NAMESPACE, node)
        try:
            lease = await self.client.get(path)
        except ApiError as exc:  # a transport error fails the pass: it is retried
            log.info("node lease not read", extra={"node": node, "why": str(exc)})
            return None
        return parse_time(((lease or {}).get("spec") or {}).get("renewTime"))
