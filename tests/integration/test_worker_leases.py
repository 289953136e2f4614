"""The worker's own hold on its leases: the order it starts jobs in, and what it does
when a job it still runs is claimed again."""

from __future__ import annotations

import asyncio
import threading

import ferryq
from ferryq.store.base import Finish
from tests.conftest import FrozenClock


async def _until(condition: object, what: str, within: float = 10.0) -> None:
    """Poll an async condition until it holds (the database offers no event for it)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not await condition():  # type: ignore[operator]
        assert loop.time() < deadline, f"not true within {within} s: {what}"
        await asyncio.sleep(0.01)


async def test_a_job_claimed_again_waits_for_its_attempt_still_running(
    app: ferryq.App, clock: FrozenClock
) -> None:
    lock = threading.Lock()
    running, peak = 0, 0
    started = {1: threading.Event(), 2: threading.Event()}
    release = threading.Event()

    @app.task(max_tries=5)
    def blocked(ctx: ferryq.Context) -> int:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        try:
            started[ctx.fence].set()
            if ctx.fence == 1:
                release.wait()  # blocked in C: an interruption lands once it returns
            return ctx.fence
        finally:
            with lock:
                running -= 1

    handle = await blocked.enqueue_async()
    worker = ferryq.Worker(app, heartbeat_interval=0.05, handle_signals=False)
    runner = asyncio.create_task(worker.run())
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, started[1].wait)
    # The leader took the worker for dead and recovered the job; it is due at once,
    # and the same worker claims it again while the first attempt still runs.
    store = await app.store()
    recovered = Finish("retry", handle.id, 1, clock.now, run_at=clock.now, order_time=clock.now,
                       error={"message": "recovered"})  # fmt: skip
    assert (await store.job_finish_many([recovered])).accepted == [handle.id]

    async def claimed_again() -> bool:
        return (await app.get_job_async(handle.id)).fence == 2

    await _until(claimed_again, "the job claimed again")
    assert not await loop.run_in_executor(None, started[2].wait, 0.3), "ran beside itself"
    assert handle.id in worker._superseded
    release.set()
    assert await handle.result_async(timeout=10) == 2
    worker.stop()
    await runner
    assert peak == 1 and not worker.active and not worker._superseded


async def test_a_one_slot_worker_starts_jobs_in_order(app: ferryq.App, clock: FrozenClock) -> None:
    ran: list[int] = []

    @app.task
    async def note(n: int) -> None:
        ran.append(n)

    # Plain enqueues and enqueues whose priorities reorder them, at one moment: the
    # order is by -priority (order_time = now - priority), then by id.
    priorities = [0] * 40 + [(n * 7919) % 40 for n in range(40)]
    for n, priority in enumerate(priorities):
        await note.options(priority=priority).enqueue_async(n)
    await ferryq.Worker(app, concurrency=1, burst=True, handle_signals=False).run()
    assert ran == sorted(range(80), key=lambda n: (-priorities[n], n))


async def test_a_one_slot_worker_starts_jobs_in_order_while_they_arrive(
    app: ferryq.App, clock: FrozenClock
) -> None:
    ran: list[int] = []

    @app.task
    async def note(n: int) -> None:
        ran.append(n)
        await asyncio.sleep(0.002)

    worker = ferryq.Worker(app, concurrency=1, handle_signals=False)
    runner = asyncio.create_task(worker.run())
    handles = [await note.enqueue_async(n) for n in range(40)]
    for handle in handles:
        await handle.result_async(timeout=20)
    worker.stop()
    await runner
    assert ran == list(range(40))


async def test_a_running_job_shows_when_its_handler_began(
    app: ferryq.App, clock: FrozenClock
) -> None:
    began = {"first": asyncio.Event(), "second": asyncio.Event()}
    go_on = {"first": asyncio.Event(), "second": asyncio.Event()}

    @app.task
    async def wait(name: str) -> None:
        began[name].set()
        await go_on[name].wait()

    await wait.enqueue_async("first")
    second = await wait.enqueue_async("second")
    worker = ferryq.Worker(app, concurrency=1, prefetch=1, heartbeat_interval=60,
                           handle_signals=False)  # fmt: skip
    runner = asyncio.create_task(worker.run())
    await began["first"].wait()

    async def prefetched() -> bool:
        return (await app.get_job_async(second.id)).state == "running"

    await _until(prefetched, "the second job claimed while the first runs")
    claimed_at = clock.now
    clock.advance(5)
    go_on["first"].set()  # the first ends; the second begins 5 s after its claim
    await began["second"].wait()
    await worker._beat()
    job = await app.get_job_async(second.id)
    assert job.state == "running"
    assert job.claimed_at == claimed_at and job.started_at == claimed_at + 5
    go_on["second"].set()
    worker.stop()
    await runner
