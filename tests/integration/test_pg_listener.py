"""PostgreSQL's LISTEN connection survives a wait cancelled while it is being made."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest

from ferryq.store import open_store
from ferryq.store.postgres.store import PostgresStore
from ferryq.store.postgres.waits import Listener


async def test_a_wait_cancelled_while_the_listener_connects_leaves_no_deaf_listener(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(pg_url)
    assert isinstance(store, PostgresStore)
    await store.open()
    try:
        adding = asyncio.Event()
        real_add = asyncpg.connection.Connection.add_listener

        async def stalled_add(conn: Any, channel: str, callback: Any) -> None:
            adding.set()
            await asyncio.Event().wait()  # until cancelled

        monkeypatch.setattr(asyncpg.connection.Connection, "add_listener", stalled_add)
        wait = asyncio.ensure_future(store.wait_for_finish(30.0, 30.0))
        await asyncio.wait_for(adding.wait(), 30)
        wait.cancel()
        with pytest.raises(asyncio.CancelledError):
            await wait
        monkeypatch.setattr(asyncpg.connection.Connection, "add_listener", real_add)

        listener = store._waits.listener
        assert isinstance(listener, Listener) and listener.conn is None  # not a deaf connection
        assert await listener.ready()  # listens again, for real
        assert listener.conn is not None
        listener.done.clear()
        other = await asyncpg.connect(pg_url)
        try:
            await other.execute("NOTIFY ferryq_done")
        finally:
            await other.close()
        await asyncio.wait_for(listener.done.wait(), 30)
    finally:
        await store.close()
