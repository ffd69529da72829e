"""Recording a core/v1 Event: one body shape for every Event the reconciler writes.

An Event is a courtesy to the user, never a reason to retry a reconcile: a refused one is
logged as a warning and dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from coschedule.k8s.timefmt import rfc3339
from coschedule.kube.client import KubeClient, object_path

log = logging.getLogger("coschedule.events")

# The API server keeps messages of any length, but kubectl and dashboards show 1 KiB at most.
MAX_MESSAGE = 1024


def event_body(
    namespace: str,
    involved: Mapping[str, str],
    reason: str,
    message: str,
    event_type: str = "Normal",
    now: datetime | None = None,
) -> dict[str, Any]:
    """The Event about ``involved`` (apiVersion, kind, name and, when known, uid)."""
    stamp = rfc3339(now or datetime.now(UTC))
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{involved['name']}.", "namespace": namespace},
        "involvedObject": {**{k: v for k, v in involved.items() if v}, "namespace": namespace},
        "reason": reason,
        "message": message[:MAX_MESSAGE],
        "type": event_type,
        "source": {"component": "coschedule-reconciler"},
        "reportingComponent": "coschedule.dev/reconciler",
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


async def record_event(
    client: KubeClient,
    namespace: str,
    involved: Mapping[str, str],
    reason: str,
    message: str,
    event_type: str = "Normal",
) -> bool:
    """Create the Event; False (and a warning) when the API refused it."""
    body = event_body(namespace, involved, reason, message, event_type)
    try:
        await client.create(object_path("v1", "events", namespace), body)
    except Exception as exc:  # an Event is a courtesy: never retry a reconcile for it
        log.warning(
            "could not record an Event",
            extra={
                "namespace": namespace,
                "object": f"{involved.get('kind')}/{involved.get('name')}",
                "reason": reason,
                "error": str(exc),
            },
        )
        return False
    return True
