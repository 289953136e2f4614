"""Enqueues on PostgreSQL: calls made at the same time share a commit.

Calls made at the same time share commits (see ferryq.store.coalesce). Up to
IN_FLIGHT commits of calls run at once (and the commits whose leader's caller was
cancelled, which go on without it), each led by a call that commits every call
queued by then; the calls queued meanwhile wait, and as a commit ends the first of
them leads the next. A batch is one statement (``job_insert_rows``), atomic without
BEGIN, which sends one NOTIFY per queue at its commit, unless the queue was notified
a moment ago (ferryq.store.postgres.notices).

A sync call from another thread inserts on that thread's own connection when no
commit is under way (ferryq.store.postgres.on_thread), else joins the calls waiting
on the store's event loop. Jobs with a unique key, of a lane or with dependencies go
through a transaction of their own (``_insert_locking``): it holds their locks.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ferryq.errors import StoreError
from ferryq.store import coalesce, flows
from ferryq.store.base import Inserted, NewJob
from ferryq.store.coalesce import PendingInsert
from ferryq.store.postgres import lanes
from ferryq.store.postgres.connection import (
    GENERIC_PLANS,
    IN_FLIGHT,
    INSERT_SETTINGS,
    Conn,
    Database,
    run,
    runner,
)
from ferryq.store.postgres.notices import Notices
from ferryq.store.postgres.on_thread import ThreadInserts
from ferryq.store.postgres.queries import Q, Statement
from ferryq.store.postgres.session import RunSession

log = logging.getLogger("ferryq.store.postgres")


class Inserts:
    """The enqueue calls of one store, and who commits them."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._waiting: deque[PendingInsert] = deque()
        self._leaders = 0  # commits of enqueue calls under way
        # Sync calls from other threads, on their way to the store's event loop.
        self.loop: asyncio.AbstractEventLoop | None = None
        self._from_threads: list[PendingInsert] = []
        self._from_threads_lock = threading.Lock()
        self._leads: set[asyncio.Task[None]] = set()
        self.on_thread: ThreadInserts | None = None
        self._no_commits = asyncio.Event()  # no commit of enqueue calls under way
        self._no_commits.set()
        self._dependency_trigger = False  # known to exist (prepare_dependencies)
        self.notices = Notices(db)

    @property
    def queued(self) -> int:
        """How many calls wait for a commit."""
        return len(self._waiting) + len(self._from_threads)

    def open(self) -> None:
        """Once the pools are made: the sync callers' own connection, unless the URL
        sets a budget of connections (``connections=``), which it would go beyond: the
        sync calls then go through the event loop, on the enqueues' connection."""
        self.loop = asyncio.get_running_loop()
        self.notices.open()
        if self._db.pooling.connections is not None:
            return
        settings = {**self._db.settings, **INSERT_SETTINGS}
        self.on_thread = ThreadInserts(
            self._db.url, self._db.safe_url, settings, insert_with,
            pooled=self._db.pooling.pooled, begin=self._db.begin,
            alone=self._db.pooling.transaction and not self._db.pooling.settings,
        )  # fmt: skip

    async def close(self) -> None:
        """After the store stopped taking calls: wait for the commits under way."""
        await self._no_commits.wait()
        await self.notices.close()
        self.terminate()

    def terminate(self) -> None:
        self.notices.terminate()
        if self.on_thread is not None:
            self.on_thread.close()
            self.on_thread = None

    async def insert_async(self, job: NewJob, args: Sequence[str]) -> list[Inserted]:
        if job.unique_key is not None or job.lane is not None or job.after:
            return await self._insert_locking(job, args)
        if not self._db.ready:
            raise StoreError("the store is not open")
        pending = PendingInsert(job, args)
        if self._leaders < IN_FLIGHT and not self._waiting:
            self._lead_one()
            self._waiting.append(pending)
        else:
            pending.loop = asyncio.get_running_loop()
            pending.future = pending.loop.create_future()
            self._waiting.append(pending)
            try:
                await pending.future
            except asyncio.CancelledError:
                self._withdraw(pending)
                raise
            if pending.done:  # in another's commit, maybe after it was told to lead
                if pending.lead:
                    self._pass_on()
                return pending.outcome()
        try:
            batch = coalesce.take(self._waiting)
            if len(batch) == 1:
                await self._commit(batch)
            else:  # the others' outcome must not depend on this caller staying
                await asyncio.shield(self._commit(batch))
        finally:
            self._pass_on()
        return pending.outcome()

    def insert_blocking(self, job: NewJob, args: Sequence[str]) -> list[Inserted]:
        """From a thread other than the store's event loop: the call joins the calls
        waiting there, and this thread waits for its commit."""
        loop = self.loop
        if loop is None or not self._db.ready or loop.is_closed():
            raise StoreError("the store is not open")
        if _running_loop() is loop:
            raise RuntimeError("a blocking enqueue cannot run on the store's own event loop")
        if job.unique_key is not None or job.lane is not None or job.after:
            locking = self._insert_locking(job, args)
            return asyncio.run_coroutine_threadsafe(locking, loop).result()
        # With no commit of calls under way, on this thread's own connection.
        if self._leaders == 0 and (on_thread := self.on_thread) is not None:
            with self.notices.deciding((job.queue,)) as notice:
                inserted = on_thread.insert(job, args, notice.notify)
                if inserted is None:  # not inserted here: the loop's call decides anew
                    notice.withdraw()
            if inserted is not None:
                return inserted
        wake = threading.Lock()
        wake.acquire()
        pending = PendingInsert(job, args, wake=wake)
        with self._from_threads_lock:
            self._from_threads.append(pending)
            first = len(self._from_threads) == 1
        if first:  # one wake-up of the loop for every call that arrives meanwhile
            loop.call_soon_threadsafe(self._take_from_threads)
        wake.acquire()  # released once its outcome is in
        return pending.outcome()

    def _pass_on(self) -> None:
        """After a commit: the first call still waiting leads the next one (a task
        does, for a call from another thread)."""
        while self._waiting:
            head = self._waiting[0]
            if head.wake is not None:
                task = asyncio.get_running_loop().create_task(self._lead())
                self._leads.add(task)  # the loop keeps only a weak reference
                task.add_done_callback(self._leads.discard)
                return
            if head.future is not None and not head.future.done():
                head.lead = True
                head.future.set_result(None)
                return
            self._waiting.popleft()  # its caller was cancelled: its jobs are dropped
        self._leaders -= 1
        if not self._leaders:
            self._no_commits.set()

    def _lead_one(self) -> None:
        self._leaders += 1
        self._no_commits.clear()

    async def _lead(self) -> None:
        try:
            if batch := coalesce.take(self._waiting):
                await self._commit(batch)
        finally:
            self._pass_on()

    def _take_from_threads(self) -> None:
        with self._from_threads_lock:
            calls, self._from_threads = self._from_threads, []
        self._waiting.extend(calls)
        if self._leaders < IN_FLIGHT:
            self._lead_one()
            self._pass_on()

    def _withdraw(self, pending: PendingInsert) -> None:
        """A waiting call's caller was cancelled: its jobs are not inserted, unless a
        commit has them already; a call told to lead passes that on."""
        with contextlib.suppress(ValueError):
            self._waiting.remove(pending)
        if pending.lead:
            self._pass_on()

    async def _commit(self, batch: Sequence[PendingInsert]) -> None:
        """Commit a batch of calls in one statement and tell each caller; if it is
        refused, each call on its own, so that a refused job fails its own call only."""
        try:
            if len(batch) == 1:
                batch[0].inserted = await self._insert_alike(batch[0].job, batch[0].args)
            else:
                await self._insert_together(batch)
        except Exception as exc:
            if len(batch) == 1 or not self._db.refuses(exc):
                coalesce.fail_all(batch, exc)
            else:
                for pending in batch:
                    try:
                        pending.inserted = await self._insert_alike(pending.job, pending.args)
                    except Exception as own:
                        pending.error = own
        except BaseException as exc:  # its leader was cancelled, or the loop stops
            coalesce.fail_interrupted(batch, exc)
            raise
        finally:
            for pending in batch:
                pending.settle()

    async def _insert_alike(self, job: NewJob, args: Sequence[str]) -> list[Inserted]:
        # Without dedup or a lane the insert is one statement, atomic by itself.
        with self.notices.deciding((job.queue,)) as notice:
            return await self._db.session(
                insert_jobs, job, args, notice.notify,
                transaction=False, idempotent=False, inserts=True,
            )  # fmt: skip

    async def _insert_together(self, batch: Sequence[PendingInsert]) -> None:
        jobs = [(p.job, a) for p in batch for a in p.args]
        notice = self.notices.deciding({p.job.queue for p in batch})
        params = {
            "namespaces": [j.namespace for j, _ in jobs], "queues": [j.queue for j, _ in jobs],
            "tasks": [j.task for j, _ in jobs], "args": [a for _, a in jobs],
            "states": [j.state.value for j, _ in jobs],
            "priorities": [j.priority for j, _ in jobs], "run_ats": [j.run_at for j, _ in jobs],
            "order_times": [j.order_time for j, _ in jobs],
            "expires_ats": [j.expires_at for j, _ in jobs], "ttrs": [j.ttr for j, _ in jobs],
            "max_tries": [j.max_tries for j, _ in jobs], "retries": [j.retry for j, _ in jobs],
            "stages": [j.stage for j, _ in jobs], "contexts": [j.context for j, _ in jobs],
            "metas": [j.meta for j, _ in jobs], "created_ats": [j.created_at for j, _ in jobs],
            "timeouts": [j.timeout for j, _ in jobs], "notify": notice.notify,
        }  # fmt: skip

        async def insert(conn: Conn) -> list[int]:
            return list((await run(conn, Q["job_insert_rows"], **params))[0][0])

        with notice:
            ids = iter(
                await self._db.session(insert, transaction=False, idempotent=False, inserts=True)
            )
        for pending in batch:
            pending.inserted = [Inserted(next(ids), True) for _ in pending.args]

    async def _insert_locking(self, job: NewJob, args: Sequence[str]) -> list[Inserted]:
        """Jobs with a unique key, of a lane or with dependencies: in a transaction of
        their own, which holds the key's and the lane's locks (two calls' locks in one
        transaction could be taken in an order another process takes the other way
        round) and the dependencies' row locks."""
        if job.after:
            await self.prepare_dependencies()
        # A lane's settle is one plan for every enqueue: planning it anew each time (the
        # session's force_custom_plan) cost more than running it.
        with self.notices.deciding((job.queue,)) as notice:
            return await self._db.session(
                insert_jobs, job, args, notice.notify,
                idempotent=False, settings=GENERIC_PLANS if job.lane is not None else None,
            )  # fmt: skip

    async def prepare_dependencies(self) -> None:
        """The history's trigger that resolves dependencies, made by the first enqueue
        with dependencies (see ``dependency_trigger`` in queries.sql)."""
        if self._dependency_trigger:
            return

        async def make(conn: Conn) -> None:
            if not await conn.fetchval(Q["dependency_trigger_exists"].sql):
                await conn.execute(Q["dependency_trigger"].sql)
                log.info("created the history's trigger that resolves dependencies")

        await self._db.session(make, transaction=False)
        self._dependency_trigger = True


async def insert_jobs(
    conn: Conn, job: NewJob, args: Sequence[str], notify: bool = True
) -> list[Inserted]:
    """Insert on ``conn`` (asyncpg), with one NOTIFY for all if ``notify``. With a
    unique_key or a lane it must be inside a transaction, which holds their locks until
    it ends."""
    return await insert_with(runner(conn), job, args, notify)


async def insert_with(
    run_one: Callable[[Statement, dict[str, Any]], Awaitable[list[Any]]],
    job: NewJob,
    args: Sequence[str],
    notify: bool = True,
) -> list[Inserted]:
    """The insert, over any driver: ``run_one`` executes one statement and returns
    rows. A job with a unique key goes through ``flows.insert_unique``, one with
    dependencies through ``flows.insert_after``. ``notify``: the insert sends the
    queue's wake-up NOTIFY (see ferryq.store.postgres.notices)."""
    if not args:
        return []
    if job.after:

        async def insert_held(held: NewJob, rest: Sequence[str]) -> list[Inserted]:
            return await insert_with(run_one, dataclasses.replace(held, after=()), rest, notify)

        return await flows.insert_after(RunSession(run_one), job, args, insert_held)
    if job.unique_key is not None:

        async def insert(first: Sequence[str]) -> int:
            return (await _insert_rows(run_one, job, first, notify))[0]

        return await flows.insert_unique(RunSession(run_one), job, args, insert)
    return [Inserted(i, True) for i in await _insert_rows(run_one, job, args, notify)]


async def _insert_rows(
    run_one: lanes.Run, job: NewJob, args: Sequence[str], notify: bool
) -> list[int]:
    # The insert takes the lane's lock itself, before its first row (again, harmlessly,
    # after the unique key's path).
    params = {name: getattr(job, name) for name in Q["job_insert_batch"].names
              if name not in ("args", "notify")}  # fmt: skip
    params.update(state=job.state.value, args=list(args), notify=notify)
    ids: list[int] = (await run_one(Q["job_insert_batch"], params))[0][0]
    if job.lane is not None:  # inserted waiting: the lane admits what it has room for
        await lanes.settle(run_one, {(job.namespace, job.lane)}, job.created_at, locked=True)
    return ids


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
