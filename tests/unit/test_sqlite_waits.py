"""How the SQLite store waits for other connections' writes: it looks at ``PRAGMA
data_version`` when woken (see tests/integration/test_sqlite_wakeups.py) and every
second; where it cannot have wake-ups, it polls, often while the database is busy and
seldom while it is idle."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ferryq.store.sqlite import wake
from ferryq.store.sqlite.store import SQLiteStore
from ferryq.store.sqlite.waits import IDLE_POLL
from tests.conftest import START


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    opened = SQLiteStore(str(tmp_path / "ferryq.db"))
    await opened.open()
    yield opened
    await opened.close()


def commit_elsewhere(store: SQLiteStore) -> None:
    """A write by another connection, as another process makes it."""
    conn = sqlite3.connect(store.path, isolation_level=None)
    try:
        conn.execute("CREATE TABLE IF NOT EXISTS elsewhere (n INTEGER)")
        conn.execute("INSERT INTO elsewhere VALUES (1)")
    finally:
        conn.close()


@pytest.fixture
async def polling_store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    """A store that cannot have wake-ups: a file stands where their folder would be."""
    opened = SQLiteStore(str(tmp_path / "ferryq.db"))
    wake.folder_of(opened.path).write_text("")
    await opened.open()
    yield opened
    await opened.close()


async def test_without_wake_ups_an_idle_wait_polls_seldom(
    polling_store: SQLiteStore, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    store = polling_store
    caplog.set_level(logging.INFO, logger="ferryq.store.sqlite")
    await store.job_take("ns", "q", 1, "http:test", 30.0, START)  # what is new from here
    checks = 0
    version = store._waits.data_version

    def counted() -> int:
        nonlocal checks
        checks += 1
        return version()

    monkeypatch.setattr(store._waits, "data_version", counted)
    within = 0.5
    assert await store.wait_for_change(within, patient=True) is False
    # Every IDLE_POLL (50 ms) instead of every 5 ms: about 10 checks, not about 100.
    assert checks <= within / IDLE_POLL + 3, f"{checks} checks in {within} s of an idle wait"
    # A worker's wait stays eager: its pickup latency is the poll's.
    checks = 0
    assert await store.wait_for_change(within) is False
    assert checks > within / IDLE_POLL * 3, f"only {checks} checks in an eager wait"
    said = [r for r in caplog.records if "no wake-ups between processes" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.INFO]  # once, and not as a warning
    # A write is still seen.
    await asyncio.to_thread(commit_elsewhere, store)
    assert await asyncio.wait_for(store.wait_for_change(30.0), 5.0) is True


async def test_a_wait_with_wake_ups_looks_once_a_second(
    store: SQLiteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    await store.job_take("ns", "q", 1, "http:test", 30.0, START)
    checks = 0
    version = store._waits.data_version

    def counted() -> int:
        nonlocal checks
        checks += 1
        return version()

    monkeypatch.setattr(store._waits, "data_version", counted)
    monkeypatch.setattr(wake, "SAFETY_POLL", 0.2)
    within = 0.5
    assert await store.wait_for_change(within) is False
    assert checks <= within / wake.SAFETY_POLL + 2, f"{checks} checks in {within} s"
    # A writer that sends no wake-ups (here: not ferryq) is seen at the next look.
    await asyncio.to_thread(commit_elsewhere, store)
    assert await asyncio.wait_for(store.wait_for_change(30.0), 5.0) is True


async def test_a_wait_for_a_finish_ends_with_another_connections_commit(
    store: SQLiteStore,
) -> None:
    await store.wait_for_finish(0.0, 0.0)  # from here on, a commit is news
    waiting = asyncio.ensure_future(store.wait_for_finish(30.0, 30.0))
    await asyncio.to_thread(commit_elsewhere, store)
    await asyncio.wait_for(waiting, 25.0)  # not the 30 s it would sleep otherwise


async def test_a_wait_for_a_finish_without_commits_lasts_its_poll(store: SQLiteStore) -> None:
    await store.wait_for_finish(0.0, 0.0)
    loop = asyncio.get_running_loop()
    began = loop.time()
    await store.wait_for_finish(30.0, 0.2)
    assert 0.2 <= loop.time() - began < 30.0  # its poll, not its whole wait
