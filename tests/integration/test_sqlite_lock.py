"""SQLite's write lock held by another process: writes wait, unless the store closes."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

import ferryq
from ferryq.errors import StoreError


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
