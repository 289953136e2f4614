"""ferryq behind a real PgBouncer in transaction mode, as a user meets it
(docs/operations.md): the pooler the tests start is the kind managed servers put in
front of PostgreSQL, and ``?pooler=transaction`` is the switch that makes the store
work through it.

The first tests prove the pooler itself (tests/pgbouncer.py): it is in transaction mode
(statements outside a transaction go to whichever server connection is free), it
refuses session settings in the startup packet, and a client that keeps no session
state (no statement cache, every statement in a transaction) works through it, and it
comes back on its port after a kill. The
others are the store's pooler mode seen from outside: an App enqueues, a worker runs the
jobs, the results come back.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import asyncpg
import psycopg
import pytest
from psycopg.rows import TupleRow

import ferryq
from ferryq.testing import drain_async
from tests.conftest import pooled_url
from tests.pgbouncer import POOL_SIZE, Bouncer
from tests.processes import Processes, python

TASKS = "tests.integration.cli_tasks:app"  # its task "echo" returns its argument


def connect(url: str, *, autocommit: bool = True) -> psycopg.Connection[TupleRow]:
    """A psycopg connection fit for a transaction pooler: it never prepares a named
    statement (those live on one server connection, and the next statement may run on
    another)."""
    return psycopg.connect(url, autocommit=autocommit, prepare_threshold=None,
                           connect_timeout=10)  # fmt: skip


def backend_pid(conn: psycopg.Connection[TupleRow]) -> int:
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    return int(row[0])


def test_the_pooler_runs_in_transaction_mode_with_a_pool_of_ten(pgbouncer: Bouncer) -> None:
    with pgbouncer.admin() as admin:
        config = {str(row[0]): str(row[1]) for row in admin.execute("SHOW CONFIG")}
    assert config["pool_mode"] == "transaction"
    assert config["default_pool_size"] == str(POOL_SIZE)
    assert config["listen_addr"] == "127.0.0.1"


def test_statements_outside_a_transaction_go_to_any_free_server_connection(
    pgbouncer_url: str,
) -> None:
    """What transaction mode means for a client: a server connection is its own for one
    transaction only. A statement in autocommit gives its connection back at once, so
    another client's transaction takes it, and the first client's next statement runs
    on another server connection (in session mode, each client would keep its own)."""
    with connect(pgbouncer_url) as first, connect(pgbouncer_url, autocommit=False) as second:
        before = backend_pid(first)
        assert backend_pid(second) == before  # BEGIN took the connection just given back
        after = backend_pid(first)  # while the transaction holds that one
        second.rollback()
    assert after != before


def test_a_setting_made_outside_a_transaction_stays_with_the_server_connection(
    pgbouncer_url: str,
) -> None:
    """Why the store keeps no session state in pooler mode: a SET stays on the server
    connection it ran on, which the next transaction of another client may get. (A
    setting of the server's own, not one PgBouncer tracks for each client, such as
    application_name, which it sets again on every hand-over.)"""
    with connect(pgbouncer_url) as first, connect(pgbouncer_url, autocommit=False) as second:
        first.execute("SET ferryq.marker = 'set-by-first'")
        row = second.execute("SELECT current_setting('ferryq.marker', true)").fetchone()
        second.rollback()
    assert row == ("set-by-first",)


async def test_the_pooler_refuses_session_settings_in_the_startup_packet(
    pgbouncer_url: str,
) -> None:
    """A managed pooler's answer to what the store sends outside pooler mode."""
    with pytest.raises(asyncpg.PostgresError, match="unsupported startup parameter"):
        await asyncpg.connect(pgbouncer_url, timeout=10,
                              server_settings={"plan_cache_mode": "force_custom_plan"})  # fmt: skip


async def test_asyncpg_without_a_statement_cache_works_in_explicit_transactions(
    pgbouncer_url: str,
) -> None:
    """asyncpg sends Parse, then Bind and Execute, in separate round trips; inside a
    transaction they reach the same server connection. Two clients at once, so the
    pool's connections are shared between them."""

    async def client(n: int) -> list[int]:
        conn = await asyncpg.connect(pgbouncer_url, statement_cache_size=0, timeout=10)
        try:
            sums = []
            for i in range(20):
                async with conn.transaction():
                    sums.append(await conn.fetchval("SELECT $1::int + $2::int", n, i))
            return sums
        finally:
            await conn.close()

    first, second = await asyncio.gather(client(0), client(100))
    assert first == list(range(20))
    assert second == [100 + i for i in range(20)]


def test_psycopg_without_prepared_statements_works_in_explicit_transactions(
    pgbouncer_url: str,
) -> None:
    with connect(pgbouncer_url) as conn:
        for i in range(10):  # past psycopg's default threshold of 5 for preparing
            with conn.transaction():
                row = conn.execute("SELECT %s::int * 2", (i,)).fetchone()
            assert row == (2 * i,)


def test_a_killed_pooler_starts_again_on_its_port(pgbouncer: Bouncer, pgbouncer_url: str) -> None:
    """What tests of a pooler that goes away build on: a client's connection dies with
    the pooler, and the pooler comes back where clients look for it."""
    port = pgbouncer.port
    with connect(pgbouncer_url) as cut_off:
        backend_pid(cut_off)
        pgbouncer.kill()
        with pytest.raises(psycopg.OperationalError):
            backend_pid(cut_off)
    with pytest.raises(psycopg.OperationalError):
        connect(pgbouncer_url)
    pgbouncer.start()
    assert pgbouncer.port == port
    with connect(pgbouncer_url) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


@pytest.fixture
async def app(pgbouncer_url: str) -> AsyncIterator[ferryq.App]:
    application = ferryq.App(pooled_url(pgbouncer_url))
    yield application
    await application.aclose()
    application.close()


def _double(app: ferryq.App) -> ferryq.Task[[int], Coroutine[Any, Any, int]]:
    @app.task(name="double")
    async def double(n: int) -> int:
        return 2 * n

    return double


async def test_an_app_in_pooler_mode_enqueues_runs_and_returns_results(
    app: ferryq.App,
) -> None:
    """More jobs than the pool has server connections, enqueued one call at a time and
    in a batch, run by a worker in burst mode with more slots than the pool."""
    double = _double(app)
    one_by_one = [await double.enqueue_async(n) for n in range(POOL_SIZE * 2)]
    batch = await double.enqueue_many_async([[n] for n in range(100, 100 + POOL_SIZE * 2)])
    worker = await drain_async(app, concurrency=POOL_SIZE * 3)
    assert worker.finished == len(one_by_one) + len(batch)
    results = [await handle.result_async(timeout=30) for handle in [*one_by_one, *batch]]
    assert results == [2 * n for n in range(POOL_SIZE * 2)] + [
        2 * n for n in range(100, 100 + POOL_SIZE * 2)
    ]


def test_sync_enqueues_through_the_pooler_alone_and_in_a_transaction(
    pgbouncer_url: str,
) -> None:
    """``task.enqueue()`` on the caller's thread (on_thread.py): a plain job's insert
    goes alone, one statement its own transaction; a lane's and a unique key's take a
    transaction (settle, the key's lock). Every job is there, the unique one once."""
    app = ferryq.App(pooled_url(pgbouncer_url))
    try:
        double = _double(app)
        plain = [double.enqueue(n) for n in range(POOL_SIZE * 2)]
        in_lane = [double.options(lane="customer:1").enqueue(n) for n in range(3)]
        first = double.options(unique_key="once").enqueue(7)
        again = double.options(unique_key="once").enqueue(7)
        assert again.id == first.id and not again.created
        ids = {job.id for job in app.list_jobs(task="double", limit=1000)}
        assert ids == {handle.id for handle in [*plain, *in_lane, first]}
    finally:
        app.close()


@pytest.mark.parametrize("driver", ["psycopg", "psycopg-async", "asyncpg"])
async def test_an_app_in_pooler_mode_enqueues_in_the_callers_transaction(
    app: ferryq.App, pgbouncer_url: str, driver: str
) -> None:
    """The application's own connection through the pooler, in its own transaction:
    the job exists only if that commits. The connection keeps no prepared statement,
    as docs/operations.md asks (psycopg's ``prepare_threshold=None``, asyncpg's
    ``statement_cache_size=0``)."""
    double = _double(app)
    await app.store()
    if driver == "psycopg":
        with connect(pgbouncer_url) as conn:
            with conn.transaction():
                kept = double.using(conn).enqueue(21)
            with conn.transaction() as transaction:
                gone = double.using(conn).enqueue(1)
                raise psycopg.Rollback(transaction)
    elif driver == "psycopg-async":
        async with await psycopg.AsyncConnection.connect(
            pgbouncer_url, autocommit=True, prepare_threshold=None, connect_timeout=10
        ) as aconn:
            async with aconn.transaction():
                kept = await double.using(aconn).enqueue_async(21)
            async with aconn.transaction() as atransaction:
                gone = await double.using(aconn).enqueue_async(1)
                raise psycopg.Rollback(atransaction)
    else:
        raw = await asyncpg.connect(pgbouncer_url, statement_cache_size=0, timeout=10)
        try:
            async with raw.transaction():
                kept = await double.using(raw).enqueue_async(21)
            rolled_back = raw.transaction()
            await rolled_back.start()
            gone = await double.using(raw).enqueue_async(1)
            await rolled_back.rollback()
        finally:
            await raw.close()
    with pytest.raises(ferryq.JobNotFound):
        await app.get_job_async(gone.id)
    await drain_async(app)
    assert await kept.result_async(timeout=30) == 42


async def test_a_worker_process_in_pooler_mode_runs_what_an_app_enqueued(
    app: ferryq.App, pgbouncer_url: str, processes: Processes
) -> None:
    """``ferryq worker --burst`` with the pooled URL in FERRYQ_URL, as a user runs it."""

    @app.task(name="echo")
    def echo(value: str) -> str:
        return value

    handles = [await echo.enqueue_async(f"job {n}") for n in range(POOL_SIZE)]
    worker = processes.start(
        python("ferryq", "worker", TASKS, "--burst", "--concurrency", str(POOL_SIZE * 2)),
        env={"FERRYQ_URL": pooled_url(pgbouncer_url)},
        name="worker",
    )
    code = await asyncio.to_thread(worker.wait)
    assert code == 0, worker.describe()
    assert [await handle.result_async(timeout=30) for handle in handles] == [
        f"job {n}" for n in range(POOL_SIZE)
    ]


# -- a URL that says otherwise than the pooler does: one line at the start, naming the fix


async def test_a_url_without_pooler_at_a_transaction_pooler_is_refused_naming_the_switch(
    pgbouncer_url: str,
) -> None:
    app = ferryq.App(pgbouncer_url)
    with pytest.raises(ferryq.StoreError, match="add pooler=transaction to the URL"):
        await app.store()
    await app.aclose()


async def test_pooler_session_at_a_transaction_pooler_is_refused_naming_the_mode(
    pgbouncer_url: str,
) -> None:
    """Its LISTENs and leadership's locks would be lost between two statements."""
    app = ferryq.App(f"{pgbouncer_url}?pooler=session")
    with pytest.raises(ferryq.StoreError, match="give pooler=transaction instead"):
        await app.store()
    await app.aclose()


def test_a_worker_whose_budget_the_pooler_refuses_exits_at_start_naming_connections(
    pgbouncer: Bouncer, pgbouncer_url: str, processes: Processes
) -> None:
    """PgBouncer's max_client_conn leaves room for fewer connections than the worker's
    budget: the worker opens them all as it starts, and stops there with one line."""
    with pgbouncer.admin() as admin:
        clients = len(admin.execute("SHOW CLIENTS").fetchall())
        admin.execute(f"SET max_client_conn = {clients + 2}")
        try:
            worker = processes.start(
                python("ferryq", "worker", TASKS, "--burst"),
                env={"FERRYQ_URL": f"{pooled_url(pgbouncer_url)}&connections=4"},
                name="worker",
            )  # fmt: skip
            code = worker.wait()
        finally:
            admin.execute("SET max_client_conn = 1000")
    errors = [line for line in worker.stderr().splitlines() if line.startswith("Error:")]
    assert code != 0 and len(errors) == 1, worker.describe()
    assert "max_client_conn" in errors[0] and "connections=2 at the least" in errors[0]
