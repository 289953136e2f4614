"""The operations layer on both backends: namespaces, side effects, the one result wait.

Waits are made to depend on one sign at a time: the store's own waits are replaced
by ones that never end, so a wait that returns was ended by what the test names."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import ferryq
from ferryq import metrics
from ferryq.errors import JobNotFound
from ferryq.job import State
from ferryq.ops import Operations

WAIT = 30.0  # a bound on waits that must end by a sign, far beyond any sign


async def _forever(*_: Any, **__: Any) -> None:
    await asyncio.Event().wait()


@pytest.fixture
async def ops(app: ferryq.App) -> Operations:
    return await app.operations()


async def _job(app: ferryq.App, namespace: str = "default", lane: str | None = None) -> int:
    handle = await app.enqueue_async("t", [1], namespace=namespace, lane=lane)
    return handle.id


async def test_a_job_of_another_namespace_is_not_found_and_left_alone(
    app: ferryq.App, ops: Operations
) -> None:
    theirs = await _job(app, "tenant-b")
    assert (await ops.get(theirs, "tenant-b")).id == theirs
    for action in (ops.get, ops.explain, ops.cancel):
        with pytest.raises(JobNotFound):
            await action(theirs, "tenant-a")
    assert await ops.find(theirs, "tenant-a") is None
    assert (await ops.get(theirs)).state == State.READY  # the cancel did nothing
    await ops.cancel(theirs)
    assert await ops.respawn([theirs], namespace="tenant-a") == []
    assert await ops.purge([theirs], namespace="tenant-a") == 0
    assert (await ops.get(theirs)).state == State.CANCELLED
    assert await ops.respawn([theirs, theirs], namespace="tenant-b") == [theirs]


async def test_actions_that_can_make_jobs_ready_say_so_in_this_process(
    app: ferryq.App, ops: Operations
) -> None:
    heard: list[tuple[str | None, str | None]] = []
    app.signals.listen(lambda ns, queue: heard.append((ns, queue)))
    job_id = await _job(app, lane="post:1")
    await ops.set_lane_limit("default", "post:*", 2)
    assert len(heard) == 1
    assert await ops.clear_lane_limit("default", "post:*")
    assert not await ops.clear_lane_limit("default", "post:*")  # nothing changed: silent
    assert len(heard) == 2
    await ops.cancel(job_id)  # its lane may admit the next job
    assert await ops.respawn([job_id]) == [job_id]
    assert len(heard) == 4
    [taken] = await ops.take("default", "default", 1, "consumer", 30)
    await ops.give_back([taken])
    assert heard[-1] == ("default", "default")


def _count(counter: metrics.Counter, *labels: str) -> float:
    return counter.family.values.get(labels, [0.0])[0]


async def test_a_take_and_an_ack_count_in_the_metrics(app: ferryq.App, ops: Operations) -> None:
    claimed = _count(metrics.CLAIMED, "default", "default")
    finished = _count(metrics.FINISHED, "default", "default", "succeeded")
    await _job(app)
    [taken] = await ops.take("default", "default", 5, "consumer", 30)
    assert _count(metrics.CLAIMED, "default", "default") == claimed  # not delivered yet
    ops.delivered([taken])
    assert await ops.ack("default", "default", [taken.id, taken.id + 1000]) == [taken.id]
    assert _count(metrics.CLAIMED, "default", "default") == claimed + 1
    assert _count(metrics.FINISHED, "default", "default", "succeeded") == finished + 1


async def test_a_result_wait_is_ended_by_a_cancel_in_this_process(
    app: ferryq.App, ops: Operations, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = await ops.get(await _job(app))
    monkeypatch.setattr(ops.store, "wait_for_finish", _forever)  # no sign from the store
    waiting = asyncio.ensure_future(ops.wait_ended(job, WAIT))
    await asyncio.sleep(0)  # the wait is under way
    await (await app.operations()).cancel(job.id)  # another Operations, the same App
    ended = await asyncio.wait_for(waiting, WAIT)
    assert ended is not None and ended.state == State.CANCELLED


async def test_a_result_wait_is_ended_by_an_ack_in_this_process(
    app: ferryq.App, ops: Operations, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _job(app)
    [taken] = await ops.take("default", "default", 1, "consumer", 30)
    monkeypatch.setattr(ops.store, "wait_for_finish", _forever)
    waiting = asyncio.ensure_future(ops.wait_ended(taken, WAIT))
    await asyncio.sleep(0)
    await ops.ack("default", "default", [taken.id])
    ended = await asyncio.wait_for(waiting, WAIT)
    assert ended is not None and ended.state == State.SUCCEEDED


async def test_a_result_wait_answers_by_its_deadline_while_the_database_hangs(
    app: ferryq.App, ops: Operations, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = await ops.get(await _job(app))
    reads = 0

    async def hanging_read(job_id: int) -> None:
        nonlocal reads
        reads += 1
        await asyncio.Event().wait()

    async def at_once(within: float, poll: float) -> None:
        return None

    monkeypatch.setattr(ops.store, "wait_for_finish", at_once)
    monkeypatch.setattr(ops.store, "job_get", hanging_read)
    assert await asyncio.wait_for(ops.wait_ended(job, 0.05), WAIT) is job  # as last read
    assert reads == 1


async def test_a_result_wait_ends_at_once_when_told_to_stop(
    app: ferryq.App, ops: Operations
) -> None:
    job = await ops.get(await _job(app))
    stop = asyncio.Event()
    waiting = asyncio.ensure_future(ops.wait_ended(job, WAIT, stop=stop))
    await asyncio.sleep(0)
    stop.set()
    assert await asyncio.wait_for(waiting, WAIT) is job
    assert await ops.wait_ended(job, 0) is job  # no time to wait: as it is


async def test_a_sync_cancel_from_another_thread_ends_a_wait_on_this_loop(
    app: ferryq.App, ops: Operations, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = await ops.get(await _job(app))
    loop = asyncio.get_running_loop()
    heard: list[bool] = []
    app.signals.listen(lambda ns, queue: heard.append(asyncio.get_running_loop() is loop))
    monkeypatch.setattr(ops.store, "wait_for_finish", _forever)
    waiting = asyncio.ensure_future(ops.wait_ended(job, WAIT))
    await asyncio.sleep(0)
    # The sync API runs on the portal's loop, in another thread, on another store.
    await asyncio.to_thread(app.cancel, job.id)
    ended = await asyncio.wait_for(waiting, WAIT)
    assert ended is not None and ended.state == State.CANCELLED
    assert heard == [True]  # called on the loop it listens on


async def test_a_failing_store_wait_fails_the_result_wait_after_one_read(
    app: ferryq.App, ops: Operations, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = await ops.get(await _job(app))
    reads = 0
    read = ops.store.job_get

    async def counted_read(job_id: int) -> Any:
        nonlocal reads
        reads += 1
        return await read(job_id)

    async def broken(within: float, poll: float) -> None:
        raise OSError("the wait broke")

    monkeypatch.setattr(ops.store, "job_get", counted_read)
    monkeypatch.setattr(ops.store, "wait_for_finish", broken)
    with pytest.raises(OSError, match="the wait broke"):
        await asyncio.wait_for(ops.wait_ended(job, WAIT), WAIT)
    assert reads == 1


async def test_a_cancel_while_the_wait_reads_the_job_is_not_lost(
    app: ferryq.App, ops: Operations, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = await ops.get(await _job(app))
    read = ops.store.job_get
    canceller = await app.operations()
    reads = 0

    async def read_then_cancel(job_id: int) -> Any:
        nonlocal reads
        reads += 1
        found = await read(job_id)
        if reads == 1:  # the wait's first read saw it unfinished; now it ends
            await canceller.cancel(job_id)
        return found

    monkeypatch.setattr(ops.store, "job_get", read_then_cancel)
    monkeypatch.setattr(ops.store, "wait_for_finish", _forever)
    ended = await asyncio.wait_for(ops.wait_ended(job, WAIT), WAIT)
    assert ended is not None and ended.state == State.CANCELLED
