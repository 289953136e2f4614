"""The PostgreSQL backend: many workers on many machines, one database.

Claims take rows with ``FOR UPDATE SKIP LOCKED`` through partial indexes; finishes
and enqueues go in batches through ``unnest``; an enqueue sends a NOTIFY per queue
that wakes idle workers, and a batch of finishes that ends jobs one that wakes result
waiters. Leadership is a session advisory lock on a connection of its own. Cancel,
dedup on insert, the lane listing, the counts and migrate are the flows written once
for both backends (ferryq.store.flows), run here on a ``ConnSession``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import math
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import asyncpg

from ferryq.errors import StoreError
from ferryq.faults import FaultLog, one_line
from ferryq.job import Job, State
from ferryq.lanes import LaneRule, LaneView, Taker
from ferryq.store import base, coalesce, flows, safe_url
from ferryq.store.base import (
    Claimed,
    Dependencies,
    Finish,
    FinishReport,
    Inserted,
    JobFilter,
    LaneInfo,
    LaneWindow,
    Leases,
    NewJob,
    WorkerInfo,
)
from ferryq.store.coalesce import PendingInsert
from ferryq.store.postgres import lanes, partitions
from ferryq.store.postgres.on_thread import ThreadInserts
from ferryq.store.postgres.queries import MIGRATIONS, Q, Statement, positional
from ferryq.store.postgres.session import ConnSession, RunSession
from ferryq.store.sql import (
    TOKEN_COLUMNS,
    dependencies_from_rows,
    held_leases,
    job_from_row,
    lane_window,
    list_query,
    requeue_statement,
    rule_params,
    worker_from_row,
)
from ferryq.turns import Turn, Turns

log = logging.getLogger("ferryq.store.postgres")
#: How long a namespace seen with a lane rate claims through the gate without asking.
RATED_FOR = 10.0
T = TypeVar("T")
Conn = Any  # asyncpg.Connection or a pooled proxy of one; asyncpg ships no types
_TO_HISTORY = ("succeeded", "dead", "cancelled")
JOBS_CHANNEL, DONE_CHANNEL = "ferryq_jobs", "ferryq_done"
#: A frozen leader's session ends after this long, so its lock passes on.
LEADER_IDLE_TIMEOUT = "10s"
#: A transaction of the store's lasts milliseconds. One left idle longer than this
#: (its process frozen: SIGSTOP, a debugger, a paused machine) is ended by the server,
#: so the lanes and rows it locked go free for every other worker; the frozen call,
#: once it runs again, finds its connection gone and starts over on another.
IDLE_IN_TRANSACTION_TIMEOUT = "10s"
#: Statements are prepared once per connection. A generic plan, which PostgreSQL
#: switches to after five runs, guesses batch sizes blindly and, once the tables are
#: large, can scan a whole table where the batch needs a few index lookups: every
#: run is planned for its own parameters instead (a fraction of a millisecond).
#: A setting given in the URL's query (``?idle_in_transaction_session_timeout=30s``)
#: takes the place of the one here.
SESSION_SETTINGS = {
    "plan_cache_mode": "force_custom_plan",
    "application_name": "ferryq",
    "idle_in_transaction_session_timeout": IDLE_IN_TRANSACTION_TIMEOUT,
}
GENERIC_PLANS = "plan_cache_mode = force_generic_plan"
#: The enqueues' connections: the insert has one good plan whatever its values.
INSERT_SETTINGS = {"plan_cache_mode": "force_generic_plan"}
#: Commits of enqueue calls under way at once. One: the calls that queue while it
#: waits for its fsync go in the next together (two at once made smaller batches,
#: and fewer calls a second).
IN_FLIGHT = 1
INSERT_CONNECTIONS = IN_FLIGHT + 1  # one more for a commit whose caller was cancelled
#: How long a call keeps retrying while the server is unreachable (a restart).
RECONNECT_SECONDS = 30.0
_CONNECTION_LOST = (
    OSError,
    asyncpg.exceptions.PostgresConnectionError,
    asyncpg.exceptions.CannotConnectNowError,
    asyncpg.exceptions.AdminShutdownError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,  # a connection left half-way through an operation
    asyncpg.exceptions.IdleInTransactionSessionTimeoutError,  # it ended a frozen session
    # Refused at connect, so nothing began: the server is full (max_connections) or
    # the role is at its own limit; both pass as other clients leave.
    asyncpg.exceptions.TooManyConnectionsError,
)


#: SQLSTATE classes that refuse the values written, whatever the moment: data
#: exceptions (22), integrity violations (23) and limits exceeded (54).
_REFUSALS = ("22", "23", "54")


class PostgresStore(base.Store):
    def __init__(self, url: str, *, min_size: int = 0, max_size: int = 10) -> None:
        self.url = url
        self._min_size, self._max_size = min_size, max_size
        self._pool: asyncpg.Pool | None = None
        # Enqueues have connections of their own, with generic plans: planning the
        # insert anew at every call cost more than running it.
        self._inserts_pool: asyncpg.Pool | None = None
        self._inserts: deque[PendingInsert] = deque()
        self._leaders = 0  # commits of enqueue calls under way
        # Sync calls from other threads, on their way to the store's event loop.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._from_threads: list[PendingInsert] = []
        self._from_threads_lock = threading.Lock()
        self._leads: set[asyncio.Task[None]] = set()
        self._on_thread: ThreadInserts | None = None
        self._kept: Conn | None = None
        self._kept_busy = False
        self._no_commits = asyncio.Event()  # no commit of enqueue calls under way
        self._no_commits.set()
        self._listener: _Listener | None = None
        self._leader: Conn | None = None
        self._leading: set[str] = set()
        self._leading_turn = asyncio.Lock()
        self._opening = asyncio.Lock()
        self._ready = False
        self._faults = FaultLog(log)
        self._claims = Turns()
        self._dependency_trigger = False  # known to exist (prepare_dependencies)
        self._rated = _Rated()

    @classmethod
    def from_url(cls, url: str) -> PostgresStore:
        return cls(url.replace("postgres://", "postgresql://", 1))

    @property
    def safe_url(self) -> str:
        return safe_url(self.url)

    # -- lifecycle ---------------------------------------------------------------

    async def open(self, migrate: bool = True) -> None:
        if self._ready:
            return
        async with self._opening:  # callers racing to open share one pool
            if not self._ready:
                await self._open(migrate)
                self._loop = asyncio.get_running_loop()
                self._ready = True

    async def _open(self, migrate: bool) -> None:
        deadline = time.monotonic() + RECONNECT_SECONDS
        while True:
            try:
                return await self._connect(migrate)
            except StoreError as exc:
                # A server starting up or shutting down for a restart is worth waiting
                # for; anything else (a wrong URL, a server that is down) is not.
                starting = isinstance(exc.__cause__, asyncpg.CannotConnectNowError)
                if not starting or time.monotonic() > deadline:
                    raise
                log.warning("%s; retrying", exc)
                await asyncio.sleep(0.2)

    async def _connect(self, migrate: bool) -> None:
        try:
            self._pool = await asyncpg.create_pool(
                self.url, min_size=self._min_size, max_size=self._max_size,
                server_settings=_session_settings(self.url), reset=_reset,
            )  # fmt: skip
            async with self._pool.acquire() as conn:  # a wrong URL says so now, once
                await conn.execute("SELECT 1")
            self._inserts_pool = await asyncpg.create_pool(
                self.url, min_size=0, max_size=INSERT_CONNECTIONS,
                server_settings={**_session_settings(self.url), **INSERT_SETTINGS}, reset=_reset,
            )  # fmt: skip
            self._on_thread = ThreadInserts(self.url, self.safe_url,
                                            {**_session_settings(self.url), **INSERT_SETTINGS},
                                            insert_with)  # fmt: skip
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            await self.close()
            raise StoreError(f"cannot connect to PostgreSQL at {self.safe_url}: {exc}") from exc
        if migrate:
            try:
                await self.migrate()
                await self.history_ensure_partitions(time.time())
            except BaseException:
                await self.close()
                raise

    async def close(self) -> None:
        self._ready = False  # new enqueues are refused; those under way end first
        await self._no_commits.wait()
        if self._inserts_pool is not None and not self._kept_busy:
            kept, self._kept = self._kept, None
            if kept is not None:
                await _give_back(self._inserts_pool, kept)
        if self._on_thread is not None:
            self._on_thread.close()
            self._on_thread = None
        if self._listener is not None:
            await self._listener.close()
            self._listener = None
        if self._leader is not None:
            with contextlib.suppress(Exception):
                await self._leader.close()
            self._leader = None
        pools, self._pool, self._inserts_pool = (self._pool, self._inserts_pool), None, None
        for pool in pools:
            if pool is not None:
                await pool.close()

    def terminate(self) -> None:
        self._ready = False
        self._kept = None  # the pool's terminate ends it
        if self._on_thread is not None:
            self._on_thread.close()
            self._on_thread = None
        listening = self._listener.conn if self._listener is not None else None
        pools, self._pool, self._inserts_pool = (self._pool, self._inserts_pool), None, None
        for closable in (self._leader, listening, *pools):
            # Its event loop may be gone already: closing is then best effort.
            with contextlib.suppress(RuntimeError):
                if closable is not None:
                    closable.terminate()
        self._leader = self._listener = None

    def _acquire(self, inserts: bool = False) -> Any:
        pool = self._inserts_pool if inserts else self._pool
        if pool is None:
            raise StoreError("the store is not open")
        return self._kept_for_inserts(pool) if inserts else pool.acquire()

    @contextlib.asynccontextmanager
    async def _kept_for_inserts(self, pool: asyncpg.Pool) -> AsyncIterator[Conn]:
        """The enqueues' connection, kept out of the pool between commits: taking one
        from the pool and giving it back cost a tenth of a one-job enqueue. A second
        commit at once (its leader's caller was cancelled) takes one from the pool."""
        if self._kept_busy or not self._ready:
            async with pool.acquire() as conn:
                yield conn
            return
        self._kept_busy = True
        try:
            conn = self._kept
            if conn is None or not _usable(conn):  # the server ended it: another
                self._kept = None
                if conn is not None:
                    await _give_back(pool, conn)
                conn = self._kept = await pool.acquire()
            try:
                yield conn
            except BaseException:  # the pool resets or drops it; the next takes another
                self._kept = None
                await _give_back(pool, conn)
                raise
        finally:
            self._kept_busy = False
            if not self._ready and (kept := self._kept) is not None:  # closing meanwhile
                self._kept = None
                await _give_back(pool, kept)

    async def _session(
        self,
        op: Callable[[Conn], Awaitable[T]],
        *,
        transaction: bool = True,
        idempotent: bool = True,
        isolation: str | None = None,
        settings: str | None = None,
        inserts: bool = False,
    ) -> T:
        """Run ``op`` on a pooled connection, riding out a server restart. ``settings``
        (``SET LOCAL`` assignments) apply to ``op``'s transaction, set as it begins.
        ``inserts``: on a connection of the enqueues' own pool.

        A connection lost before the work began (a pooled connection the server
        closed, a server still starting) is always retried; one lost half-way only
        when ``op`` is safe to run twice. RECONNECT_SECONDS after the first loss it is a
        StoreError (counted from the loss: a call may have been frozen long before).
        """
        delay = 0.05
        deadline: float | None = None  # set at the first loss
        while True:
            begun = False
            try:
                async with self._acquire(inserts) as conn:
                    if not transaction:
                        begun = True
                        result = await op(conn)
                    else:
                        transaction_of_op = (
                            conn.transaction(isolation=isolation)
                            if settings is None
                            else _transaction_with(conn, settings)
                        )
                        async with transaction_of_op:
                            begun = True
                            result = await op(conn)
            except _CONNECTION_LOST as exc:
                if isinstance(exc, ValueError):  # asyncpg's DataError: a value not encoded
                    raise
                deadline = deadline or time.monotonic() + RECONNECT_SECONDS
                if (begun and not idempotent) or time.monotonic() > deadline:
                    raise StoreError(
                        f"lost the connection to PostgreSQL at {self.safe_url}: {one_line(exc)}"
                    ) from exc
                self._faults.failed("PostgreSQL connection", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
            self._faults.succeeded("PostgreSQL connection")
            return result

    async def _fetch(self, name: str, **params: Any) -> list[Any]:
        statement = Q[name]

        async def fetch(conn: Conn) -> list[Any]:
            return list(await conn.fetch(statement.sql, *statement.args(params)))

        return await self._session(fetch, transaction=False)

    async def _execute(self, name: str, **params: Any) -> str:
        statement = Q[name]

        async def execute(conn: Conn) -> str:
            return str(await conn.execute(statement.sql, *statement.args(params)))

        return await self._session(execute, transaction=False)

    def refuses(self, error: BaseException) -> bool:
        if isinstance(error, ValueError | TypeError | OverflowError):
            return True  # not even encoded: a text no codec takes, an integer past 64 bits
        # asyncpg's errors, or psycopg's (a sync enqueue's, see on_thread).
        if not isinstance(error, asyncpg.PostgresError) and not _of_psycopg(error):
            return False
        return str(getattr(error, "sqlstate", None) or "")[:2] in _REFUSALS

    # -- migrations --------------------------------------------------------------

    async def migrate(self) -> list[int]:
        return await self._session(
            lambda conn: flows.migrate(ConnSession(conn), MIGRATIONS, time.time())
        )

    async def schema_version(self) -> int:
        return await self._session(
            lambda conn: flows.schema_version(ConnSession(conn)), transaction=False
        )

    # -- hot path ----------------------------------------------------------------

    async def job_insert_many(self, job: NewJob, args: Sequence[str]) -> list[Inserted]:
        if job.unique_key is not None or job.lane is not None or job.after:
            return await self._insert_locking(job, args)
        # Calls made at the same time share commits (see ferryq.store.coalesce). Up to
        # IN_FLIGHT commits of calls run at once (and the commits whose leader's caller
        # was cancelled, which go on without it), each led by a call that commits every
        # call queued by then; the calls queued meanwhile wait, and as a commit ends the
        # first of them leads the next.
        if not self._ready:
            raise StoreError("the store is not open")
        pending = PendingInsert(job, args)
        if self._leaders < IN_FLIGHT and not self._inserts:
            self._lead_one()
            self._inserts.append(pending)
        else:
            pending.loop = asyncio.get_running_loop()
            pending.future = pending.loop.create_future()
            self._inserts.append(pending)
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
            batch = coalesce.take(self._inserts)
            if len(batch) == 1:
                await self._insert_rows(batch)
            else:  # the others' outcome must not depend on this caller staying
                await asyncio.shield(self._insert_rows(batch))
        finally:
            self._pass_on()
        return pending.outcome()

    def _pass_on(self) -> None:
        """After a commit: the first call still waiting leads the next one (a task
        does, for a call from another thread)."""
        while self._inserts:
            head = self._inserts[0]
            if head.wake is not None:
                task = asyncio.get_running_loop().create_task(self._lead())
                self._leads.add(task)  # the loop keeps only a weak reference
                task.add_done_callback(self._leads.discard)
                return
            if head.future is not None and not head.future.done():
                head.lead = True
                head.future.set_result(None)
                return
            self._inserts.popleft()  # its caller was cancelled: its jobs are dropped
        self._leaders -= 1
        if not self._leaders:
            self._no_commits.set()

    def _lead_one(self) -> None:
        self._leaders += 1
        self._no_commits.clear()

    async def _lead(self) -> None:
        try:
            if batch := coalesce.take(self._inserts):
                await self._insert_rows(batch)
        finally:
            self._pass_on()

    inserts_blocking: bool = True

    def job_insert_blocking(self, job: NewJob, args: Sequence[str]) -> list[Inserted]:
        """From a thread other than the store's event loop: the call joins the calls
        waiting there, and this thread waits for its commit."""
        loop = self._loop
        if loop is None or not self._ready or loop.is_closed():
            raise StoreError("the store is not open")
        if _running_loop() is loop:
            raise RuntimeError("a blocking enqueue cannot run on the store's own event loop")
        if job.unique_key is not None or job.lane is not None or job.after:
            locking = self._insert_locking(job, args)
            return asyncio.run_coroutine_threadsafe(locking, loop).result()
        # With no commit of calls under way, on this thread's own connection.
        if self._leaders == 0 and (on_thread := self._on_thread) is not None:
            inserted = on_thread.insert(job, args)
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

    def _take_from_threads(self) -> None:
        with self._from_threads_lock:
            calls, self._from_threads = self._from_threads, []
        self._inserts.extend(calls)
        if self._leaders < IN_FLIGHT:
            self._lead_one()
            self._pass_on()

    def _withdraw(self, pending: PendingInsert) -> None:
        """A waiting call's caller was cancelled: its jobs are not inserted, unless a
        commit has them already; a call told to lead passes that on."""
        with contextlib.suppress(ValueError):
            self._inserts.remove(pending)
        if pending.lead:
            self._pass_on()

    async def _insert_rows(self, batch: Sequence[PendingInsert]) -> None:
        """Commit a batch of calls in one statement and tell each caller; if it is
        refused, each call on its own, so that a refused job fails its own call only."""
        try:
            if len(batch) == 1:
                batch[0].inserted = await self._insert_alike(batch[0].job, batch[0].args)
            else:
                await self._insert_together(batch)
        except Exception as exc:
            if len(batch) == 1 or not self.refuses(exc):
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
        async def insert(conn: Conn) -> list[Inserted]:
            return await insert_jobs(conn, job, args)

        # Without dedup or a lane the insert is one statement, atomic by itself.
        return await self._session(insert, transaction=False, idempotent=False, inserts=True)

    async def _insert_together(self, batch: Sequence[PendingInsert]) -> None:
        jobs = [(p.job, a) for p in batch for a in p.args]
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
            "timeouts": [j.timeout for j, _ in jobs],
        }  # fmt: skip

        async def insert(conn: Conn) -> list[int]:
            return list((await _run(conn, Q["job_insert_rows"], **params))[0][0])

        ids = iter(await self._session(insert, transaction=False, idempotent=False, inserts=True))
        for pending in batch:
            pending.inserted = [Inserted(next(ids), True) for _ in pending.args]

    async def _insert_locking(self, job: NewJob, args: Sequence[str]) -> list[Inserted]:
        """Jobs with a unique key, of a lane or with dependencies: in a transaction of
        their own, which holds the key's and the lane's locks (two calls' locks in one
        transaction could be taken in an order another process takes the other way
        round) and the dependencies' row locks."""
        if job.after:
            await self.prepare_dependencies()

        async def insert(conn: Conn) -> list[Inserted]:
            return await insert_jobs(conn, job, args)

        # A lane's settle is one plan for every enqueue: planning it anew each time (the
        # session's force_custom_plan) cost more than running it.
        return await self._session(
            insert,
            idempotent=False,
            settings=GENERIC_PLANS if job.lane is not None else None,
        )

    async def job_claim(
        self, namespace: str, queues: Sequence[str], limit: int, worker: str, now: float
    ) -> list[Claimed]:
        return (await self.job_finish_and_claim((), namespace, queues, limit, worker, now))[1]

    async def job_finish_many(self, finishes: Sequence[Finish]) -> FinishReport:
        return (await self._finish(finishes, None))[0]

    async def _finish(
        self, finishes: Sequence[Finish], taker: Taker | None, now: float = 0.0
    ) -> tuple[FinishReport, list[Claimed]]:
        return await self._session(
            lambda conn: _finish_many(conn, finishes, self._rated, taker, now)
        )

    async def job_finish_and_claim(
        self,
        finishes: Sequence[Finish],
        namespace: str,
        queues: Sequence[str],
        limit: int,
        worker: str,
        now: float,
    ) -> tuple[FinishReport, list[Claimed]]:
        if not limit:
            return await self.job_finish_many(finishes), []
        # This process's claims run one at a time, in the order they were asked for
        # (the turn is taken before anything is awaited): two claims at once would skip
        # each other's rows, and the later one could take, and start, the later jobs
        # first. Finishes still run beside claims, except those that hand lanes' next
        # jobs over (``_hand_over``), which are claims too.
        turn = self._claims.take()
        try:
            if (listener := await self._listening()) is not None:
                listener.jobs.clear()  # anything enqueued from here on wakes us
            if not finishes:
                return FinishReport([], []), await self._claim(
                    namespace, queues, limit, worker, now, turn
                )
            # A lane freed by one of these finishes hands its next job to this worker; the
            # slots kept for that are claimed for in the same transaction if the lanes had
            # less to give.
            freeing = sum(1 for f in finishes if f.lane is not None and f.kind in _TO_HISTORY)
            taker = Taker(namespace, queues, worker, min(limit, freeing))
            # Two connections at once: the server finishes one batch while it claims the
            # next. Both run to their end before any failure is raised, so none is left
            # in flight.
            finished, claimed = await asyncio.gather(
                self._hand_over(finishes, taker, now, turn),
                self._claim(namespace, queues, limit - taker.budget, worker, now, turn),
                return_exceptions=True,
            )
            if isinstance(finished, BaseException) and isinstance(claimed, BaseException):
                raise finished
            if isinstance(finished, BaseException):
                assert not isinstance(claimed, BaseException)
                raise base.CycleHalfDone(None, claimed) from finished
            report, taken = finished
            if isinstance(claimed, BaseException):
                raise base.CycleHalfDone(report, taken) from claimed
            return report, taken + claimed
        finally:
            turn.end()

    async def _hand_over(
        self, finishes: Sequence[Finish], taker: Taker, now: float, turn: Turn
    ) -> tuple[FinishReport, list[Claimed]]:
        """Finishes whose freed lanes may hand their next jobs to this worker: a
        claim, so it waits for the claims asked for before it. Run beside one of them,
        it could make ready the job behind the one it takes, for that earlier claim to
        take and start first (in the same lane, out of id order)."""
        if taker.budget:
            await turn.wait()
        return await self._finish(finishes, taker, now)

    async def _claim(
        self, namespace: str, queues: Sequence[str], limit: int, worker: str, now: float,
        turn: Turn,
    ) -> list[Claimed]:  # fmt: skip
        await turn.wait()
        try:
            # Each statement commits by itself: the promotion need not wait for the
            # claim, and two round trips fewer (BEGIN, COMMIT) is pickup latency saved.
            return await self._session(
                lambda conn: _claim(conn, namespace, queues, limit, worker, now, self._rated),
                transaction=False,
            )
        finally:
            turn.end()

    async def job_leases(
        self,
        held: Sequence[tuple[int, int]],
        extend: Sequence[int],
        now: float,
        started: Mapping[int, float] | None = None,
        progress: Mapping[int, str] | None = None,
    ) -> Leases:
        fences, began, done = dict(held), started or {}, progress or {}
        extended: list[int] = []
        if extend:
            rows = await self._fetch(
                "job_lease_extend", ids=list(extend),
                fences=[fences.get(i, -1) for i in extend],
                started=[began.get(i) for i in extend],
                progress=[done.get(i) for i in extend], now=now,
            )  # fmt: skip
            extended = sorted(r[0] for r in rows)
        rows = await self._fetch("job_held", ids=list(fences))
        return held_leases(fences, extended, rows)

    async def job_next_due(self, namespace: str, queues: Sequence[str]) -> float | None:
        rows = await self._fetch("job_next_due", namespace=namespace, queues=list(queues))
        return None if rows[0][0] is None else float(rows[0][0])

    async def wait_for_change(self, within: float, *, patient: bool = False) -> bool:
        listener = await self._listening()
        if listener is None:  # no notifications right now: the caller's timeout polls
            await asyncio.sleep(within)
            return False
        return await _wait(listener.jobs, within)

    async def wait_for_finish(self, within: float, poll: float) -> None:
        listener = await self._listening()
        if listener is None:
            await asyncio.sleep(min(poll, within))
            return
        await _wait(listener.done, min(within, 1.0))
        listener.done.clear()

    async def _listening(self) -> _Listener | None:
        if self._listener is None:
            self._listener = _Listener(self.url)
        return self._listener if await self._listener.ready() else None

    # -- reads and operator actions ---------------------------------------------

    async def job_get(self, job_id: int) -> Job | None:
        # One snapshot, so a job moving to history meanwhile is seen once.
        return await self._session(lambda conn: _get(conn, job_id), isolation="repeatable_read")

    async def prepare_dependencies(self) -> None:
        if self._dependency_trigger:
            return

        async def make(conn: Conn) -> None:
            if not await conn.fetchval(Q["dependency_trigger_exists"].sql):
                await conn.execute(Q["dependency_trigger"].sql)
                log.info("created the history's trigger that resolves dependencies")

        await self._session(make, transaction=False)
        self._dependency_trigger = True

    async def job_dependencies(self, job_id: int) -> Dependencies:
        async def edges(conn: Conn) -> list[Any]:
            return await _run(conn, Q["job_dependencies"], id=job_id)

        return dependencies_from_rows(await self._session(edges, isolation="repeatable_read"))

    async def job_dependency_results(self, job_id: int) -> list[str | None]:
        async def results(conn: Conn) -> list[str | None]:
            rows = await _run(conn, Q["job_dependency_results"], id=job_id)
            return [result if state == "succeeded" else None for _, state, result in rows]

        return await self._session(results, isolation="repeatable_read")

    async def job_list(self, where: JobFilter) -> list[Job]:
        sql, params = list_query(where)
        statement = positional(sql)
        rows = await self._session(
            lambda conn: _run(conn, statement, **params), isolation="repeatable_read"
        )
        return [job_from_row(row) for row in rows]

    async def job_cancel(self, job_id: int, now: float) -> Job:
        return await self._session(lambda conn: flows.cancel(ConnSession(conn), job_id, now))

    async def job_respawn(
        self,
        job_ids: Sequence[int],
        now: float,
        expires_at: float | None = None,
        max_tries: int | None = None,
    ) -> list[int]:
        async def respawn(conn: Conn) -> list[int]:
            run = _runner(conn)
            in_lanes = {(r[0], r[1]) for r in await _run(conn, Q["lane_of_history"], ids=ids)}
            await lanes.lock(run, in_lanes)
            rows = await _run(conn, Q["job_respawn"], ids=ids, now=now, expires_at=expires_at,
                              max_tries=max_tries)  # fmt: skip
            moved = [r[0] for r in rows]
            # A job in a lane comes back waiting, ahead of the later jobs by its id; the
            # one that halted its lane resumes at once.
            released = await lanes.release(run, moved)
            if released:
                await run(Q["lane_resume"], {"ids": list(released.values()), "now": now})
            await lanes.settle(run, in_lanes | released.keys(), now)
            return moved

        ids = list(job_ids)
        moved = set(await self._session(respawn))
        return [i for i in job_ids if i in moved]

    async def job_purge(self, job_ids: Sequence[int], now: float) -> int:
        async def purge(conn: Conn) -> int:
            run = _runner(conn)
            in_lanes = {(r[0], r[1]) for r in await _run(conn, Q["lane_of_history"], ids=ids)}
            await lanes.lock(run, in_lanes)
            purged = [r[0] for r in await _run(conn, Q["job_purge"], ids=ids)]
            await lanes.settle(run, set(await lanes.release(run, purged)), now)
            return len(purged)

        ids = list(job_ids)
        return await self._session(purge)

    # -- queues as the HTTP API sees them ----------------------------------------

    async def job_take(
        self, namespace: str, queue: str, limit: int, worker: str, ttr: float, now: float
    ) -> list[Job]:
        if limit <= 0:
            return []
        if (listener := await self._listening()) is not None:
            listener.jobs.clear()  # as job_finish_and_claim: what is enqueued next wakes us

        async def take(conn: Conn) -> list[Job]:
            # Each statement commits by itself, as a claim's do.
            await _run(conn, Q["job_promote_due_queues"], namespace=namespace, queues=[queue],
                       now=now, limit=1000)  # fmt: skip
            params = {"limit": limit, "worker": worker, "ttr": ttr, "now": now}
            rows: list[Any] = []
            if not self._rated.known(namespace):
                rows = await _run(conn, Q["job_take"], namespace=namespace, queue=queue, **params)
            if not rows and await _rated(conn, namespace, self._rated):
                rows = await _gated(conn, namespace, [queue], "job_take_ids", params, self._rated)
            return sorted(map(job_from_row, rows), key=lambda job: (job.order_time, job.id))

        return await self._session(take, transaction=False)

    async def job_ack(
        self, namespace: str, queue: str, job_ids: Sequence[int], now: float
    ) -> list[int]:
        async def ack(conn: Conn) -> set[int]:
            run = _runner(conn)
            await lanes.lock_jobs(run, ids)  # the lanes before the rows
            rows = await _run(conn, Q["job_ack"], ids=ids, namespace=namespace, queue=queue,
                              state=State.SUCCEEDED.value, now=now)  # fmt: skip
            await lanes.settle(run, {(r[1], r[2]) for r in rows if r[2] is not None}, now,
                               locked=True)  # fmt: skip
            if rows:
                await conn.execute(f"SELECT pg_notify('{DONE_CHANNEL}', '')")
            return {r[0] for r in rows}

        ids = list(dict.fromkeys(job_ids))
        moved = await self._session(ack) if ids else set()
        return [i for i in ids if i in moved]

    async def queue_peek(self, namespace: str, queue: str, now: float) -> Job | None:
        rows = await self._fetch("queue_peek", namespace=namespace, queue=queue, now=now)
        return job_from_row(rows[0]) if rows else None

    async def queue_size(self, namespace: str, queue: str, state: State) -> int:
        name = "queue_size_history" if State(state).terminal else "queue_size_hot"
        rows = await self._fetch(name, namespace=namespace, queue=queue, state=State(state).value)
        return int(rows[0][0])

    async def queue_clear(self, namespace: str, queue: str, now: float) -> int:
        async def clear(conn: Conn) -> int:
            run = _runner(conn)
            key = {"namespace": namespace, "queue": queue}
            in_lanes = [r[0] for r in await _run(conn, Q["queue_clear_lanes"], **key)]
            await lanes.lock(run, {(namespace, lane) for lane in in_lanes})
            rows = await _run(conn, Q["queue_clear"], **key, lanes=in_lanes,
                              state=State.CANCELLED.value, now=now)  # fmt: skip
            await lanes.settle(run, {(r[1], r[2]) for r in rows if r[2] is not None}, now,
                               locked=True)  # fmt: skip
            return len(rows)

        return await self._session(clear)

    async def dead_oldest(self, namespace: str, queue: str, limit: int) -> list[int]:
        rows = await self._fetch("dead_oldest", namespace=namespace, queue=queue, limit=limit)
        return [r[0] for r in rows]

    # -- tokens ------------------------------------------------------------------

    async def token_create(self, token: base.Token) -> bool:
        params = {column: getattr(token, column) for column in TOKEN_COLUMNS}
        # Not repeated after a connection lost half-way: it would then find its own row.
        return await self._session(
            lambda conn: _returns_a_row(conn, "token_create", params),
            transaction=False, idempotent=False,
        )  # fmt: skip

    async def token_get(self, digest: str) -> base.Token | None:
        rows = await self._fetch("token_get", digest=digest)
        return base.Token(*rows[0]) if rows else None

    async def token_list(self, namespace: str | None) -> list[base.Token]:
        if namespace is None:
            return [base.Token(*row) for row in await self._fetch("token_list_all")]
        return [base.Token(*row) for row in await self._fetch("token_list", namespace=namespace)]

    async def token_delete(self, namespace: str, digest: str) -> bool:
        return bool(await self._fetch("token_delete", namespace=namespace, digest=digest))

    async def token_limit_set(
        self, digest: str, read: int | None, write: int | None, interval: float | None
    ) -> bool:
        rows = await self._fetch("token_limit_set", digest=digest, limit_read=read,
                                 limit_write=write, limit_interval=interval)  # fmt: skip
        return bool(rows)

    # -- lanes -------------------------------------------------------------------

    async def lane_rules(self, namespace: str) -> list[LaneRule]:
        return (await self._session(lambda conn: lanes.rules(_runner(conn), [namespace]))).get(
            namespace, []
        )

    async def lane_rule_set(self, namespace: str, rule: LaneRule, now: float) -> None:
        async def set_rule(conn: Conn) -> None:
            await _run(conn, Q["lane_rule_set"], namespace=namespace, now=now,
                       **rule_params(rule))  # fmt: skip
            await lanes.settle(_runner(conn), await _matching(conn, namespace, rule.pattern), now)

        await self._session(set_rule)

    async def lane_rule_delete(self, namespace: str, pattern: str, now: float) -> bool:
        async def delete(conn: Conn) -> bool:
            status = await conn.execute(Q["lane_rule_delete"].sql, namespace, pattern)
            if status.split()[-1] == "0":
                return False
            await lanes.settle(_runner(conn), await _matching(conn, namespace, pattern), now)
            return True

        return await self._session(delete)

    async def lane_window(self, namespace: str, lane: str) -> LaneWindow:
        rows = await self._fetch("lane_window", namespace=namespace, lane=lane)
        return lane_window(rows[0] if rows else None)

    async def lane_view(self, namespace: str, lane: str) -> LaneView:
        found = await self._session(lambda conn: lanes.views(_runner(conn), [(namespace, lane)]))
        return found[0]

    async def lane_ahead(self, namespace: str, lane: str, job_id: int) -> int:
        rows = await self._fetch("lane_ahead", namespace=namespace, lane=lane, id=job_id)
        return int(rows[0][0])

    async def lane_list(self, namespace: str, limit: int) -> list[LaneInfo]:
        return await self._session(
            lambda conn: flows.lane_list(ConnSession(conn), namespace, limit),
            isolation="repeatable_read",
        )

    async def job_counts(self, namespace: str | None) -> dict[tuple[str, str, str], int]:
        # One snapshot: a fold committing meanwhile is counted whole or not at all.
        return await self._session(
            lambda conn: flows.job_counts(ConnSession(conn), namespace),
            isolation="repeatable_read",
        )

    # -- maintenance -------------------------------------------------------------

    async def job_promote_due(self, now: float, limit: int) -> int:
        status = await self._execute("job_promote_due", now=now, limit=limit)
        return int(status.split()[-1])

    async def job_expired_leases(self, now: float, limit: int) -> list[Claimed]:
        rows = await self._fetch("job_expired_leases", now=now, limit=limit)
        return [Claimed(*row) for row in rows]

    async def job_expire(self, now: float, limit: int) -> list[int]:
        async def expire(conn: Conn) -> list[int]:
            run = _runner(conn)
            found = await _run(conn, Q["job_expire_candidates"], now=now, limit=limit)
            await lanes.lock(run, {(r[1], r[2]) for r in found if r[2] is not None})
            moved = await _run(conn, Q["job_expire"], ids=[r[0] for r in found], now=now)
            await lanes.settle(run, {(r[1], r[2]) for r in moved if r[2] is not None}, now)
            return sorted(r[0] for r in moved)

        return await self._session(expire)

    async def history_ensure_partitions(self, now: float) -> None:
        await self._session(lambda conn: partitions.ensure(conn, now), transaction=False)

    async def history_prune(self, before: float, limit: int) -> int:
        async def prune(conn: Conn) -> int:
            await partitions.ensure(conn, time.time())
            pruned = await partitions.prune(conn, before, limit)
            if pruned:
                await _run(conn, Q["deps_prune"])
            await _run(conn, Q["lane_windows_prune"], before=before)
            return pruned

        return await self._session(prune, transaction=False)

    async def history_fold(self, now: float) -> int:
        return await self._session(lambda conn: partitions.fold(conn, now), transaction=False)

    async def leader_acquire(self, name: str, holder: str, ttl: float, now: float) -> bool:
        # Maintenance and the periodic loop lead through this one connection, which runs
        # one statement at a time: they take turns.
        async with self._leading_turn:
            return await self._leader_acquire(name)

    async def _leader_acquire(self, name: str) -> bool:
        try:
            if self._leader is None or self._leader.is_closed():
                self._leader, self._leading = await self._leader_connection(), set()
            if name in self._leading:
                await self._leader.execute("SELECT 1")  # keeps the idle timeout away
                return True
            if await self._leader.fetchval(Q["leader_try"].sql, name):
                self._leading.add(name)
                return True
            return False
        except (*_CONNECTION_LOST, asyncpg.PostgresError) as exc:
            if self._leader is not None:
                self._leader.terminate()  # whatever state it is in, the lock goes with it
            self._leader, self._leading = None, set()
            raise StoreError(f"leadership check failed, not leading: {one_line(exc)}") from exc

    async def _leader_connection(self) -> Conn:
        conn = await asyncpg.connect(self.url)
        try:
            await conn.execute(f"SET idle_session_timeout = '{LEADER_IDLE_TIMEOUT}'")
        except asyncpg.UndefinedObjectError:  # before PostgreSQL 14: no such setting
            log.warning("this PostgreSQL has no idle_session_timeout: a frozen leader "
                        "keeps its lock until its connection ends")  # fmt: skip
        except BaseException:  # cancelled or failed: never leave it open
            conn.terminate()
            raise
        return conn

    async def leader_release(self, name: str, holder: str) -> None:
        async with self._leading_turn:
            if self._leader is not None and name in self._leading:
                self._leading.discard(name)
                with contextlib.suppress(Exception):
                    await self._leader.fetchval(Q["leader_unlock"].sql, name)

    # -- periodic tasks ----------------------------------------------------------

    async def periodic_sync(
        self, namespace: str, entries: Sequence[base.PeriodicEntry], now: float
    ) -> list[base.PeriodicState]:
        async def sync(conn: Conn) -> list[base.PeriodicState]:
            await _run(
                conn, Q["periodic_upsert"], namespace=namespace, now=now,
                tasks=[e.task for e in entries], schedules=[e.schedule for e in entries],
                queues=[e.queue for e in entries], catch_ups=[e.catch_up for e in entries],
            )  # fmt: skip
            rows = await _run(conn, Q["periodic_list"], namespace=namespace)
            return [base.PeriodicState(*row) for row in rows]

        return await self._session(sync)

    async def periodic_advance(
        self, namespace: str, task: str, checked_from: float, advance: base.PeriodicAdvance
    ) -> bool:
        rows = await self._fetch(
            "periodic_advance", namespace=namespace, task=task, checked_from=checked_from,
            checked_until=advance.checked_until, next_tick=advance.next_tick,
            now=advance.updated_at, last_tick=advance.last_tick, last_job=advance.last_job,
        )  # fmt: skip
        return bool(rows)

    async def periodic_list(self, namespace: str) -> list[base.PeriodicState]:
        rows = await self._fetch("periodic_list", namespace=namespace)
        return [base.PeriodicState(*row) for row in rows]

    # -- workers -----------------------------------------------------------------

    async def worker_beat(self, worker: WorkerInfo) -> None:
        await self._execute(
            "worker_beat", id=worker.id, namespace=worker.namespace,
            queues=json.dumps(worker.queues), host=worker.host, pid=worker.pid,
            concurrency=worker.concurrency, started_at=worker.started_at,
            heartbeat_at=worker.heartbeat_at, running=json.dumps(worker.running),
            stats=json.dumps(worker.stats),
        )  # fmt: skip

    async def worker_remove(self, worker_id: str) -> None:
        await self._execute("worker_remove", id=worker_id)

    async def worker_list(self, alive_since: float | None = None) -> list[WorkerInfo]:
        rows = await self._fetch("worker_list", since=alive_since or 0.0)
        return [worker_from_row(r) for r in rows]

    async def worker_prune(self, dead_before: float) -> int:
        status = await self._execute("worker_prune", before=dead_before)
        return int(status.split()[-1])


# -- statements on one connection ------------------------------------------------


def _usable(conn: Conn) -> bool:
    """Whether a connection kept out of the pool still works: asyncpg gives the
    pool back a connection the server ended, and its proxy then refuses every call."""
    try:
        return not conn.is_closed()
    except asyncpg.InterfaceError:
        return False


async def _give_back(pool: asyncpg.Pool, conn: Conn) -> None:
    with contextlib.suppress(Exception):  # given back already, with its connection gone
        await pool.release(conn)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _of_psycopg(error: BaseException) -> bool:
    return type(error).__module__.startswith("psycopg")


def _session_settings(url: str) -> dict[str, str]:
    """SESSION_SETTINGS, less those the URL's query sets: asyncpg sends a query
    parameter it does not know to the server as a setting, unless told otherwise."""
    given = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)
    return {name: value for name, value in SESSION_SETTINGS.items() if name not in given}


def _runner(conn: Conn) -> lanes.Run:
    return lambda statement, params: _run(conn, statement, **params)


async def _reset(conn: Conn) -> None:
    """What a connection needs on its way back to the pool: nothing, but for a
    transaction an operation was cut off in. Pooled connections hold no session state
    (locks are transaction-scoped; LISTEN and leadership have connections of their own),
    so the driver's default reset, a round trip on every release, is skipped."""
    if conn.is_in_transaction():
        await conn.execute("ROLLBACK")


async def _run(conn: Conn, statement: Statement, **params: Any) -> list[Any]:
    return list(await conn.fetch(statement.sql, *statement.args(params)))


@contextlib.asynccontextmanager
async def _transaction_with(conn: Conn, settings: str) -> AsyncIterator[None]:
    """A transaction begun together with ``SET LOCAL settings``, in one round trip
    (asyncpg's ``transaction()`` sends BEGIN alone): committed if the block ends
    normally, else rolled back. A lost connection cannot be; its server ends the
    transaction, and the pool's ``_reset`` catches any other left open."""
    await conn.execute(f"BEGIN; SET LOCAL {settings}")
    try:
        yield
    except BaseException:
        with contextlib.suppress(*_CONNECTION_LOST):
            await conn.execute("ROLLBACK")
        raise
    await conn.execute("COMMIT")


async def insert_jobs(conn: Conn, job: NewJob, args: Sequence[str]) -> list[Inserted]:
    """Insert on ``conn`` (asyncpg), with one NOTIFY for all. With a unique_key or a
    lane it must be inside a transaction, which holds their locks until it ends."""
    return await insert_with(_runner(conn), job, args)


async def insert_with(
    run: Callable[[Statement, dict[str, Any]], Awaitable[list[Any]]],
    job: NewJob,
    args: Sequence[str],
) -> list[Inserted]:
    """The insert, over any driver: ``run`` executes one statement and returns rows.
    A job with a unique key goes through ``flows.insert_unique``, one with
    dependencies through ``flows.insert_after``."""
    if not args:
        return []
    if job.after:

        async def insert_held(held: NewJob, rest: Sequence[str]) -> list[Inserted]:
            return await insert_with(run, dataclasses.replace(held, after=()), rest)

        return await flows.insert_after(RunSession(run), job, args, insert_held)
    if job.unique_key is not None:

        async def insert(first: Sequence[str]) -> int:
            return (await _insert_rows(run, job, first))[0]

        return await flows.insert_unique(RunSession(run), job, args, insert)
    return [Inserted(i, True) for i in await _insert_rows(run, job, args)]


async def _insert_rows(run: lanes.Run, job: NewJob, args: Sequence[str]) -> list[int]:
    # The insert takes the lane's lock itself, before its first row (again, harmlessly,
    # after the unique key's path).
    params = {name: getattr(job, name) for name in Q["job_insert_batch"].names if name != "args"}
    params.update(state=job.state.value, args=list(args))
    ids: list[int] = (await run(Q["job_insert_batch"], params))[0][0]
    if job.lane is not None:  # inserted waiting: the lane admits what it has room for
        await lanes.settle(run, {(job.namespace, job.lane)}, job.created_at, locked=True)
    return ids


async def _claim(
    conn: Conn, namespace: str, queues: Sequence[str], limit: int, worker: str, now: float,
    rated: _Rated,
) -> list[Claimed]:  # fmt: skip
    await _run(conn, Q["job_promote_due_queues"], namespace=namespace, queues=list(queues),
               now=now, limit=1000)  # fmt: skip
    if limit <= 0:  # freed lanes may take every slot: promoting is all there is to do
        return []
    return await _claim_ready(conn, namespace, queues, limit, worker, now, rated)


async def _claim_ready(
    conn: Conn, namespace: str, queues: Sequence[str], limit: int, worker: str, now: float,
    rated: _Rated,
) -> list[Claimed]:  # fmt: skip
    """The first ready jobs of ``queues``. The plain claim takes nothing in a namespace
    with a lane rate (its guard): then, and at once for a namespace seen with one
    (``rated``), the jobs are picked and pass the rate gate first (``_gated``)."""
    params = {"limit": limit, "now": now, "worker": worker}
    rows: list[Any] = []
    if not rated.known(namespace):
        if len(queues) == 1:
            rows = await _run(conn, Q["job_claim_queue"], namespace=namespace, queue=queues[0],
                              **params)  # fmt: skip
        else:
            rows = await _run(conn, Q["job_claim_queues"], namespace=namespace,
                              queues=list(queues), **params)  # fmt: skip
    if not rows and await _rated(conn, namespace, rated):
        rows = await _gated(conn, namespace, queues, "job_claim", params, rated)
    return sorted((Claimed(*row) for row in rows), key=lambda c: (c.order_time, c.id))


class _Rated:
    """The namespaces seen with a lane rate in the last ``RATED_FOR`` seconds: their
    claims go to the gate at once (the plain claim's guard finds nothing for them
    first). A namespace whose rates are gone claims plainly again after that."""

    def __init__(self) -> None:
        self._seen: dict[str, float] = {}

    def known(self, namespace: str) -> bool:
        return self._seen.get(namespace, -math.inf) > time.monotonic() - RATED_FOR

    def saw(self, namespace: str, rated: bool) -> None:
        if rated:
            self._seen[namespace] = time.monotonic()
        else:
            self._seen.pop(namespace, None)


async def _rated(conn: Conn, namespace: str, rated: _Rated) -> bool:
    """Whether a rule of the namespace has a rate (remembered in ``rated``)."""
    if rated.known(namespace):
        return True
    found = bool((await _run(conn, Q["lane_rated"], namespace=namespace))[0][0])
    rated.saw(namespace, found)
    return found


async def _gated(
    conn: Conn, namespace: str, queues: Sequence[str], statement: str, params: dict[str, Any],
    rated: _Rated,
) -> list[Any]:  # fmt: skip
    """Claim (``statement``: job_claim or job_take_ids) what the rate gate lets start of
    the ready jobs picked, in a transaction (a savepoint in a finish's): the picked rows
    stay locked until the gate's decisions commit with the claim."""
    async with conn.transaction():
        picked = await _run(conn, Q["job_pick"], namespace=namespace, queues=list(queues),
                            limit=params["limit"], now=params["now"])  # fmt: skip
        ids, still = await flows.rate_gate(ConnSession(conn), namespace, picked, params["now"])
        if still is not None:
            rated.saw(namespace, still)
        if not ids:
            return []
        return await _run(conn, Q[statement], ids=json.dumps(ids), **{
            k: v for k, v in params.items() if k != "limit"
        })  # fmt: skip


async def _finish_many(
    conn: Conn, finishes: Sequence[Finish], rated: _Rated, taker: Taker | None = None,
    now: float = 0.0,
) -> tuple[FinishReport, list[Claimed]]:  # fmt: skip
    """Write ``finishes``; what freed lanes hand to ``taker``, and the ready jobs that
    make up the rest of its budget (claimed at ``now``), come back as claimed."""
    run = _runner(conn)
    # Lanes first, rows after: the locks of the lanes of every job in the batch, found
    # from the jobs' rows (``Finish.lane`` is not relied on), before any row is
    # touched; taken by the first statement, or by one of their own when no finish
    # of the batch moves to history.
    every = [f.id for f in finishes]
    ended = _Ended()
    to_history = [f for f in finishes if f.kind in _TO_HISTORY]
    if not to_history:
        await lanes.lock_jobs(run, every)
    else:
        rows = await _run(
            conn, Q["job_finish_batch_to_history"], lock_ids=every,
            ids=[f.id for f in to_history], fences=[f.fence for f in to_history],
            states=[f.kind for f in to_history], results=[f.result for f in to_history],
            errors=[None if f.error is None else json.dumps(f.error) for f in to_history],
            started=[f.started_at for f in to_history],
            finished=[f.finished_at for f in to_history],
        )  # fmt: skip
        for job_id, namespace, lane, state in rows:
            ended.add(job_id, namespace, lane, state)
    for finish in finishes:
        if finish.kind in _TO_HISTORY:
            continue
        cancel = {"id": finish.id, "fence": finish.fence, "state": "cancelled",
                  "now": finish.finished_at}  # fmt: skip
        if cancelled := await _run(conn, Q["job_cancel_if_requested"], **cancel):
            ended.add(finish.id, cancelled[0][1], cancelled[0][2], "cancelled")
            continue
        name, params = requeue_statement(finish)
        ended.accepted.extend(r[0] for r in await _run(conn, Q[name], **params))
    done = set(ended.accepted)
    notify = bool(to_history and done)
    taken: list[Claimed] = []
    if ended.lanes:
        ended_at = max(f.finished_at for f in finishes)
        taken = await lanes.settle(run, ended.lanes, ended_at, ended.dead, locked=True,
                                   taker=taker, notify_done=notify)  # fmt: skip
    elif notify:
        await conn.execute(f"SELECT pg_notify('{DONE_CHANNEL}', '')")
    if taker is not None and taker.budget > 0:
        # No lock is waited for: the claim skips rows others hold.
        taken += await _claim_ready(conn, taker.namespace, taker.queues, taker.budget,
                                    taker.worker, now, rated)  # fmt: skip
    stale = [f.id for f in finishes if f.id not in done]
    return FinishReport([f.id for f in finishes if f.id in done], stale), taken


class _Ended:
    """What a batch of finishes did: the jobs it moved, the lanes that have room now,
    and the deaths that may halt a lane."""

    def __init__(self) -> None:
        self.accepted: list[int] = []
        self.lanes: set[lanes.Key] = set()
        self.dead: dict[lanes.Key, list[int]] = {}

    def add(self, job_id: int, namespace: str, lane: str | None, state: str) -> None:
        self.accepted.append(job_id)
        if lane is not None:
            self.lanes.add((namespace, lane))
            if state == "dead":
                self.dead.setdefault((namespace, lane), []).append(job_id)


async def _returns_a_row(conn: Conn, name: str, params: dict[str, Any]) -> bool:
    return bool(await _run(conn, Q[name], **params))


async def _matching(conn: Conn, namespace: str, pattern: str) -> set[lanes.Key]:
    """The lanes with hot jobs that a rule's pattern names."""
    if not pattern.endswith("*"):
        return {(namespace, pattern)}
    rows = await _run(conn, Q["lane_names"], namespace=namespace, prefix=pattern[:-1])
    return {(namespace, r[0]) for r in rows}


async def _get(conn: Conn, job_id: int) -> Job | None:
    rows = await _run(conn, Q["job_get_hot"], id=job_id)
    if not rows:
        rows = await _run(conn, Q["job_get_history"], id=job_id)
    return job_from_row(rows[0]) if rows else None


async def _wait(event: asyncio.Event, within: float) -> bool:
    try:
        async with asyncio.timeout(within):
            await event.wait()
        return True
    except TimeoutError:
        return False


class _Listener:
    """A connection that LISTENs, re-established in the background when it drops."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.jobs = asyncio.Event()
        self.done = asyncio.Event()
        self.conn: Conn | None = None
        self._retry_at = 0.0
        self._connecting = asyncio.Lock()
        self._faults = FaultLog(log)

    async def ready(self) -> bool:
        if self.conn is not None and not self.conn.is_closed():
            self._faults.succeeded("LISTEN for wake-ups (polling meanwhile)")
            return True
        async with self._connecting:  # one connection, however many callers ask at once
            return await self._connect()

    async def _connect(self) -> bool:
        if self.conn is not None and not self.conn.is_closed():
            return True
        if time.monotonic() < self._retry_at:
            return False
        try:
            # Once connected, close() sees the connection, even if we are cancelled.
            self.conn = await asyncpg.connect(self.url)
            try:
                # A server shutting down may accept the connection and then end it here.
                await self.conn.add_listener(JOBS_CHANNEL, self._on_jobs)
                await self.conn.add_listener(DONE_CHANNEL, self._on_done)
            except asyncio.CancelledError:
                # A wait cancelled here would leave a connection that listens to
                # nothing, taken for a listening one from then on: none is better.
                conn, self.conn = self.conn, None
                conn.terminate()
                raise
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            await self.close()
            self._faults.failed("LISTEN for wake-ups (polling meanwhile)", exc)
            self._retry_at = time.monotonic() + 1.0
            return False
        self._faults.succeeded("LISTEN for wake-ups (polling meanwhile)")
        self.jobs.set()  # anything may have happened while we were not listening
        self.done.set()
        return True

    def _on_jobs(self, *_: object) -> None:
        self.jobs.set()

    def _on_done(self, *_: object) -> None:
        self.done.set()

    async def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()
