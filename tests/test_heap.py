"""Both processes' heaps frozen once built (``coschedule.heap``): a full collection walks
only what is young, and young garbage is still collected. On the processes: the webhook
freezes before serving (tests/server/test_admission_log.py), the reconciler once its caches
are synced (tests/reconcile/test_main.py)."""

from __future__ import annotations

import asyncio
import gc
import logging
import weakref
from collections.abc import Iterator

import pytest

from coschedule import heap


class Node:
    """A container object that can sit in a reference cycle."""

    def __init__(self) -> None:
        self.other: Node | None = None


@pytest.fixture(autouse=True)
def unfrozen() -> Iterator[None]:
    # The test process must not keep its heap frozen for the tests after these.
    gc.unfreeze()
    yield
    gc.unfreeze()


def _tracked(obj: object) -> bool:
    return any(o is obj for o in gc.get_objects())


def test_what_lives_at_settle_is_no_longer_walked_and_young_cycles_are_still_collected() -> None:
    old = Node()
    assert _tracked(old)
    frozen = heap.settle()
    # What settle froze, as it counted it (not read again: other threads of the test process
    # free frozen objects of their own meanwhile).
    assert frozen > 0
    assert not _tracked(old)  # no collection walks it any more
    young = Node()
    assert _tracked(young)
    # A cycle made after the freeze is still garbage the collector finds and frees.
    a, b = Node(), Node()
    a.other, b.other = b, a
    del a, b
    assert gc.collect() >= 2
    # Reference counting still frees a frozen object that is dropped. (Not read from the
    # freeze count: other threads of the test process free frozen objects of their own.)
    gone = Node()
    heap.settle()
    assert not _tracked(gone)  # frozen
    ref = weakref.ref(gone)
    del gone
    assert ref() is None


async def test_settle_when_freezes_only_after_the_caches_are_synced(
    caplog: pytest.LogCaptureFixture,
) -> None:
    synced = asyncio.Event()
    caplog.set_level(logging.INFO, logger="coschedule.serve")
    task = asyncio.create_task(
        heap.settle_when(synced.wait(), logging.getLogger("coschedule.serve"))
    )
    await asyncio.sleep(0.05)
    assert not task.done()
    assert gc.get_freeze_count() == 0
    synced.set()
    frozen = await asyncio.wait_for(task, 5)
    assert gc.get_freeze_count() > 0
    [record] = [r for r in caplog.records if r.getMessage() == "caches synced: heap frozen"]
    assert record.name == "coschedule.serve"  # the caller's logger
    assert record.frozen_objects == frozen  # type: ignore[attr-defined]
    # (what was frozen, less the frozen objects freed since: the task, the event)
    assert record.frozen_objects >= gc.get_freeze_count()  # type: ignore[attr-defined]
