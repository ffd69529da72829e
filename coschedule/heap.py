"""The cyclic garbage collector kept off what both processes hold for their lifetime.

CPython's full (generation 2) collection walks every container object alive: the modules,
the web app's and prometheus' objects, and once the caches are filled, every cached
Kubernetes object (plain dicts and lists, tens per object). It runs on the event loop's
thread, in the middle of whichever task allocated last: an admission in the webhook, a
reconcile in the reconciler, and stalls every one queued behind it for as long as the walk
takes. What is alive once the process is built, and again once the caches are first filled,
stays alive until exit: ``gc.freeze`` moves it to the permanent generation, which no
collection walks, so a collection costs what is young, not what the process holds.
Reference counting still frees a frozen object that is dropped (a cache entry replaced by
its newer version); only a cycle among frozen objects would stay, and cached JSON objects
hold none.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Awaitable


def settle() -> int:
    """Collect what is garbage now, then freeze everything left; returns how many objects
    the collector no longer walks."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


async def settle_when(synced: Awaitable[object], log: logging.Logger) -> int:
    """Once ``synced`` (every cache's first list) is done, freeze what the caches hold: the
    bulk of a large cluster's heap, said on ``log``. Later entries are young until
    collections promote them. Returns how many objects were frozen."""
    await synced
    frozen = settle()
    log.info("caches synced: heap frozen", extra={"frozen_objects": frozen})
    return frozen
