"""The enqueue a web application makes: one job per call, from many threads or tasks
at once. Each call gets its own job, its hooks and its count in the metrics, however
the calls are committed together (docs/design.md, Enqueue)."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import psycopg
import pytest

import ferryq
from ferryq import metrics
from ferryq.store.postgres.store import PostgresStore
from tests.conformance.jobs import new_job
from tests.conftest import START
from tests.pg import PgCluster


def enqueued(namespace: str = "default", queue: str = "default") -> float:
    for labels, values in metrics.METRICS.snapshot().get("ferryq_jobs_enqueued", []):
        if tuple(labels) == (namespace, queue):
            return float(values[0])
    return 0.0


@pytest.fixture
def sync_app(backend_url: str) -> Iterator[ferryq.App]:
    app = ferryq.App(backend_url)
    yield app
    app.close()


def test_sync_enqueues_from_threads_each_get_their_job_hooks_and_count(
    sync_app: ferryq.App,
) -> None:
    app = sync_app
    seen: list[tuple[int, list[int]]] = []
    lock = threading.Lock()

    @app.hooks.before_enqueue
    def tag(enqueue: ferryq.Enqueue) -> None:
        enqueue.meta["request"] = threading.get_ident()

    @app.hooks.after_enqueue
    def note(enqueue: ferryq.Enqueue) -> None:
        with lock:
            seen.append((enqueue.count, list(enqueue.ids)))

    @app.task
    def job(thread: int, n: int) -> None: ...

    before = enqueued()
    handles: dict[tuple[int, int], ferryq.JobHandle] = {}

    def calls(thread: int) -> None:
        for n in range(25):
            handles[thread, n] = job.enqueue(thread, n)

    threads = [threading.Thread(target=calls, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({h.id for h in handles.values()}) == 200
    for (caller, n), handle in handles.items():
        stored = app.get_job(handle.id)
        assert stored.args == [caller, n] and set(stored.meta) == {"request"}
    assert sorted(ids[0] for _, ids in seen) == sorted(h.id for h in handles.values())
    assert enqueued() - before == 200


def test_calls_with_one_unique_key_from_threads_make_one_job(sync_app: ferryq.App) -> None:
    @sync_app.task
    def report() -> None: ...

    handles: list[ferryq.JobHandle] = []

    def call() -> None:
        handles.append(report.options(unique_key="nightly-report").enqueue())

    threads = [threading.Thread(target=call) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({h.id for h in handles}) == 1
    assert sum(h.created for h in handles) == 1


def test_a_call_with_a_bad_option_fails_alone(sync_app: ferryq.App) -> None:
    @sync_app.task
    def job(n: int) -> None: ...

    outcomes: dict[int, object] = {}

    def call(n: int) -> None:
        try:
            calling = job.options(delay=-1) if n == 3 else job
            outcomes[n] = calling.enqueue(n)
        except ValueError as exc:
            outcomes[n] = exc

    threads = [threading.Thread(target=call, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert isinstance(outcomes.pop(3), ValueError)
    assert all(isinstance(h, ferryq.JobHandle) for h in outcomes.values())
    assert sorted(j.args[0] for j in sync_app.list_jobs()) == [0, 1, 2, 4, 5, 6, 7]


async def test_an_async_enqueue_never_blocks_the_loop_on_another_process_lock(
    tmp_path: Path,
) -> None:
    """At synchronous=normal an async enqueue commits on the loop's thread, but only
    when the write lock is free at once: while another process holds it, the loop
    goes on, and the job goes in as soon as the lock is let go."""
    url = f"sqlite:///{tmp_path}/jobs.db"
    app = ferryq.App(url)
    try:

        @app.task
        def job(n: int) -> None: ...

        await job.enqueue_async(0)  # the store is open
        other = sqlite3.connect(tmp_path / "jobs.db", isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        enqueue = asyncio.ensure_future(job.enqueue_async(1))
        ticks = 0
        for _ in range(20):  # the loop keeps turning while the enqueue waits
            await asyncio.sleep(0)
            ticks += 1
        assert ticks == 20 and not enqueue.done()
        other.execute("COMMIT")
        other.close()
        handle = await asyncio.wait_for(enqueue, 30)
        assert (await app.get_job_async(handle.id)).args == [1]
    finally:
        await app.aclose()


def test_a_sync_enqueue_on_postgres_commits_on_its_thread_and_outlives_a_restart(
    pg_cluster: PgCluster, pg_url: str
) -> None:
    """A sync call with no other enqueue under way inserts on its own thread's
    connection. A restart ends that connection's session: the next call sees so
    before it sends anything, and connects again instead of failing."""
    if not pg_cluster.can_restart:
        pytest.skip("the server is not this test session's own to restart")
    app = ferryq.App(pg_url)
    try:

        @app.task
        def job(n: int) -> None: ...

        job.enqueue(1)
        app.portal_call(job.enqueue_async(0))  # the loop's enqueues keep a connection
        assert app._portal_store is not None
        store = app._portal_store[1]
        assert isinstance(store, PostgresStore) and store._inserts.on_thread is not None
        before = store._inserts.on_thread._conn
        assert before is not None  # the call went on this thread
        pg_cluster.restart()
        handle = job.enqueue(2)
        assert store._inserts.on_thread._conn not in (None, before)
        assert app.get_job(handle.id).args == [2]
        # The connection the loop's enqueues kept is gone too: they take another.
        on_loop = app.portal_call(job.enqueue_async(3))
        assert app.get_job(on_loop.id).args == [3]
    finally:
        app.close()


def test_options_in_the_url_apply_to_sync_enqueues_too(pg_url: str) -> None:
    """A search_path given in the URL's ``options`` puts ferryq's tables in a schema;
    a sync enqueue's own connection must write there too, not to ``public``."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA app_a")
    app = ferryq.App(f"{pg_url}?options=-c%20search_path%3Dapp_a")
    try:

        @app.task
        def job(n: int) -> None: ...

        job.enqueue(1)
        app.portal_call(job.enqueue_async(2))
        assert sorted(j.args[0] for j in app.list_jobs()) == [1, 2]
    finally:
        app.close()


async def test_close_lets_the_enqueues_under_way_end(pg_url: str) -> None:
    """A store closed while enqueue calls wait for a commit: they all go in, and
    calls made after close began are refused."""
    store = PostgresStore(pg_url)
    await store.open()
    blocker = await asyncpg.connect(pg_url)
    held = blocker.transaction()
    await held.start()
    await blocker.execute("LOCK TABLE ferryq_jobs IN SHARE MODE")
    calls = [asyncio.ensure_future(store.job_insert_many(new_job(START), [f"[{n}]"]))
             for n in range(4)]  # fmt: skip
    for _ in range(3000):
        if store._inserts.queued == 3:
            break
        await asyncio.sleep(0.001)
    closing = asyncio.ensure_future(store.close())
    await asyncio.sleep(0)
    with pytest.raises(ferryq.StoreError):
        await store.job_insert_many(new_job(START), ["[9]"])
    await held.rollback()
    await blocker.close()
    results = [await call for call in calls]
    await asyncio.wait_for(closing, 30)
    assert len({rows[0].id for rows in results}) == 4


def test_a_job_postgres_refuses_on_a_sync_call_is_a_refusal(pg_url: str) -> None:
    app = ferryq.App(pg_url)
    try:

        @app.task
        def job() -> None: ...

        job.enqueue()
        assert app._portal_store is not None
        store = app._portal_store[1]
        assert store is not None
        with pytest.raises(Exception) as raised:
            store.job_insert_blocking(new_job(START, meta="{not json"), ["[]"])
        assert store.refuses(raised.value)
        assert len(app.list_jobs()) == 1
    finally:
        app.close()


def test_a_url_libpq_cannot_read_sends_sync_enqueues_through_the_loop(pg_url: str) -> None:
    """asyncpg takes a server setting in the URL's query; libpq does not. Such a URL
    costs the sync enqueue its own connection, not its job."""
    app = ferryq.App(f"{pg_url}?idle_in_transaction_session_timeout=30s")
    try:

        @app.task
        def job(n: int) -> None: ...

        handle = job.enqueue(5)
        assert app._portal_store is not None
        store = app._portal_store[1]
        assert isinstance(store, PostgresStore) and store._inserts.on_thread is not None
        assert store._inserts.on_thread._conn is None
        assert app.get_job(handle.id).args == [5]
    finally:
        app.close()
