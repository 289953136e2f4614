"""Wake-ups between SQLite stores: a waiting store binds a socket beside the database,
and other stores' commits wake it, across processes, without polling.

Real processes on a real file. Where a wait must be ended by a wake-up and not by the
safety poll, the poll is pushed out of reach (``SAFETY_POLL``) in the waiting process.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

import ferryq
from ferryq.store.sqlite import wake
from ferryq.store.sqlite.store import SQLiteStore
from tests.conformance.jobs import NS, new_job, succeed
from tests.conftest import START
from tests.integration.volumes import WITHOUT_OVERRIDE, require_setpriv
from tests.processes import START_SECONDS, WORKER_STARTED, Process, Processes, python, wait_until

TASKS = "tests.integration.cli_tasks:app"
pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc, binds Unix sockets"
)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "ferryq.db"


@pytest.fixture
def no_safety_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    """Waits in this process end by a wake-up or not at all."""
    monkeypatch.setattr(wake, "SAFETY_POLL", 3600.0)


@pytest.fixture
async def stores(db: Path) -> AsyncIterator[Callable[[], SQLiteStore]]:
    opened: list[SQLiteStore] = []

    def store() -> SQLiteStore:
        made = SQLiteStore(str(db))
        opened.append(made)
        return made

    yield store
    for made in opened:
        await made.close()


def sockets(db: Path) -> list[str]:
    folder = wake.folder_of(db)
    return sorted(os.listdir(folder)) if folder.exists() else []


def peer(processes: Processes, command: str, db: Path, *prefix: str) -> Process:
    """Another process on the file: tests/integration/wake_peer.py's ``command``."""
    return processes.start([*prefix, *python("tests.integration.wake_peer", command,
                                              f"sqlite:///{db}")])  # fmt: skip


def counting_checks(store: SQLiteStore, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Each look at ``PRAGMA data_version`` by ``store``, from here on."""
    checks: list[int] = []
    look = store._waits.data_version

    def counted() -> int:
        checks.append(version := look())
        return version

    monkeypatch.setattr(store._waits, "data_version", counted)
    return checks


async def enqueue(store: SQLiteStore) -> None:
    await store.job_insert_many(new_job(START), ["[]"])


# -- across processes ----------------------------------------------------------------


async def test_a_wait_is_woken_by_another_process_without_polling(
    stores: Callable[[], SQLiteStore], db: Path, monkeypatch: pytest.MonkeyPatch,
    no_safety_poll: None, processes: Processes,
) -> None:  # fmt: skip
    store = stores()
    await store.open()
    await store.job_take(NS, "default", 1, "http:test", 30.0, START)  # what is new from here
    checks = counting_checks(store, monkeypatch)
    waiting = asyncio.ensure_future(store.wait_for_change(600.0, patient=True))
    await asyncio.sleep(0)  # the wait has begun
    writer = peer(processes, "enqueue", db)
    assert await asyncio.to_thread(writer.wait) == 0, writer.describe()
    assert await asyncio.wait_for(waiting, 60.0) is True
    # One look as the wait began, one after the wake-up: no polling in between, while
    # the other process started, imported ferryq, migrated and enqueued.
    assert len(checks) <= 3, f"{len(checks)} looks at data_version"


def test_an_idle_worker_costs_almost_no_cpu(db: Path, processes: Processes) -> None:
    """Under 1% of a core, counted in CPU time (not wall time): polling every 5 ms
    cost about 4%, and an idle worker uses about 0.35% on a quiet machine (on a loaded
    one, with caches cold, up to 0.51% was seen)."""
    url = f"sqlite:///{db}"
    ferryq.App(url).migrate()
    worker = processes.start(python("ferryq", "worker", TASKS), env={"FERRYQ_URL": url})
    worker.wait_for(WORKER_STARTED)
    wait_until(lambda: leader_held(db), within=START_SECONDS, what="the leadership taken")
    window = 6.0  # started, then idle
    used = cpu_seconds(worker.pid)
    time.sleep(window)  # the span measured, not a wait for anything
    used = cpu_seconds(worker.pid) - used
    assert worker.stop() == 0, worker.describe()
    assert used < 0.01 * window, f"{used * 1000:.1f} ms of CPU in {window} s idle"


def test_a_dead_processs_socket_is_removed_by_the_next_write(
    db: Path, processes: Processes
) -> None:
    app = ferryq.App(f"sqlite:///{db}")
    app.migrate()
    try:
        vanished = peer(processes, "vanish", db)
        assert vanished.wait() == 0, vanished.describe()
        assert len(left := sockets(db)) == 1, "a killed process leaves its socket behind"
        app.enqueue("t")  # the commit's wake-up finds no one there
        assert sockets(db) == [], f"{left} was not removed"
    finally:
        app.close()


def test_a_read_only_folder_falls_back_to_polling(tmp_path: Path, processes: Processes) -> None:
    """The database's folder is not writable: its -wal and -shm files are there
    already, but the wake-up folder cannot be made. The waiting process (run without
    root's power over file modes) says so once and polls; a write still wakes it."""
    require_setpriv()
    folder = tmp_path / "data"
    folder.mkdir()
    db = folder / "ferryq.db"
    app = ferryq.App(f"sqlite:///{db}")
    app.migrate()
    keep = sqlite3.connect(db)  # keeps -wal and -shm while the folder is read-only
    keep.execute("SELECT 1 FROM ferryq_jobs").fetchall()
    folder.chmod(0o555)
    try:
        waiter = peer(processes, "wait", db, *WITHOUT_OVERRIDE)
        waiter.wait_for("waiting\n", stream="stdout")
        app.enqueue("t")
        assert waiter.wait() == 0, waiter.describe()
        seen = json.loads(waiter.stdout().removeprefix("waiting\n"))
        assert seen["woken"] is True and seen["bell"] is False
        assert [m for m in seen["log"] if "no wake-ups between processes" in m] != []
        assert not wake.folder_of(db).exists()
    finally:
        folder.chmod(0o755)
        keep.close()
        app.close()


# -- in one process: each store has its own socket -----------------------------------


async def test_stores_in_one_process_wake_each_other(
    stores: Callable[[], SQLiteStore], no_safety_poll: None
) -> None:
    waiter, writer = stores(), stores()
    await waiter.open()
    await writer.open()
    await waiter.job_take(NS, "default", 1, "http:test", 30.0, START)
    waiting = asyncio.ensure_future(waiter.wait_for_change(600.0))
    await asyncio.sleep(0)
    await enqueue(writer)  # an async enqueue: the quick commit on this thread
    assert await asyncio.wait_for(waiting, 30.0) is True
    await waiter.job_take(NS, "default", 1, "http:test", 30.0, START)
    waiting = asyncio.ensure_future(waiter.wait_for_change(600.0))
    await asyncio.sleep(0)
    await asyncio.to_thread(writer.job_insert_blocking, new_job(START), ["[]"])  # a sync enqueue
    assert await asyncio.wait_for(waiting, 30.0) is True


async def test_a_stores_own_write_wakes_its_own_wait(
    stores: Callable[[], SQLiteStore], no_safety_poll: None
) -> None:
    """A worker and result waits may share one store: its own finishes wake them."""
    store = stores()
    await store.open()
    await enqueue(store)
    claimed = await store.job_claim(NS, ["default"], 1, "w1", START)
    await store.wait_for_finish(0.0, 0.0)  # from here on, a commit is news
    waiting = asyncio.ensure_future(store.wait_for_finish(600.0, 600.0))
    await asyncio.sleep(0)
    await store.job_finish_many([succeed(claimed[0], START)])
    await asyncio.wait_for(waiting, 30.0)


async def test_heartbeats_wake_no_one(
    stores: Callable[[], SQLiteStore], db: Path, no_safety_poll: None
) -> None:
    waiter, writer = stores(), stores()
    await waiter.open()
    await writer.open()
    await waiter.job_take(NS, "default", 1, "http:test", 30.0, START)
    waiting = asyncio.ensure_future(waiter.wait_for_change(600.0))
    await asyncio.sleep(0)
    await writer.leader_acquire("maintenance", "w2", 5.0, START)
    await writer.leader_acquire("maintenance", "w2", 5.0, START + 1)
    done, _ = await asyncio.wait([waiting], timeout=0.2)
    assert not done, "a leadership renewal woke a waiting store"
    await enqueue(writer)
    assert await asyncio.wait_for(waiting, 30.0) is True


async def test_a_socket_bound_just_after_a_write_is_woken_by_the_next(
    stores: Callable[[], SQLiteStore], no_safety_poll: None
) -> None:
    """File-system time stamps are coarse: a socket bound in the same tick as the
    writer's last look at the folder must not be missed."""
    writer = stores()
    await writer.open()
    for _ in range(20):
        await enqueue(writer)  # the writer lists the folder
        waiter = stores()
        await waiter.open()
        await waiter.job_take(NS, "nothing", 1, "http:test", 30.0, START)
        waiting = asyncio.ensure_future(waiter.wait_for_change(600.0))
        await asyncio.sleep(0)  # its socket is bound now, likely in the same tick
        await enqueue(writer)
        assert await asyncio.wait_for(waiting, 30.0) is True
        await waiter.close()


async def test_a_socket_path_too_long_for_an_address_is_reached_all_the_same(
    tmp_path: Path, no_safety_poll: None
) -> None:
    folder = tmp_path / ("deep-" * 12) / ("er-" * 12)
    folder.mkdir(parents=True)
    db = folder / "ferryq.db"
    waiter, writer = SQLiteStore(str(db)), SQLiteStore(str(db))
    await waiter.open()
    await writer.open()
    try:
        await waiter.job_take(NS, "default", 1, "http:test", 30.0, START)
        waiting = asyncio.ensure_future(waiter.wait_for_change(600.0))
        await asyncio.sleep(0)
        (name,) = sockets(db)
        assert len(os.fsencode(wake.folder_of(db) / name)) > 108
        await enqueue(writer)
        assert await asyncio.wait_for(waiting, 30.0) is True
    finally:
        await waiter.close()
        await writer.close()
    assert sockets(db) == []


async def test_closing_removes_the_socket(stores: Callable[[], SQLiteStore], db: Path) -> None:
    store = stores()
    await store.open()
    await store.wait_for_change(0.0)
    assert len(sockets(db)) == 1
    await store.close()
    assert sockets(db) == []


# -- helpers -------------------------------------------------------------------------


def leader_held(db: Path) -> bool:
    conn = sqlite3.connect(db)
    try:
        held: int = conn.execute("SELECT count(*) FROM ferryq_leaders").fetchone()[0]
        return held > 0
    except sqlite3.OperationalError:
        return False
    finally:
        conn.close()


def cpu_seconds(pid: int) -> float:
    """CPU time of every thread of ``pid``, in ns precision where the kernel keeps
    scheduler statistics, else in clock ticks (utime + stime)."""
    try:
        return sum(int(t.joinpath("schedstat").read_text().split()[0])
                   for t in threads(pid)) / 1e9  # fmt: skip
    except (OSError, ValueError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def threads(pid: int) -> Iterator[Path]:
    return Path(f"/proc/{pid}/task").iterdir()
