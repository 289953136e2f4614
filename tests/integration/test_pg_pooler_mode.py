"""The PostgreSQL store's pooler modes against the plain server (their code paths must
work there too; tests/integration/test_pooler.py runs them through a real PgBouncer):
the direct URL's check, wake-ups by LISTEN on it or by polling, the lease row of
leadership, ``pooler=session``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest

from ferryq.errors import StoreError
from ferryq.store import Store, open_store
from ferryq.store.postgres.connection import transaction_begun
from ferryq.store.postgres.store import PostgresStore
from ferryq.store.postgres.waits import Listener, Poller
from tests.conformance.jobs import NS, claim_one, insert
from tests.conftest import START, pooled_url


@pytest.fixture
async def pooled(pg_url: str) -> AsyncIterator[PostgresStore]:
    store = open_store(pooled_url(pg_url))
    assert isinstance(store, PostgresStore)
    await store.open()
    yield store
    await store.close()


async def _wakes_on_an_enqueue(waiting: Store, writer: Store, *, only_by_it: bool) -> None:
    """``only_by_it``: no wake-up before the enqueue. A poll may wake without one: any
    write on the server counts, another database's too (the next test's, made ahead)."""
    await waiting.job_claim(NS, ["default"], 1, "w1", START)  # what it saw
    if only_by_it:
        assert await waiting.wait_for_change(0.01) is False
    wait = asyncio.ensure_future(waiting.wait_for_change(30.0))
    await insert(writer, START)
    assert await asyncio.wait_for(wait, 30.0) is True


async def test_without_a_direct_url_the_waits_poll(pooled: PostgresStore, pg_url: str) -> None:
    writer = open_store(pooled_url(pg_url))
    await writer.open()
    try:
        await _wakes_on_an_enqueue(pooled, writer, only_by_it=False)
        assert isinstance(pooled._waits.listener, Poller)
    finally:
        await writer.close()


async def test_a_direct_url_carries_listen(pg_url: str) -> None:
    store = open_store(pooled_url(pg_url), direct_url=pg_url)
    writer = open_store(pooled_url(pg_url))
    await store.open()
    await writer.open()
    try:
        await _wakes_on_an_enqueue(store, writer, only_by_it=True)
        assert isinstance(store, PostgresStore) and isinstance(store._waits.listener, Listener)
    finally:
        await writer.close()
        await store.close()


async def test_a_direct_url_to_another_database_stops_the_store_at_start(
    pg_url: str, pg_empty_url: str
) -> None:
    store = open_store(pooled_url(pg_url), direct_url=pg_empty_url)
    with pytest.raises(StoreError, match=r"reaches database .* of another server or database"):
        await store.open()


async def test_a_direct_url_that_names_a_pooler_is_refused(pg_url: str) -> None:
    store = open_store(pooled_url(pg_url), direct_url=pooled_url(pg_url))
    with pytest.raises(StoreError, match="names a pooler"):
        await store.open()


async def test_an_unknown_pooler_stops_the_app_at_start(pg_url: str) -> None:
    import ferryq

    app = ferryq.App(f"{pg_url}?pooler=pgbouncer")
    try:
        with pytest.raises(StoreError, match="use pooler=transaction"):
            await app.store()
    finally:
        app.close()


async def test_leadership_is_a_lease_row_behind_a_transaction_pooler(
    pooled: PostgresStore, pg_url: str
) -> None:
    assert await pooled.leader_acquire("maintenance", "a", 5.0, START)
    with psycopg.connect(pg_url) as conn:
        rows = conn.execute("SELECT name, holder, expires_at FROM ferryq_leaders").fetchall()
        assert rows == [("maintenance", "a", START + 5.0)]
        # Held by its session? None: nothing outlives a transaction.
        locks = conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'")
        assert locks.fetchone() == (0,)
    # Renewed only once a third of its time has gone: a read until then.
    assert await pooled.leader_acquire("maintenance", "a", 5.0, START + 1.0)
    assert await pooled.leader_acquire("maintenance", "a", 5.0, START + 2.0)
    with psycopg.connect(pg_url) as conn:
        expires = conn.execute("SELECT expires_at FROM ferryq_leaders").fetchone()
        assert expires == (START + 7.0,)
    await pooled.leader_release("maintenance", "a")
    assert await pooled.leader_acquire("maintenance", "b", 5.0, START + 3.0)


async def test_session_mode_sets_the_settings_once_connected(pg_url: str) -> None:
    store = open_store(f"{pg_url}?pooler=session&lock_timeout=7s")
    assert isinstance(store, PostgresStore)
    await store.open()
    try:
        job_id = await insert(store, START)
        assert (await claim_one(store, START)).id == job_id

        async def settings(conn: object) -> list[str]:
            rows = await conn.fetch(  # type: ignore[attr-defined]
                "SELECT current_setting('plan_cache_mode'), current_setting('lock_timeout')"
            )
            return list(rows[0])

        assert await store._db.session(settings, transaction=False) == ["force_custom_plan", "7s"]
    finally:
        await store.close()


@pytest.fixture
async def complaints() -> AsyncIterator[list[dict[str, Any]]]:
    """What reaches the event loop's exception handler (asyncpg's complaints: logged
    there as errors)."""
    loop = asyncio.get_running_loop()
    seen: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: seen.append(context))
    yield seen
    loop.set_exception_handler(None)


async def _until_running(pg_url: str, statement: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as watcher:
        query = "SELECT count(*) FROM pg_stat_activity WHERE query = %s AND state = 'active'"
        for _ in range(3000):  # PostgreSQL tells no one a statement runs: look, every 10 ms
            if watcher.execute(query, (statement,)).fetchone() == (1,):
                return
            await asyncio.sleep(0.01)
    pytest.fail(f"{statement!r} never ran")


async def _one(conn: Any) -> object:
    return await conn.fetchval("SELECT $1::int", 1)


@pytest.mark.parametrize("where", ["in its statement", "as it begins"])
async def test_a_call_cancelled_mid_transaction_ends_it_without_an_error(
    pooled: PostgresStore, pg_url: str, complaints: list[dict[str, Any]], where: str
) -> None:
    """A call cancelled while its transaction runs or begins (a worker stopping, a wait
    given up) leaves none open: its connection goes back to the pool without asyncpg's
    complaint, "Resetting connection with an active transaction", and serves the next
    call. A transaction pooler's begins with a statement of its own (``BEGIN; SET
    LOCAL …``), which a slow statement stands for here."""
    assert pooled._db.pool is not None
    slow = "SELECT pg_sleep(60)"

    async def call() -> None:
        assert pooled._db.pool is not None
        async with pooled._db.pool.acquire() as conn:
            if where == "as it begins":
                async with transaction_begun(conn, f"BEGIN; {slow}"):
                    pass
            else:
                async with transaction_begun(conn, "BEGIN"):
                    await conn.fetchval(slow)

    running = asyncio.ensure_future(call())
    await _until_running(pg_url, f"BEGIN; {slow}" if where == "as it begins" else slow)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert await pooled._db.session(_one) == 1
    assert not complaints, complaints
