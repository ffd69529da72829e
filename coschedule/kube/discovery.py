"""Is a resource served? (API discovery) A CRD that is not installed is not an error: the
caller watches what exists and asks again later."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from coschedule.kube.client import ApiError, KubeClient

log = logging.getLogger("coschedule.discovery")

RETRY_SECONDS = 30.0


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
    """Return once ``plural`` is served; until then ask every ``retry`` seconds."""
    logged = False
    while True:
        try:
            if await served(client, group_version, plural):
                return
            if on_absent is not None:
                on_absent()
            if not logged:
                log.info(
                    "resource not served (its CRD is not installed?); will look again",
                    extra={"resource": f"{group_version}/{plural}", "retry_in": retry},
                )
                logged = True
        except ApiError as exc:
            log.warning(
                "discovery failed",
                extra={"resource": f"{group_version}/{plural}", "error": str(exc)},
            )
        except Exception as exc:
            log.warning(
                "discovery failed",
                extra={"resource": f"{group_version}/{plural}", "error": repr(exc)},
            )
        await asyncio.sleep(retry)
