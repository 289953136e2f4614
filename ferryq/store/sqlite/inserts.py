"""Enqueues on SQLite: calls made at the same time share a commit.

Calls made at the same time share a commit (see ferryq.store.coalesce). A call that
finds no commit of calls under way leads: it commits on its own thread (a sync
caller), or on the store's thread (an async one). Calls arriving meanwhile wait,
then the store's thread commits them together, batch after batch until none is
left. An async call at NORMAL that finds nothing under way first tries to commit
alone on its own thread, on the database's ``quick`` connection, without waiting for
the lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import sqlite3
import threading
from collections import deque
from collections.abc import Callable, Sequence

from ferryq.errors import StoreError
from ferryq.store import coalesce, flows
from ferryq.store.base import Inserted, NewJob
from ferryq.store.coalesce import PendingInsert
from ferryq.store.flows import drive
from ferryq.store.sqlite import lanes
from ferryq.store.sqlite.connection import Database
from ferryq.store.sqlite.queries import Q
from ferryq.store.sqlite.session import Session

Conn = sqlite3.Connection
#: The store's thread checkpoints the WAL after this many quick commits (an async
#: enqueue's, on the event loop's thread, which must not do it itself: a checkpoint
#: waits for the disk). SQLite's own rule is about every thousand pages.
QUICK_CHECKPOINT = 128
#: The most jobs a call commits on the event loop's thread: a larger call (or one
#: whose lane must be settled) would hold up the loop, and goes to the store's thread.
QUICK_JOBS = 16
#: The most dependencies a call may name and still commit on the event loop's thread.
QUICK_AFTER = 64


class Inserts:
    """The enqueue calls of one store, and who commits them."""

    def __init__(self, db: Database) -> None:
        self._db = db
        # Enqueue calls waiting for a commit, and whether a commit of calls is under
        # way (see insert_async).
        self._waiting: deque[PendingInsert] = deque()
        self._waiting_lock = threading.Lock()
        self._leading = False
        self._quick_commits = 0

    @property
    def queued(self) -> int:
        """How many calls wait for a commit."""
        return len(self._waiting)

    async def insert_async(self, job: NewJob, args: Sequence[str]) -> list[Inserted]:
        if self._db.executor is None:
            raise StoreError("the store is closed")
        pending = PendingInsert(job, args)
        quick = (
            len(args) <= QUICK_JOBS and job.lane is None and job.unique_key is None
            and len(job.after) <= QUICK_AFTER
        )  # fmt: skip
        if quick and not self._leading and self._quick_insert(pending):
            return pending.outcome()
        loop = asyncio.get_running_loop()
        pending.future, pending.loop = loop.create_future(), loop
        if self._queue(pending):
            self._pass_on()
        try:
            await pending.future
        except asyncio.CancelledError:
            # Not inserted, unless a commit has it already (the caller cannot tell).
            with self._waiting_lock, contextlib.suppress(ValueError):
                self._waiting.remove(pending)
            raise
        return pending.outcome()

    def insert_blocking(self, job: NewJob, args: Sequence[str]) -> list[Inserted]:
        if self._db.executor is None:
            raise StoreError("the store is closed")
        wake = threading.Lock()
        wake.acquire()
        pending = PendingInsert(job, args, wake=wake)
        if not self._queue(pending):
            wake.acquire()  # released once its outcome is in
            return pending.outcome()
        try:
            with self._db.lock:  # nothing was under way: this call is first in line
                with self._waiting_lock:
                    batch = coalesce.take(self._waiting)
                self._commit(batch)
        finally:
            self._pass_on()
        return pending.outcome()

    def _queue(self, pending: PendingInsert) -> bool:
        """Queue a call; True if it leads (no commit of calls was under way)."""
        with self._waiting_lock:
            self._waiting.append(pending)
            leads, self._leading = not self._leading, True
        return leads

    def _pass_on(self) -> None:
        """After a leader's batch: the store's thread commits the calls queued since."""
        with self._waiting_lock:
            if not self._waiting:
                self._leading = False
                return
        if not self._db.submit(self._flush):  # closed meanwhile
            with self._waiting_lock:
                batch, self._leading = coalesce.take(self._waiting, None), False
            coalesce.fail_all(batch, StoreError("the store is closed"))
            for pending in batch:
                pending.settle()

    def _flush(self) -> None:
        """On the store's thread, which holds the lock: commit until no call waits."""
        while True:
            with self._waiting_lock:
                batch = coalesce.take(self._waiting)
                if not batch:
                    self._leading = False
                    return
            self._commit(batch)

    def _commit(self, batch: Sequence[PendingInsert]) -> None:
        """Commit a batch of calls and tell each caller. The connections' lock is held."""
        try:
            self._insert_batch(batch)
        except Exception as exc:  # a lone call's refusal, or the store closed
            coalesce.fail_all(batch, exc)
        except BaseException as exc:  # the committing thread is interrupted
            coalesce.fail_interrupted(batch, exc)
            raise
        finally:
            for pending in batch:
                pending.settle()

    def _insert_batch(self, batch: Sequence[PendingInsert]) -> None:
        def insert(conn: Conn) -> list[list[Inserted]]:
            return [insert_many(conn, p.job, p.args) for p in batch]

        db = self._db
        try:
            for pending, inserted in zip(batch, db.write_here(insert), strict=True):
                pending.inserted = inserted
            return
        except sqlite3.Error as exc:
            if len(batch) == 1 or not db.refuses(exc):
                coalesce.fail_all(batch, db.failure(exc, "writing"))
                return
        except (ValueError, TypeError, OverflowError):
            if len(batch) == 1:
                raise
        # One job the database refuses must not fail the others: each on its own.
        for pending in batch:
            try:
                pending.inserted = db.write_here(_inserting(pending))
            except sqlite3.Error as exc:
                pending.error = db.failure(exc, "writing")
            except (ValueError, TypeError, OverflowError) as exc:
                pending.error = exc

    def _quick_insert(self, pending: PendingInsert) -> bool:
        """Commit one call on this thread if the write lock is free at once; False when
        it is not (another process writes), when the disk is short of space (the
        store's thread minds the WAL then), or when this process's own connection is
        in use."""
        db = self._db
        if db.quick is None or db.short or db.reclaim:
            return False
        if not db.lock.acquire(blocking=False):
            return False
        try:
            conn = db.quick  # read again under the lock: terminate() may have run
            if conn is None:
                return False
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError:
                return False  # busy: the store's thread waits for it
            try:
                pending.inserted = insert_many(conn, pending.job, pending.args)
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                pending.error = db.failure(exc, "writing")
            except (ValueError, TypeError, OverflowError) as exc:
                pending.error = exc
            finally:
                if conn.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
            if pending.error is not None:
                pending.inserted = None
            else:
                db.notifier.committed(conn, conn.total_changes)
        finally:
            db.lock.release()
        # Its commits never checkpoint: the store's thread does, now and then.
        self._quick_commits += 1
        if self._quick_commits % QUICK_CHECKPOINT == 0:
            db.submit(db.checkpoint)
        return True


def insert_many(conn: Conn, job: NewJob, args: Sequence[str]) -> list[Inserted]:
    """Insert one job per element of ``args`` in the write transaction begun:
    with dependencies through ``flows.insert_after``, with a unique key through
    ``flows.insert_unique``; a job of a lane is settled into it."""
    if job.after:

        async def insert(held: NewJob, rest: Sequence[str]) -> list[Inserted]:
            return _insert_jobs(conn, held, rest)

        return drive(flows.insert_after(Session(conn), job, args, insert))
    return _insert_jobs(conn, job, args)


def _insert_jobs(conn: Conn, job: NewJob, args: Sequence[str]) -> list[Inserted]:
    if job.unique_key is not None:

        async def insert(first: Sequence[str]) -> int:
            return _insert_rows(conn, job, first)[0]

        return drive(flows.insert_unique(Session(conn), job, args, insert))
    if len(args) == 1 and job.lane is None:
        return [Inserted(_insert_one(conn, job, args[0]), True)]
    return [Inserted(i, True) for i in _insert_rows(conn, job, args)]


def _insert_rows(conn: Conn, job: NewJob, args: Sequence[str]) -> range:
    """Jobs of a lane, with a unique key, or many at once: their ids."""
    params = {
        "namespace": job.namespace, "queue": job.queue, "task": job.task,
        "args": args[0] if len(args) == 1 else json.dumps(list(args)),
        "state": job.state.value, "lane": job.lane,
        "priority": job.priority, "run_at": job.run_at, "order_time": job.order_time,
        "expires_at": job.expires_at, "ttr": job.ttr, "max_tries": job.max_tries,
        "retry": job.retry, "unique_key": job.unique_key, "stage": job.stage,
        "context": job.context, "meta": job.meta, "created_at": job.created_at,
        "timeout": job.timeout,
    }  # fmt: skip
    if len(args) == 1:
        first = last = conn.execute(Q["job_insert_one"], params).lastrowid or 0
    else:
        count = conn.execute(Q["job_insert"], params).rowcount
        last = conn.execute("SELECT last_insert_rowid()").fetchone()[0]
        first = last - count + 1
    if job.lane is not None:  # inserted waiting: the lane admits what it has room for
        lanes.settle(conn, {(job.namespace, job.lane)}, job.created_at)
    return range(first, last + 1)


#: One job's insert with positional parameters: binding by name cost a fifth of the
#: statement here. _insert_one passes the values in the order of the named ones.
_INSERT_ONE = re.sub(r":(\w+)", "?", Q["job_insert_one"])
if re.findall(r":(\w+)", Q["job_insert_one"]) != [
    "namespace", "queue", "task", "args", "state", "lane", "priority", "run_at",
    "order_time", "expires_at", "ttr", "max_tries", "retry", "unique_key", "stage",
    "context", "meta", "created_at", "timeout",
]:  # fmt: skip
    raise RuntimeError("job_insert_one's parameters are not in _insert_one's order")


def _insert_one(conn: Conn, job: NewJob, args: str) -> int:
    """A plain job (no lane, no unique key): its id."""
    row = (job.namespace, job.queue, job.task, args, job.state.value, job.lane,
           job.priority, job.run_at, job.order_time, job.expires_at, job.ttr,
           job.max_tries, job.retry, job.unique_key, job.stage, job.context, job.meta,
           job.created_at, job.timeout)  # fmt: skip
    return conn.execute(_INSERT_ONE, row).lastrowid or 0


def _inserting(pending: PendingInsert) -> Callable[[Conn], list[Inserted]]:
    return lambda conn: insert_many(conn, pending.job, pending.args)
