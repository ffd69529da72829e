"""Nodes without the configured topology-key label: counted, and each logged once.

Placeholder anti-affinity (and the pods' affinity to their placeholder) matches on that
label; a node without it is invisible to those terms, so operators need to see it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from coschedule.kube.informer import Obj

log = logging.getLogger("coschedule.reconcile")


class TopologyLabels:
    def __init__(self, key: str, report: Callable[[int], None]) -> None:
        self.key = key
        self.missing: set[str] = set()
        self._report = report

    def node(self, event: str, obj: Obj) -> None:
        meta = obj.get("metadata") or {}
        name = str(meta.get("name") or "")
        if event == "DELETED" or self.key in (meta.get("labels") or {}):
            self.missing.discard(name)
        elif name not in self.missing:
            self.missing.add(name)
            log.warning(
                "node lacks the topology-key label: placeholders avoid it, pod affinity misses it",
                extra={"node": name, "topology_key": self.key},
            )
        self._report(len(self.missing))

    def rekey(self, key: str, nodes: list[Obj]) -> None:
        """The configured key changed: recount every node."""
        if key == self.key:
            return
        self.key = key
        self.missing.clear()
        for obj in nodes:
            self.node("MODIFIED", obj)
        self._report(len(self.missing))
