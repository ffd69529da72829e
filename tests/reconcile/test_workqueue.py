"""The work queue: de-duplication, one worker per key, delayed adds, per-key backoff."""

from __future__ import annotations

import asyncio

from coschedule.reconcile.workqueue import WorkQueue, cancel_and_wait


async def test_a_key_is_queued_once_however_often_it_is_added() -> None:
    queue = WorkQueue()
    for _ in range(5):
        queue.add("ci/a")
    queue.add("ci/b")
    assert len(queue) == 2
    assert await queue.get() == "ci/a"
    assert await queue.get() == "ci/b"
    assert len(queue) == 0


async def test_a_key_added_while_processing_runs_again_after_not_alongside() -> None:
    queue = WorkQueue()
    queue.add("ci/a")
    key = await queue.get()
    queue.add("ci/a")
    assert len(queue) == 0  # not handed to a second worker while the first holds it
    queue.done(key)
    assert len(queue) == 1
    assert await queue.get() == "ci/a"


async def test_add_after_keeps_the_sooner_timer() -> None:
    queue = WorkQueue()
    queue.add_after("ci/a", 5.0)
    queue.add_after("ci/a", 0.02)
    queue.add_after("ci/a", 3.0)
    assert await asyncio.wait_for(queue.get(), 1) == "ci/a"
    queue.cancel_timers()


async def test_retry_backs_off_exponentially_per_key_and_forget_resets() -> None:
    queue = WorkQueue(retry_base=0.01, retry_max=0.1)
    delays = [queue.retry("ci/a") for _ in range(6)]
    # Each delay is base * 2**n, capped, times a jitter in [0.8, 1.2]: checked against those
    # bounds, not against each other (two jitters can bring neighbours within 1.4x).
    for n, delay in enumerate(delays):
        nominal = min(0.1, 0.01 * 2**n)
        assert nominal * 0.8 <= delay <= nominal * 1.2, (n, delay)
    assert delays[3] > delays[0] * 4  # it does grow
    assert queue.failures("ci/a") == 6
    assert queue.failures("ci/b") == 0
    queue.forget("ci/a")
    assert queue.failures("ci/a") == 0
    assert queue.retry("ci/a") <= 0.01 * 1.2
    queue.cancel_timers()


async def test_cancel_and_wait_ends_every_task_even_one_already_done() -> None:
    async def forever() -> None:
        await asyncio.Event().wait()

    async def quick() -> None:
        return None

    running = [asyncio.create_task(forever()) for _ in range(3)]
    done = asyncio.create_task(quick())
    await done
    await cancel_and_wait([*running, done])
    assert all(task.cancelled() for task in running)
    assert done.done()
    assert not done.cancelled()


async def test_add_soon_makes_one_pass_of_a_keys_burst_of_changes() -> None:
    queue = WorkQueue()
    for _ in range(10):  # a run's pods bound one after another
        queue.add_soon("ci/a", 0.05)
    assert len(queue) == 0  # not yet: within the window
    assert await asyncio.wait_for(queue.get(), 1) == "ci/a"
    queue.done("ci/a")
    await asyncio.sleep(0.1)
    assert len(queue) == 0  # one pass for the ten, no second from a later timer

    queue.add("ci/b")
    queue.add_soon("ci/b", 0.05)  # already queued: its pass will read what is
    assert await queue.get() == "ci/b"
    queue.done("ci/b")
    await asyncio.sleep(0.1)
    assert len(queue) == 0

    queue.add_soon("ci/c", 5.0)
    queue.add("ci/c", urgent=True)  # what cannot wait does not wait
    assert await asyncio.wait_for(queue.get(), 1) == "ci/c"
    queue.cancel_timers()


async def test_back_off_re_adds_after_the_delay_of_the_callers_count() -> None:
    """A release's failures are counted apart from the key's own (which a pass's success
    resets): the delay doubles with the caller's count, with the queue's jitter and cap."""
    queue = WorkQueue(retry_base=1.0, retry_max=10.0)
    delays = [queue.back_off("ns/a", failures) for failures in (0, 1, 2, 8)]
    for delay, nominal in zip(delays, (1.0, 2.0, 4.0, 10.0), strict=True):
        assert 0.8 * nominal <= delay <= 1.2 * nominal
    assert queue.failures("ns/a") == 0  # the key's own count is the caller's business
    queue.cancel_timers()
    assert len(queue) == 0
    assert queue.back_off("ns/a", 0) > 0  # a timer again, not an add now
    assert len(queue) == 0
    queue.cancel_timers()
