"""Enqueue calls made at the same time share commits (``ferryq.store.coalesce``): each
call still gets exactly its own jobs, once they are committed, and its own failure.

To make calls meet deterministically, a test holds up the commit under way: on SQLite
it holds the store's connection lock, on PostgreSQL a lock on the jobs table taken by
another session. The calls that arrive meanwhile must then go in together.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import asyncpg
import pytest

from ferryq._portal import Portal
from ferryq.errors import StoreError
from ferryq.store import Store, open_store
from ferryq.store.base import Inserted, JobFilter, NewJob
from ferryq.store.postgres.store import PostgresStore
from ferryq.store.sqlite.store import SQLiteStore
from tests.conformance.jobs import new_job
from tests.conftest import START, server_url

NOW = START


@pytest.fixture
async def durable(backend_url: str) -> AsyncIterator[Store]:
    """The store at its durable setting: on SQLite ``synchronous=full``, where an async
    call cannot commit on the event loop's thread and every call waits for a commit."""
    url = f"{backend_url}?synchronous=full" if backend_url.startswith("sqlite") else backend_url
    opened = open_store(url)
    await opened.open()
    yield opened
    await opened.close()


class Commits:
    """Counts the transactions that insert jobs."""

    def __init__(self, store: Store) -> None:
        self.count = 0
        if isinstance(store, SQLiteStore):
            assert store._db.conn is not None
            store._db.conn.set_trace_callback(self._sqlite)
        else:
            assert isinstance(store, PostgresStore)
            insert = store._inserts._commit

            async def counted(batch: Any) -> None:
                self.count += 1
                await insert(batch)

            store._inserts._commit = counted  # type: ignore[method-assign]

    def _sqlite(self, statement: str) -> None:
        self.count += statement == "COMMIT"


@contextlib.asynccontextmanager
async def held_up(store: Store, backend_url: str) -> AsyncIterator[Callable[[int], Any]]:
    """Commits wait while the block runs; it gets a function that waits until ``n``
    calls are queued behind the one under way."""

    async def queued(n: int) -> None:
        for _ in range(30_000):  # 30 s at most
            if store._inserts.queued >= n:  # type: ignore[attr-defined]
                return
            await asyncio.sleep(0.001)
        raise AssertionError(f"{n} calls never queued")

    if isinstance(store, SQLiteStore):
        store._db.lock.acquire()
        try:
            yield queued
        finally:
            store._db.lock.release()
        return
    blocker = await asyncpg.connect(server_url(backend_url))
    transaction = blocker.transaction()
    await transaction.start()
    await blocker.execute("LOCK TABLE ferryq_jobs IN SHARE MODE")
    try:
        yield queued
    finally:
        await transaction.rollback()
        await blocker.close()


def jobs(count: int) -> list[tuple[NewJob, list[str]]]:
    """Calls that differ in every column a call can set, some of several jobs."""
    return [
        (new_job(NOW, task=f"t{n}", queue=f"q{n % 3}", priority=float(n), ttr=10.0 + n),
         [f"[{n}, {k}]" for k in range(1 + n % 3)])
        for n in range(count)
    ]  # fmt: skip


async def assert_own_jobs(
    store: Store, calls: list[tuple[NewJob, list[str]]], results: list[list[Inserted]]
) -> None:
    ids = [row.id for rows in results for row in rows]
    assert len(set(ids)) == len(ids)
    for (job, args), rows in zip(calls, results, strict=True):
        assert len(rows) == len(args) and all(row.created for row in rows)
        for row, arg in zip(rows, args, strict=True):
            got = await store.job_get(row.id)
            assert got is not None
            assert (got.task, got.queue, got.priority, got.ttr) == (
                job.task, job.queue, job.priority, job.ttr)  # fmt: skip
            assert got.args == json.loads(arg)


async def test_calls_made_at_once_each_get_their_own_jobs(durable: Store) -> None:
    calls = jobs(120)
    results = await asyncio.gather(*(durable.job_insert_many(job, a) for job, a in calls))
    await assert_own_jobs(durable, calls, list(results))


async def test_calls_that_arrive_during_a_commit_share_the_next(
    durable: Store, backend_url: str
) -> None:
    calls = jobs(40)
    commits = Commits(durable)
    async with held_up(durable, backend_url) as queued:
        first = asyncio.ensure_future(durable.job_insert_many(*calls[0]))
        await queued(0 if isinstance(durable, PostgresStore) else 1)
        await asyncio.sleep(0)  # the first call is under way (PostgreSQL) or queued
        rest = [asyncio.ensure_future(durable.job_insert_many(job, a)) for job, a in calls[1:]]
        await queued(len(calls) - 1 if isinstance(durable, PostgresStore) else len(calls))
    results = [await first, *[await call for call in rest]]
    # SQLite: the 40 calls queued behind the held lock go in one commit; PostgreSQL:
    # the first call's commit, held up, then the 39 that queued behind it.
    assert commits.count == (1 if isinstance(durable, SQLiteStore) else 2)
    await assert_own_jobs(durable, calls, results)


async def test_a_job_the_database_refuses_fails_its_own_call_only(
    durable: Store, backend_url: str
) -> None:
    good = jobs(6)
    # Past what the column takes (SQLite: a 64-bit integer), or not JSON (PostgreSQL's
    # jsonb): neither can be written, and no validation before the store stops it here.
    refused = (
        new_job(NOW, max_tries=2**70) if isinstance(durable, SQLiteStore)
        else new_job(NOW, meta="{not json")
    )  # fmt: skip
    async with held_up(durable, backend_url) as queued:
        lead = asyncio.ensure_future(durable.job_insert_many(*good[0]))
        await queued(0 if isinstance(durable, PostgresStore) else 1)
        await asyncio.sleep(0)
        calls = [asyncio.ensure_future(durable.job_insert_many(job, a)) for job, a in good[1:3]]
        bad = asyncio.ensure_future(durable.job_insert_many(refused, ["[]"]))
        calls += [asyncio.ensure_future(durable.job_insert_many(job, a)) for job, a in good[3:]]
        await queued(6 if isinstance(durable, PostgresStore) else 7)
    with pytest.raises(Exception) as raised:
        await bad
    assert durable.refuses(raised.value)
    await assert_own_jobs(durable, good, [await lead, *[await call for call in calls]])


async def test_calls_with_one_unique_key_made_at_once_make_one_job(durable: Store) -> None:
    job = new_job(NOW, unique_key="invoice-7")
    results = await asyncio.gather(*(durable.job_insert_many(job, ["[]"]) for _ in range(20)))
    ids = {rows[0].id for rows in results}
    assert len(ids) == 1
    assert sum(rows[0].created for rows in results) == 1


async def test_a_caller_cancelled_while_waiting_leaves_no_job_and_holds_up_no_one(
    durable: Store, backend_url: str
) -> None:
    calls = jobs(4)
    before = {job.id for job in await durable.job_list(_all())}
    async with held_up(durable, backend_url) as queued:
        lead = asyncio.ensure_future(durable.job_insert_many(*calls[0]))
        await queued(0 if isinstance(durable, PostgresStore) else 1)
        await asyncio.sleep(0)
        waiting = [asyncio.ensure_future(durable.job_insert_many(job, a)) for job, a in calls[1:]]
        await queued(3 if isinstance(durable, PostgresStore) else 4)
        waiting[0].cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiting[0]
    done = [await lead, await waiting[1], await waiting[2]]
    await assert_own_jobs(durable, [calls[0], calls[2], calls[3]], done)
    after = {job.id for job in await durable.job_list(_all())}
    assert len(after - before) == sum(len(rows) for rows in done)


async def test_a_leader_cancelled_mid_commit_passes_the_lead_on(
    durable: Store, backend_url: str
) -> None:
    if isinstance(durable, SQLiteStore):
        pytest.skip("on SQLite the store's own thread commits every call that waits")
    calls = jobs(5)
    async with held_up(durable, backend_url) as queued:
        lead = asyncio.ensure_future(durable.job_insert_many(*calls[0]))
        await asyncio.sleep(0)
        waiting = [asyncio.ensure_future(durable.job_insert_many(job, a)) for job, a in calls[1:]]
        await queued(4)
        lead.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await lead
    await assert_own_jobs(durable, calls[1:], [await call for call in waiting])


def test_threads_that_arrive_during_a_commit_share_the_next(backend_url: str) -> None:
    """Sync calls from many threads (a sync web server's), without an event loop of
    their own: SQLite commits on the caller's thread, PostgreSQL on the store's loop."""
    portal = Portal()  # the store's event loop, in a thread of its own
    url = f"{backend_url}?synchronous=full" if backend_url.startswith("sqlite") else backend_url
    store = open_store(url)
    portal.call(store.open())
    if isinstance(store, PostgresStore):
        # The loop's way: a lone call would insert on its thread's own connection
        # (tests/integration/test_enqueue_together.py), which would not be held up here.
        store._inserts.on_thread = None
    try:
        calls = jobs(16)
        results: dict[int, list[Inserted]] = {}
        commits = Commits(store)

        def call(n: int) -> None:
            results[n] = store.job_insert_blocking(*calls[n])

        def waiting() -> int:
            return int(store._inserts.queued)  # type: ignore[attr-defined]

        hold = held_up(store, backend_url)
        portal.call(hold.__aenter__())
        with _threads(call, len(calls)) as threads:
            try:
                threads[0].start()
                if isinstance(store, SQLiteStore):  # it leads, and waits for the lock
                    _wait_for(lambda: waiting() == 1)
                else:  # its commit is under way, held up by the table's lock
                    _wait_for(lambda: store._inserts._leaders == 1 and waiting() == 0)  # type: ignore[attr-defined]
                for thread in threads[1:]:
                    thread.start()
                _wait_for(lambda: waiting() >= (16 if isinstance(store, SQLiteStore) else 15))
            finally:
                portal.call(hold.__aexit__(None, None, None))
        # SQLite: all 16 in one commit; PostgreSQL: the first, then the other 15.
        assert commits.count == (1 if isinstance(store, SQLiteStore) else 2)
        ordered = [results[n] for n in range(len(calls))]
        portal.call(assert_own_jobs(store, calls, ordered))
    finally:
        portal.call(store.close())
        portal.close()


@contextlib.contextmanager
def _threads(target: Callable[[int], None], count: int) -> Iterator[list[threading.Thread]]:
    threads = [threading.Thread(target=target, args=(n,)) for n in range(count)]
    try:
        yield threads
    finally:
        for thread in threads:
            if thread.is_alive() or thread.ident is not None:
                thread.join(30)
                assert not thread.is_alive()


def _wait_for(condition: Callable[[], bool]) -> None:
    event = threading.Event()
    for _ in range(30_000):
        if condition():
            return
        event.wait(0.001)
    raise AssertionError("timed out")


def _all() -> JobFilter:
    return JobFilter(limit=10_000)


def test_terminate_while_calls_commit_ends_them_cleanly(tmp_path: Any) -> None:
    """terminate() while threads and the loop's thread commit enqueues: each call gets
    its ids or a StoreError, and no connection is closed under a commit (which would
    crash the process)."""
    outcomes: list[object] = []
    for round_no in range(5):
        portal = Portal()
        store = SQLiteStore(str(tmp_path / f"jobs{round_no}.db"))
        portal.call(store.open())

        def call(n: int, store: SQLiteStore = store) -> None:
            for _ in range(50):
                try:
                    outcomes.append(store.job_insert_blocking(*jobs(1)[0]))
                except StoreError as exc:
                    outcomes.append(exc)

        async def on_loop(store: SQLiteStore = store) -> None:
            for job, args in jobs(50):
                try:
                    outcomes.append(await store.job_insert_many(job, args))
                except StoreError as exc:
                    outcomes.append(exc)

        looping = asyncio.run_coroutine_threadsafe(on_loop(), portal.loop)
        with _threads(call, 4) as threads:
            for thread in threads:
                thread.start()
            store.terminate()
        looping.result(30)
        portal.close()
    assert outcomes and all(isinstance(o, list | StoreError) for o in outcomes)
