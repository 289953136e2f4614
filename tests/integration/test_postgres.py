"""What only the PostgreSQL backend does: enqueue in the caller's transaction,
notifications, partitioned history, clear errors for a server that is not there."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import socket
import time
import urllib.parse
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import asyncpg
import psycopg
import pytest

import ferryq
from ferryq import metrics
from ferryq.store import open_store
from ferryq.store.base import Dependencies, Dependency
from ferryq.store.postgres import connection as postgres_connection
from ferryq.store.postgres import lanes, partitions
from ferryq.store.postgres import queries as postgres_queries
from ferryq.store.postgres.connection import (
    GENERIC_PLANS,
    IDLE_IN_TRANSACTION_TIMEOUT,
    SESSION_SETTINGS,
    runner,
    transaction_with,
)
from ferryq.store.postgres.store import PostgresStore
from ferryq.store.postgres.waits import JOBS_CHANNEL
from ferryq.testing import drain_async
from ferryq.worker.producer import Producer
from tests.conformance.jobs import new_job
from tests.conftest import START
from tests.pg import PgCluster


@pytest.fixture
async def app(pg_url: str) -> AsyncIterator[ferryq.App]:
    application = ferryq.App(pg_url)
    yield application
    await application.aclose()
    application.close()


def _enqueued(queue: str) -> float:
    counts = metrics.METRICS.snapshot().get("ferryq_jobs_enqueued", [])
    return float(sum(value for labels, (value,) in counts if labels == ["default", queue]))


def _tasks(app: ferryq.App) -> ferryq.Task[[int], Coroutine[Any, Any, int]]:
    @app.task(name="double")
    async def double(n: int) -> int:
        return 2 * n

    return double


async def test_enqueue_in_a_psycopg_transaction_commits_with_it(
    app: ferryq.App, pg_url: str
) -> None:
    double = _tasks(app)
    await app.store()
    counted = _enqueued("default")
    with psycopg.connect(pg_url) as conn:
        with conn.transaction():
            kept = double.using(conn).enqueue(21)
        assert _enqueued("default") == counted + 1
        with conn.transaction() as transaction:
            gone = double.options(queue="x").using(conn).enqueue(1)
            raise psycopg.Rollback(transaction)
    assert (await app.get_job_async(kept.id)).state == "ready"
    with pytest.raises(ferryq.JobNotFound):
        await app.get_job_async(gone.id)
    await drain_async(app)
    assert await kept.result_async(timeout=5) == 42


async def test_enqueue_in_an_async_psycopg_transaction(app: ferryq.App, pg_url: str) -> None:
    double = _tasks(app)
    await app.store()
    async with await psycopg.AsyncConnection.connect(pg_url) as conn:
        async with conn.transaction():
            kept = await double.using(conn).enqueue_async(1)
        try:
            async with conn.transaction():
                gone = await double.using(conn).enqueue_async(2)
                raise RuntimeError("the application fails after enqueueing")
        except RuntimeError:
            pass
    assert (await app.get_job_async(kept.id)).state == "ready"
    with pytest.raises(ferryq.JobNotFound):
        await app.get_job_async(gone.id)


class _Around:
    """Enqueue hooks that record what they saw, and a context variable that the
    before hook sets and the after hook reads: both run in one task."""

    def __init__(self, app: ferryq.App) -> None:
        self.seen: list[tuple[list[int], str | None, str | None]] = []
        self.var: contextvars.ContextVar[str] = contextvars.ContextVar("around")
        app.hooks.before_enqueue(self.before)
        app.hooks.after_enqueue(self.after)

    def before(self, call: ferryq.Enqueue) -> None:
        call.meta["hooked"] = call.task
        self.var.set(f"set before {call.task}")

    def after(self, call: ferryq.Enqueue) -> None:
        failed = None if call.exception is None else type(call.exception).__name__
        self.seen.append((call.ids, self.var.get(None), failed))


async def test_enqueue_hooks_run_around_an_enqueue_on_the_callers_connection(
    app: ferryq.App, pg_url: str
) -> None:
    """The hooks of an enqueue on the application's own connection, sync (psycopg) and
    async (asyncpg): around the insert, in the caller's transaction, in one task."""
    double = _tasks(app)
    around = _Around(app)
    await app.store()
    with psycopg.connect(pg_url) as conn:
        with conn.transaction():
            kept = double.using(conn).enqueue(21)
        with conn.transaction() as transaction:
            gone = double.using(conn).enqueue(1)
            raise psycopg.Rollback(transaction)
        conn.close()
        with pytest.raises(psycopg.OperationalError):
            double.using(conn).enqueue(2)  # a closed connection: nothing is written
    raw = await asyncpg.connect(pg_url)
    try:
        async with raw.transaction():
            on_asyncpg = await double.using(raw).enqueue_async(3)
    finally:
        await raw.close()
    assert around.seen == [
        ([kept.id], "set before double", None),
        ([gone.id], "set before double", None),
        ([], "set before double", "OperationalError"),
        ([on_asyncpg.id], "set before double", None),
    ]
    for handle in (kept, on_asyncpg):
        assert (await app.get_job_async(handle.id)).meta == {"hooked": "double"}
    with pytest.raises(ferryq.JobNotFound):
        await app.get_job_async(gone.id)
    assert len(await app.list_jobs_async()) == 2


async def test_a_job_after_others_on_the_callers_connection_waits_for_them(
    app: ferryq.App, pg_url: str
) -> None:
    """The history's trigger that resolves dependencies is made by the first enqueue
    with dependencies, before the caller's transaction, on the sync and async paths."""
    double = _tasks(app)
    store = await app.store()
    trigger = postgres_queries.Q["dependency_trigger_exists"].sql
    first = await double.enqueue_async(1)
    with psycopg.connect(pg_url) as conn:
        assert conn.execute(trigger).fetchone() == (False,)  # never used here yet
        with conn.transaction():
            after_sync = await asyncio.to_thread(
                lambda: double.options(after=[first]).using(conn).enqueue(2)
            )
        assert conn.execute(trigger).fetchone() == (True,)
    conn = await asyncpg.connect(pg_url)
    try:
        async with conn.transaction():
            after_async = await double.options(after=[first]).using(conn).enqueue_async(3)
    finally:
        await conn.close()
    assert [(await app.get_job_async(h.id)).state for h in (after_sync, after_async)] == [
        "scheduled", "scheduled"
    ]  # fmt: skip
    await drain_async(app)
    assert [await h.result_async(timeout=5) for h in (first, after_sync, after_async)] == [2, 4, 6]
    assert await store.job_dependencies(first.id) == Dependencies(
        [], [Dependency(after_sync.id, "succeeded"), Dependency(after_async.id, "succeeded")]
    )


async def test_enqueue_in_an_asyncpg_transaction(app: ferryq.App, pg_url: str) -> None:
    double = _tasks(app)
    await app.store()
    conn = await asyncpg.connect(pg_url)
    try:
        async with conn.transaction():
            many = await double.using(conn).enqueue_many_async([(1,), (2,)])
        transaction = conn.transaction()
        await transaction.start()
        gone = await double.using(conn).enqueue_async(3)
        await transaction.rollback()
    finally:
        await conn.close()
    assert [(await app.get_job_async(h.id)).state for h in many] == ["ready", "ready"]
    with pytest.raises(ferryq.JobNotFound):
        await app.get_job_async(gone.id)


@pytest.mark.parametrize("driver", ["psycopg", "asyncpg"])
async def test_enqueue_into_a_lane_in_the_callers_transaction(
    app: ferryq.App, pg_url: str, driver: str
) -> None:
    double = _tasks(app).options(lane="post:1")
    head = await double.enqueue_async(0)
    if driver == "psycopg":
        async with await psycopg.AsyncConnection.connect(pg_url) as conn:
            async with conn.transaction():
                kept = await double.using(conn).enqueue_many_async([(1,), (2,)])
            with pytest.raises(RuntimeError):
                async with conn.transaction():
                    await double.using(conn).enqueue_async(3)
                    raise RuntimeError("the application fails after enqueueing")
    else:
        conn = await asyncpg.connect(pg_url)
        try:
            async with conn.transaction():
                kept = await double.using(conn).enqueue_many_async([(1,), (2,)])
        finally:
            await conn.close()
    assert [(await app.get_job_async(h.id)).state for h in [head, *kept]] == [
        "ready", "waiting", "waiting",
    ]  # fmt: skip
    await drain_async(app)
    assert [await h.result_async(timeout=5) for h in [head, *kept]] == [0, 2, 4]
    assert (await app.lanes_async()) == []


@pytest.mark.parametrize("driver", ["psycopg", "psycopg-async", "asyncpg"])
async def test_a_unique_key_deduplicates_on_the_callers_connection(
    app: ferryq.App, pg_url: str, driver: str
) -> None:
    double = _tasks(app).options(unique_key="daily", lane="post:1")
    first = await double.enqueue_async(1)
    if driver == "psycopg":
        with psycopg.connect(pg_url) as conn, conn.transaction():
            again = double.using(conn).enqueue_many([(2,), (3,)])
    elif driver == "psycopg-async":
        async with await psycopg.AsyncConnection.connect(pg_url) as aconn, aconn.transaction():
            again = await double.using(aconn).enqueue_many_async([(2,), (3,)])
    else:
        conn = await asyncpg.connect(pg_url)
        try:
            async with conn.transaction():
                again = await double.using(conn).enqueue_many_async([(2,), (3,)])
        finally:
            await conn.close()
    assert [(h.id, h.created) for h in again] == [(first.id, False)] * 2
    await drain_async(app)
    assert await first.result_async(timeout=5) == 2
    with psycopg.connect(pg_url) as conn, conn.transaction():
        (later,) = double.using(conn).enqueue_many([(4,)])
    assert later.created and later.id != first.id


async def test_an_enqueue_into_a_lane_waits_for_the_lanes_lock(
    app: ferryq.App, pg_url: str
) -> None:
    double = _tasks(app).options(lane="post:1")
    await app.store()
    holder = await asyncpg.connect(pg_url)
    try:
        holder_transaction = holder.transaction()
        await holder_transaction.start()
        await holder.execute("SELECT pg_advisory_xact_lock(hashtextextended('default/post:1', 11))")
        enqueue = asyncio.create_task(double.enqueue_async(1))
        # Its insert takes the lane's lock in the same statement; it must still wait.
        waiting = ("SELECT count(*) FROM pg_stat_activity"
                   " WHERE datname = current_database() AND wait_event = 'advisory'")  # fmt: skip
        for _ in range(1000):  # PostgreSQL tells no one of a lock wait: look, every 10 ms
            if await holder.fetchval(waiting):
                break
            await asyncio.sleep(0.01)
        else:
            pytest.fail("the enqueue never waited for the lane's lock")
        assert not enqueue.done()
        await holder_transaction.commit()
        handle = await enqueue
    finally:
        await holder.close()
    assert (await app.get_job_async(handle.id)).state == "ready"


async def test_a_transaction_begun_with_settings_ends_them_and_rolls_back_on_failure(
    pg_url: str,
) -> None:
    conn = await asyncpg.connect(pg_url, server_settings=SESSION_SETTINGS)
    try:
        await conn.execute("CREATE TEMP TABLE t (n int)")
        async with transaction_with(conn, GENERIC_PLANS):
            assert await conn.fetchval("SHOW plan_cache_mode") == "force_generic_plan"
            await conn.execute("INSERT INTO t VALUES (1)")
        with pytest.raises(RuntimeError):
            async with transaction_with(conn, GENERIC_PLANS):
                await conn.execute("INSERT INTO t VALUES (2)")
                raise RuntimeError("the work fails half-way")
        assert not conn.is_in_transaction()
        assert await conn.fetchval("SHOW plan_cache_mode") == "force_custom_plan"
        assert [r[0] for r in await conn.fetch("SELECT n FROM t")] == [1]
    finally:
        await conn.close()


async def test_a_frozen_transaction_is_ended_and_frees_its_lanes(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker frozen inside a transaction holds its lanes only until the server ends
    its idle session (the timeout set short here, through the URL); the frozen call,
    once it runs again, starts over on another connection, however long it was
    frozen (longer here than a call keeps retrying after losing its connection)."""
    monkeypatch.setattr(postgres_connection, "RECONNECT_SECONDS", 0.1)
    joiner = "&" if "?" in pg_url else "?"
    store = PostgresStore(f"{pg_url}{joiner}idle_in_transaction_session_timeout=300ms")
    default_store = PostgresStore(pg_url)
    runs = 0
    holding, thawed = asyncio.Event(), asyncio.Event()

    async def hold_a_lane(conn: Any) -> int:
        nonlocal runs
        runs += 1
        await lanes.lock(runner(conn), {("default", "post:1")})
        holding.set()
        await thawed.wait()  # frozen, between two statements of its transaction
        return int(await conn.fetchval("SELECT 1"))

    async def timeout_of(store: PostgresStore) -> str:
        return str(await store._db.session(
            lambda conn: conn.fetchval("SHOW idle_in_transaction_session_timeout")
        ))  # fmt: skip

    await store.open()
    await default_store.open()
    other = await asyncpg.connect(pg_url)
    try:
        assert await timeout_of(store) == "300ms"
        assert await timeout_of(default_store) == IDLE_IN_TRANSACTION_TIMEOUT
        frozen = asyncio.create_task(store._db.session(hold_a_lane))
        await holding.wait()
        async with other.transaction():  # waits for the lane until the session ends
            await asyncio.wait_for(other.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended('default/post:1', 11))"
            ), timeout=30)  # fmt: skip
        thawed.set()
        assert await frozen == 1
        assert runs == 2
    finally:
        await other.close()
        await store.close()
        await default_store.close()


async def test_a_renewal_never_waits_for_a_row_another_transaction_holds(pg_url: str) -> None:
    """A lease renewal skips a row locked elsewhere (a finish of that attempt, most
    likely) instead of waiting for it, so it is never one side of a deadlock: the
    other rows are renewed, the locked one next time."""
    store = PostgresStore(pg_url)
    await store.open()
    other = await asyncpg.connect(pg_url)
    try:
        await store.job_insert_many(new_job(START), ["[]", "[]"])
        locked, free = await store.job_claim("default", ["default"], 2, "w", START)
        held = [(locked.id, locked.fence), (free.id, free.fence)]
        async with other.transaction():
            await other.execute("SELECT 1 FROM ferryq_jobs WHERE id = $1 FOR UPDATE", locked.id)
            renewing = store.job_leases(held, [locked.id, free.id], START + 10)
            leases = await asyncio.wait_for(renewing, timeout=30)  # a hang's bound
        assert leases.extended == [free.id] and leases.lost == []
        leases = await store.job_leases(held, [locked.id], START + 11)
        assert leases.extended == [locked.id]
    finally:
        await other.close()
        await store.close()


async def test_the_wrong_kind_of_connection_is_refused(app: ferryq.App, pg_url: str) -> None:
    double = _tasks(app)
    with pytest.raises(ferryq.ConfigurationError, match="asyncpg connection or a psycopg"):
        await double.using(object()).enqueue_async(1)
    conn = await asyncpg.connect(pg_url)
    try:
        with pytest.raises(ferryq.ConfigurationError, match="enqueue_async"):
            double.using(conn).enqueue(1)
    finally:
        await conn.close()


async def test_a_notification_wakes_an_idle_worker(
    app: ferryq.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The worker looks again by itself only after an hour (its fallback is 1 s): a
    # result at all came by NOTIFY. The timeout is a bound on a hang, not a speed.
    make_producer = Producer.__init__

    def idle_for_an_hour(self: Producer, *args: Any, **kwargs: Any) -> None:
        make_producer(self, *args, **{**kwargs, "max_idle": 3600.0})

    monkeypatch.setattr(Producer, "__init__", idle_for_an_hour)
    double = _tasks(app)
    worker = ferryq.Worker(app, handle_signals=False)
    runner = asyncio.create_task(worker.run())
    try:
        for n in range(5):
            handle = await double.enqueue_async(n)
            assert await handle.result_async(timeout=60) == 2 * n
    finally:
        worker.stop()
        await runner


async def test_history_is_partitioned_by_day_and_pruned_by_partition(pg_url: str) -> None:
    store = open_store(pg_url)
    await store.open()
    day = 20_000  # 2024-10-04
    conn = await asyncpg.connect(pg_url)
    try:
        await partitions.ensure(conn, day * 86400.0)
        names = {r[0] for r in await conn.fetch(
            "SELECT relname FROM pg_class WHERE relname LIKE 'ferryq_history_p%'")}  # fmt: skip
        assert {partitions.name_of(d) for d in range(day - 1, day + 4)} <= names
        await conn.execute(
            "INSERT INTO ferryq_history (id, namespace, queue, task, args, state, run_at,"
            " order_time, ttr, max_tries, created_at, finished_at)"
            " VALUES (1, 'default', 'q', 't', '[]', 'succeeded', 0, 0, 1, 1, 0, $1)",
            day * 86400.0 + 10,
        )
        assert await store.job_get(1) is not None
        removed = await partitions.prune(conn, (day + 1) * 86400.0, 1000)
        assert removed == 1 and await store.job_get(1) is None
        gone = await conn.fetchval("SELECT to_regclass($1)", partitions.name_of(day))
        assert gone is None
    finally:
        await conn.close()
        await store.close()


async def test_a_prune_gives_way_to_a_reader_of_the_history(pg_url: str) -> None:
    # DETACH locks the history whole; waiting for a reader would hold up every
    # finish behind it, so the prune gives up after a moment and tries next round.
    day = 20_000
    store = open_store(pg_url)
    await store.open()  # migrated
    await store.close()
    conn, reader = await asyncpg.connect(pg_url), await asyncpg.connect(pg_url)
    try:
        await partitions.ensure(conn, day * 86400.0)
        reading = reader.transaction()
        await reading.start()
        await reader.fetchval("SELECT count(*) FROM ferryq_history")
        assert await partitions.prune(conn, (day + 1) * 86400.0, 1000) == 0
        assert await conn.fetchval("SELECT to_regclass($1)", partitions.name_of(day))
        await reading.rollback()
        await partitions.prune(conn, (day + 1) * 86400.0, 1000)
        assert await conn.fetchval("SELECT to_regclass($1)", partitions.name_of(day)) is None
    finally:
        await reader.close()
        await conn.close()


class _CutListen:
    """A TCP proxy on loopback in front of the real server that ends a connection
    the moment it asks to LISTEN, as a server shutting down may do."""

    def __init__(self, upstream: str) -> None:
        self.upstream = urllib.parse.urlsplit(upstream)
        self.cuts = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        netloc = self.upstream.netloc.rsplit("@", 1)[0] + f"@127.0.0.1:{port}"
        return self.upstream._replace(netloc=netloc).geturl()

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self.upstream.hostname is not None and self.upstream.port is not None
        up_reader, up_writer = await asyncio.open_connection(
            self.upstream.hostname, self.upstream.port
        )

        async def pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            while data := await source.read(65536):
                if sink is up_writer and f'LISTEN "{JOBS_CHANNEL}"'.encode() in data:
                    self.cuts += 1
                    break
                sink.write(data)
                await sink.drain()
            for end in (writer, up_writer):
                end.close()

        with contextlib.suppress(ConnectionError):
            await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))


async def test_a_connection_cut_as_it_starts_to_listen_means_polling_not_an_error(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    proxy = _CutListen(pg_url)
    store = open_store(await proxy.start())
    await store.open()
    try:
        with caplog.at_level(logging.WARNING, "ferryq.store.postgres"):
            assert await store.job_claim("default", ["default"], 10, "w", 0.0) == []
        assert proxy.cuts == 1
        assert "LISTEN for wake-ups (polling meanwhile) failed" in caplog.text
    finally:
        await store.close()
        await proxy.stop()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_a_server_that_is_down_gives_one_clear_error() -> None:
    url = f"postgresql://nobody:secret@127.0.0.1:{_free_port()}/nothing"
    app = ferryq.App(url)
    with pytest.raises(ferryq.StoreError, match="cannot connect to PostgreSQL at") as caught:
        await app.get_job_async(1)
    assert "secret" not in str(caught.value)
    app.close()


async def test_a_missing_database_gives_one_clear_error(pg_url: str) -> None:
    app = ferryq.App(pg_url.rsplit("/", 1)[0] + "/no_such_database")
    with pytest.raises(ferryq.StoreError, match='database "no_such_database" does not exist'):
        await app.get_job_async(1)
    app.close()


async def test_two_prunes_at_once_drop_each_partition_once(pg_url: str) -> None:
    """A burst's own maintenance round and its loop's (or a leader that has just lost
    its place and the next) may prune at the same moment: each partition past the
    retention is dropped by one of them, and the other passes it by."""
    stores = [open_store(pg_url), open_store(pg_url)]
    for store in stores:
        await store.open()
    try:
        far = time.time() + 30 * 86400  # every partition's day is past
        await asyncio.gather(*(store.history_prune(far, 100) for store in stores))
        conn = await asyncpg.connect(pg_url)
        try:
            left = await conn.fetch(postgres_queries.Q["history_partitions"].sql)
        finally:
            await conn.close()
        assert left == []
    finally:
        for store in stores:
            await store.close()


async def test_the_jobs_table_is_vacuumed_by_a_number_of_dead_rows(pg_empty_url: str) -> None:
    """Migration 0014 (docs/operations.md, "Vacuum and bloat"): ferryq_jobs is vacuumed
    once 1,000 of its rows are dead, whatever its size; no other table has options."""
    store = open_store(pg_empty_url)
    await store.open()
    await store.close()
    conn = await asyncpg.connect(pg_empty_url)
    try:
        rows = await conn.fetch(
            "SELECT relname, reloptions FROM pg_class"
            " WHERE relname LIKE 'ferryq%' AND reloptions IS NOT NULL"
        )
    finally:
        await conn.close()
    assert {row["relname"]: sorted(row["reloptions"]) for row in rows} == {
        "ferryq_jobs": ["autovacuum_vacuum_scale_factor=0", "autovacuum_vacuum_threshold=1000"]
    }


async def test_a_connection_to_another_database_or_in_a_failed_transaction_is_refused(
    app: ferryq.App, pg_url: str, pg_empty_url: str
) -> None:
    """Checked before anything is written: the database the connection reaches (once per
    connection), and a transaction that a statement failed, which needs a rollback."""
    double = _tasks(app)
    refused = pytest.raises(ferryq.ConfigurationError, match="another server or database")
    with psycopg.connect(pg_empty_url) as other, other.transaction(), refused:
        double.using(other).enqueue(1)
    other_async = await asyncpg.connect(pg_empty_url)
    conn = await asyncpg.connect(pg_url)
    try:
        with pytest.raises(ferryq.ConfigurationError, match="another server or database"):
            async with other_async.transaction():
                await double.using(other_async).enqueue_async(1)
        with pytest.raises(ferryq.ConfigurationError, match=r"failed.*roll it back"):
            async with conn.transaction():
                with contextlib.suppress(asyncpg.DivisionByZeroError):
                    await conn.execute("SELECT 1 / 0")
                await double.using(conn).enqueue_async(1)
    finally:
        await other_async.close()
        await conn.close()
    assert await app.list_jobs_async(task="double") == []


async def test_enqueue_on_a_pool_connection_in_a_time_zone_of_its_own(
    app: ferryq.App, pg_url: str
) -> None:
    """An asyncpg pool's connection (a proxy, new at each acquire) and sessions whose
    TimeZone is not the store's (Django sets UTC): the same database all the same."""
    double = _tasks(app)
    pool = await asyncpg.create_pool(pg_url, min_size=1, max_size=1)
    try:
        for zone in ("Asia/Tokyo", "America/New_York"):
            async with pool.acquire() as conn, conn.transaction():
                await conn.execute(f"SET TIME ZONE '{zone}'")
                await double.using(conn).enqueue_async(1)
    finally:
        await pool.close()
    with (
        psycopg.connect(pg_url, options="-c TimeZone=Pacific/Auckland") as conn,
        conn.transaction(),
    ):
        double.using(conn).enqueue(2)
    assert sorted(job.args for job in await app.list_jobs_async(task="double")) == [[1], [1], [2]]


def test_the_apps_database_is_known_again_after_a_server_restart(
    pg_cluster: PgCluster, pg_url: str
) -> None:
    """The store reads its database's identity once; a connection made after a restart
    reports the server's new start time, and the store reads it again before refusing."""
    if not pg_cluster.can_restart:
        pytest.skip("FERRYQ_TEST_PG_URL is a server the tests may not restart")
    app = ferryq.App(pg_url)
    try:
        double = _tasks(app)
        with psycopg.connect(pg_url) as conn, conn.transaction():
            double.using(conn).enqueue(1)
        pg_cluster.restart()
        with psycopg.connect(pg_url) as conn, conn.transaction():
            double.using(conn).enqueue(2)
        assert sorted(job.args for job in app.list_jobs(task="double")) == [[1], [2]]
    finally:
        app.close()
