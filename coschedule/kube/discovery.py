"""Is a resource served? (API discovery) A CRD that is not installed is not an error: the
caller watches what exists and asks again later."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable

from coschedule.kube.client import KubeClient
from coschedule.kube.reachability import describe, is_unreachable

log = logging.getLogger("coschedule.discovery")

RETRY_SECONDS = 30.0  # a CRD that is not installed: look again this often
ERROR_BACKOFF_START = 0.5  # discovery itself failed: back off from here up to RETRY_SECONDS


async def served(client: KubeClient, group_version: str, plural: str) -> bool:
    path = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
    doc = await client.get(path)
    if doc is None:
        return False
    return any(isinstance(r, dict) and r.get("name") == plural for r in doc.get("resources") or ())


async def wait_served(
    client: KubeClient,
    group_version: str,
    plural: str,
    *,
    retry: float = RETRY_SECONDS,
    on_absent: Callable[[], None] | None = None,
) -> None:
    """Return once ``plural`` is served; while it is not, ask every ``retry`` seconds; when
    discovery fails, back off with jitter (an unreachable API server is logged once, by the
    client, not here)."""
    resource = f"{group_version}/{plural}"
    logged = False
    backoff = ERROR_BACKOFF_START
    while True:
        try:
            if await served(client, group_version, plural):
                return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if not is_unreachable(exc):
                log.warning(
                    "discovery failed", extra={"resource": resource, "error": describe(exc)}
                )
            await asyncio.sleep(min(retry, backoff) * (0.5 + random.random()))
            backoff = min(backoff * 2, retry)
            continue
        backoff = ERROR_BACKOFF_START
        if on_absent is not None:
            on_absent()
        if not logged:
            log.info(
                "resource not served (its CRD is not installed?); will look again",
                extra={"resource": resource, "retry_in": retry},
            )
            logged = True
        await asyncio.sleep(retry)
