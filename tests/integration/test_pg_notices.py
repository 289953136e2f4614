"""The enqueues' wake-up NOTIFYs on PostgreSQL (ferryq.store.postgres.notices): one per
queue at most every NOTIFY_EVERY from a store, and one owed, after its commit, to every
enqueue that did not send its own. The store's clock is held still, so which enqueue
notifies is decided by the rule alone, never by how fast the machine is."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest

from ferryq.store import open_store
from ferryq.store.postgres import notices
from ferryq.store.postgres.store import PostgresStore
from ferryq.store.postgres.waits import JOBS_CHANNEL
from tests.conformance.jobs import NS, insert, new_job
from tests.conftest import START

MARK = "a mark sent after everything else"


class Heard:
    """The ``ferryq_jobs`` notifications a connection of its own hears, in order."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self.payloads: asyncio.Queue[str] = asyncio.Queue()

    def hear(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        self.payloads.put_nowait(payload)

    async def next(self) -> str:
        return await asyncio.wait_for(self.payloads.get(), 60.0)  # a bound on a hang

    async def until_mark(self) -> list[str]:
        """What was heard up to now: a NOTIFY committed after everything else arrives
        after everything committed before it."""
        await self.conn.execute(f"NOTIFY {JOBS_CHANNEL}, '{MARK}'")
        heard = []
        while (payload := await self.next()) != MARK:
            heard.append(payload)
        return heard


@pytest.fixture
async def heard(pg_url: str) -> AsyncIterator[Heard]:
    conn = await asyncpg.connect(pg_url)
    listening = Heard(conn)
    await conn.add_listener(JOBS_CHANNEL, listening.hear)
    yield listening
    await conn.close()


async def _store(url: str) -> PostgresStore:
    store = open_store(url)
    assert isinstance(store, PostgresStore)
    await store.open()
    store._inserts.notices.clock = lambda: 100.0  # held still
    return store


async def test_enqueues_in_a_burst_send_one_notify_and_owe_one_sent_at_close(
    pg_url: str, heard: Heard, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(notices, "NOTIFY_EVERY", 3600.0)  # the owed one waits for close
    store = await _store(pg_url)
    try:
        await insert(store, START)
        assert await heard.next() == "default"
        await insert(store, START)
        await insert(store, START, queue="other")  # another queue's: its own NOTIFY
        assert await heard.next() == "other"
        await insert(store, START, queue="other")
        await insert(store, START)
        assert await heard.until_mark() == []  # owed, not sent
    finally:
        await store.close()
    assert sorted(await heard.until_mark()) == ["default", "other"]


@pytest.mark.parametrize("blocking", [False, True], ids=["async", "sync"])
async def test_an_enqueue_that_did_not_notify_wakes_a_waiting_store(
    pg_url: str, heard: Heard, blocking: bool
) -> None:
    writer = await _store(pg_url)
    waiting = await _store(pg_url)
    try:
        await insert(writer, START)  # notifies: the queue was not notified before
        assert await heard.next() == "default"
        await waiting.job_claim(NS, ["default"], 1, "w1", START)  # what it saw
        wait = asyncio.ensure_future(waiting.wait_for_change(60.0))
        if blocking:  # on the caller's own connection, the NOTIFY owed from its thread
            job = new_job(START)
            await asyncio.to_thread(writer.job_insert_blocking, job, ["[]"])
        else:
            await insert(writer, START)
        assert await asyncio.wait_for(wait, 60.0) is True
        assert await heard.until_mark() == ["default"]  # the owed one, not the insert's
    finally:
        await waiting.close()
        await writer.close()
