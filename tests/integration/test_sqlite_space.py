"""SQLite on a small disk that fills up (a 2 MiB tmpfs): writes fail with DiskFull,
one clear line, while it is full, and work again as soon as space is freed; the WAL
stays short meanwhile, so it never eats the room its own checkpoint needs."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

import ferryq
from ferryq.errors import DiskFull
from ferryq.store.base import Claimed, Finish
from tests.integration.volumes import fill, tmpfs

#: The most the WAL may hold on the small disk (SQLite's default lets it reach 4 MiB).
WAL_BOUND = 512 << 10
FULL = r"^SQLite database .*/ferryq\.db: the disk is full \((writing|opening): "


@pytest.fixture
def volume(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "volume", "2m") as folder:
        yield folder


@pytest.fixture
async def app(volume: Path) -> AsyncIterator[ferryq.App]:
    app = ferryq.App(f"sqlite:///{volume}/ferryq.db")

    @app.task(name="echo")
    def echo(value: object) -> object:
        return value

    yield app
    await app.aclose()  # before the volume is unmounted


def wal_size(volume: Path) -> int:
    wal = volume / "ferryq.db-wal"
    return wal.stat().st_size if wal.exists() else 0


async def test_writes_fail_while_the_disk_is_full_and_work_once_space_is_freed(
    app: ferryq.App, volume: Path
) -> None:
    before = await app.enqueue_async("echo", ["before"])
    filler = fill(volume)
    with pytest.raises(DiskFull, match=FULL + "database or disk is full\\)$"):
        await app.enqueue_async("echo", ["x" * 1000])
    assert (await app.get_job_async(before.id)).state == "ready"  # reads still work
    filler.unlink()
    # The next write works: the store empties the WAL first, then writes.
    await app.enqueue_async("echo", ["after"])
    # Writes go on, more than the disk holds all told, and the WAL stays short.
    store = await app.store()
    for n in range(150):
        await app.enqueue_async("echo", ["y" * 1000])
        if n % 10 == 9:
            claimed = await store.job_claim("default", ["default"], 10, "w1", time.time())
            await store.job_finish_many([succeeded(job) for job in claimed])
        assert wal_size(volume) <= WAL_BOUND
    assert len(await app.list_jobs_async(state=ferryq.State.SUCCEEDED, limit=1000)) == 150


def succeeded(job: Claimed) -> Finish:
    now = time.time()
    return Finish("succeeded", job.id, job.fence, now, now, result='"ok"')


async def test_a_worker_claims_and_completes_again_once_space_is_freed(
    app: ferryq.App, volume: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    worker = ferryq.Worker(app, concurrency=4, handle_signals=False)
    running = asyncio.create_task(worker.run())
    client = ferryq.App(app.url)  # a store of its own: the worker recovers by itself
    try:
        first = await client.enqueue_async("echo", [1])
        assert await client.result_async(first.id, timeout=10) == 1
        due = await client.enqueue_async("echo", ["due"], delay=1.0)
        filler = fill(volume)
        with pytest.raises(DiskFull):
            # A WAL that started again from its beginning still has room for a few
            # commits in the file it has: the disk is met once they are used up.
            for _ in range(WAL_BOUND // 1000):
                await client.enqueue_async("echo", ["x" * 1000])
        await full_for_the_worker(caplog, due_at=(await client.get_job_async(due.id)).run_at)
        filler.unlink()
        assert await client.result_async(due.id, timeout=60) == "due"
        # It keeps going, past what the disk could hold if the WAL grew unchecked.
        handles = [await client.enqueue_async("echo", ["z" * 1000]) for _ in range(150)]
        for handle in handles:
            assert await client.result_async(handle.id, timeout=30) == "z" * 1000
            assert wal_size(volume) <= WAL_BOUND
    finally:
        worker.stop()
        await asyncio.wait_for(running, 30)
        await client.aclose()


async def full_for_the_worker(caplog: pytest.LogCaptureFixture, due_at: float) -> None:
    """Wait until the worker's own writes (heartbeat, maintenance, claims) have met the
    full disk, and the job it cannot claim meanwhile is due."""
    deadline = time.monotonic() + 60  # a bound on a hang, not a speed
    while time.time() <= due_at or not any("DiskFull" in r.getMessage() for r in caplog.records):
        assert time.monotonic() < deadline, "the worker never wrote to the full disk"
        await asyncio.sleep(0.05)
