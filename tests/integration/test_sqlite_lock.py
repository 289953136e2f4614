"""SQLite's write lock held by another process: writes wait, unless the store closes."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import ferryq
from ferryq.errors import StoreError
from ferryq.lanes import LaneRule
from tests.conftest import FrozenClock


async def test_a_write_waiting_for_the_lock_gives_up_when_the_store_closes(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path}/ferryq.db"
    app = ferryq.App(url)
    await app.store()  # the file exists, migrated
    other = sqlite3.connect(tmp_path / "ferryq.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        enqueue = asyncio.create_task(app.enqueue_async("some.task"))
        await asyncio.sleep(0)  # runs up to its write, which waits for the lock
        await asyncio.wait_for(app.aclose(), 10)  # returns, though the lock is still held
        with pytest.raises(StoreError, match="gave up waiting for the write lock"):
            await enqueue
    finally:
        other.execute("ROLLBACK")
        other.close()
    # Nothing was written, and the file takes writes again once the lock is free.
    assert await app.list_jobs_async() == []
    handle = await app.enqueue_async("some.task")
    assert (await app.get_job_async(handle.id)).state == "ready"
    await app.aclose()


async def test_a_write_whose_caller_left_is_not_made_once_the_lock_frees(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = ferryq.App(f"sqlite:///{tmp_path}/ferryq.db")
    store = await app.store()
    writing = threading.Event()
    write = store._db.write_here  # type: ignore[attr-defined]

    def noted_write(fn: Callable[[sqlite3.Connection], None], wakes: bool = True) -> None:
        writing.set()
        write(fn, wakes)

    monkeypatch.setattr(store._db, "write_here", noted_write)  # type: ignore[attr-defined]
    other = sqlite3.connect(tmp_path / "ferryq.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        setting = asyncio.create_task(store.lane_rule_set("default", LaneRule("t:*", 2), 0.0))
        assert await asyncio.to_thread(writing.wait, 30)  # it waits for the lock
        setting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await setting
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert await app.lane_limits_async() == []  # read after the write gave up
    await app.aclose()


async def test_a_worker_whose_claim_waits_for_the_lock_stops_within_its_bounds(
    tmp_path: Path, clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path}/ferryq.db"
    app = ferryq.App(url, clock=clock)
    handle = await app.enqueue_async("some.task", delay=10)
    store = await app.store()
    entered, left, in_flight = asyncio.Event(), asyncio.Event(), [0]
    claim = store.job_finish_and_claim

    async def noted_claim(*args: Any) -> Any:
        in_flight[0] += 1
        entered.set()
        try:
            return await claim(*args)
        finally:
            in_flight[0] -= 1
            left.set()

    monkeypatch.setattr(store, "job_finish_and_claim", noted_claim)
    worker = ferryq.Worker(app, grace=0.1, heartbeat_interval=60, handle_signals=False)
    running = asyncio.create_task(worker.run())
    await entered.wait()  # the worker runs
    while in_flight[0]:  # no claim under way as the lock is taken
        left.clear()
        await left.wait()
    # Nothing is awaited from here to the lock: no claim can start meanwhile.
    other = sqlite3.connect(tmp_path / "ferryq.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        clock.advance(20)  # the job is due: the next claim would take it
        entered.clear()
        await entered.wait()  # that claim, waiting for the lock
        worker.stop()
        await asyncio.wait_for(running, 30)  # the grace period, then 5 s for the goodbye
    finally:
        other.execute("ROLLBACK")
        other.close()
    # The claim cut off at the stop was never made, though the lock is free now.
    job = await app.get_job_async(handle.id)
    assert (job.state, job.attempts) == ("scheduled", 0)
    await app.aclose()
