"""The PostgreSQL backend: many workers on many machines, one database; the Store,
laid out in rooms.

- ``connection``: the pools, the settings of their sessions, riding out restarts;
- ``inserts`` (and ``on_thread``, a sync caller's own connection): enqueues,
  committed together when calls come at once; ``external``: enqueue on the
  application's own connection, in its transaction;
- ``claims``: the worker's cycle (finishes, hand-overs, claims), leases, HTTP takes;
- ``lanes``: settling lanes after a change, under each lane's lock;
- ``waits``: LISTEN (or, behind a transaction pooler without a direct URL, a poll),
  for the waits of idle workers and result waiters;
- ``operations``: reads and operator actions; ``maintenance``: the leader's duties
  and leadership; ``partitions``: the history's daily partitions;
- ``pooler``: what ``?pooler=`` changes (``connection.PooledConn`` does the rest);
- ``session``: the flows written once for both backends (ferryq.store.flows).

SQLite's backend has the same rooms (ferryq/store/sqlite/), so a behaviour can be
read side by side. This class only routes each call to its room.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping, Sequence

import asyncpg

from ferryq.errors import StoreError
from ferryq.job import Job, State
from ferryq.lanes import LaneRule, LaneView
from ferryq.store import base, flows
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
from ferryq.store.postgres import claims, identity, maintenance, operations, partitions
from ferryq.store.postgres.claims import Claims
from ferryq.store.postgres.connection import RECONNECT_SECONDS, Budget, Conn, Database, run
from ferryq.store.postgres.inserts import Inserts
from ferryq.store.postgres.maintenance import Leadership, LeaseLeadership
from ferryq.store.postgres.queries import MIGRATIONS, Q
from ferryq.store.postgres.session import ConnSession
from ferryq.store.postgres.waits import Waits
from ferryq.store.sql import TOKEN_COLUMNS, job_from_row, lane_window, worker_from_row

log = logging.getLogger("ferryq.store.postgres")


class PostgresStore(base.Store):
    """``direct_url``: the same database without a pooler in between, for LISTEN (see
    docs/operations.md, "Behind a connection pooler")."""

    def __init__(self, url: str, *, direct_url: str | None = None) -> None:
        self.url = url
        self._db = db = Database(url)
        self._direct_url = direct_url
        self._identity: tuple[str, ...] | None = None  # database_identity's, once read
        self._inserts = Inserts(db)
        # Behind a transaction pooler LISTEN needs the direct URL; without one, waits poll.
        listen_url = direct_url or (None if db.pooling.transaction else db.url)
        db.budget = Budget.of(db.pooling.connections, session=listen_url is not None)
        self._waits = Waits(listen_url, db)
        self._claims = Claims(db, self._waits)
        # Leadership's advisory locks live on the listening connection, a session of
        # the server's own; behind a transaction pooler, a lease row instead.
        self._leadership: Leadership | LeaseLeadership = (
            LeaseLeadership(db) if db.pooling.transaction else Leadership(self._waits.session)
        )

    @classmethod
    def from_url(cls, url: str, direct_url: str | None = None) -> PostgresStore:
        if direct_url is not None:
            direct_url = direct_url.replace("postgres://", "postgresql://", 1)
        return cls(url.replace("postgres://", "postgresql://", 1), direct_url=direct_url)

    @property
    def safe_url(self) -> str:
        return self._db.safe_url

    # -- lifecycle ---------------------------------------------------------------

    async def open(self, migrate: bool = True) -> None:
        if self._db.ready:
            return
        async with self._db.opening:  # callers racing to open share one pool
            if not self._db.ready:
                await self._open(migrate)
                self._db.ready = True

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
            await self._db.connect()
            if self._direct_url is not None:
                await identity.check_direct(self._db, self._direct_url)
            self._inserts.open()
            if migrate:
                await self.migrate()
                await self.history_ensure_partitions(time.time())
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        self._db.ready = False  # new enqueues are refused; those under way end first
        await self._inserts.close()
        await self._db.give_back_kept()
        await self._waits.close()
        await self._leadership.close()
        await self._db.close()

    def terminate(self) -> None:
        self._db.ready = False
        self._inserts.terminate()
        self._leadership.terminate()
        self._waits.terminate()
        self._db.terminate()

    def refuses(self, error: BaseException) -> bool:
        return self._db.refuses(error)

    async def reserve(self) -> None:
        await self._db.reserve()
        await self._waits.reserve()

    async def migrate(self) -> list[int]:
        return await self._db.session(
            lambda conn: flows.migrate(ConnSession(conn), MIGRATIONS, time.time())
        )

    async def schema_version(self) -> int:
        return await self._db.session(
            lambda conn: flows.schema_version(ConnSession(conn)), transaction=False
        )

    # -- the hot path: enqueue, claim, finish, leases ------------------------------

    async def job_insert_many(self, job: NewJob, args: Sequence[str]) -> list[Inserted]:
        return await self._inserts.insert_async(job, args)

    inserts_blocking: bool = True

    def job_insert_blocking(self, job: NewJob, args: Sequence[str]) -> list[Inserted]:
        return self._inserts.insert_blocking(job, args)

    async def job_claim(
        self, namespace: str, queues: Sequence[str], limit: int, worker: str, now: float
    ) -> list[Claimed]:
        return (await self.job_finish_and_claim((), namespace, queues, limit, worker, now))[1]

    async def job_finish_many(self, finishes: Sequence[Finish]) -> FinishReport:
        return await self._claims.finish_many(finishes)

    async def job_finish_and_claim(
        self,
        finishes: Sequence[Finish],
        namespace: str,
        queues: Sequence[str],
        limit: int,
        worker: str,
        now: float,
    ) -> tuple[FinishReport, list[Claimed]]:
        return await self._claims.finish_and_claim(finishes, namespace, queues, limit, worker, now)

    async def job_leases(
        self,
        held: Sequence[tuple[int, int]],
        extend: Sequence[int],
        now: float,
        started: Mapping[int, float] | None = None,
        progress: Mapping[int, str] | None = None,
    ) -> Leases:
        return await claims.leases(self._db, dict(held), extend, now, started or {},
                                   progress or {})  # fmt: skip

    async def job_next_due(self, namespace: str, queues: Sequence[str]) -> float | None:
        return await self._db.session(claims.next_due, namespace, queues, transaction=False)

    async def wait_for_change(self, within: float, *, patient: bool = False) -> bool:
        return await self._waits.wait_for_change(within)

    async def wait_for_finish(self, within: float, poll: float) -> None:
        await self._waits.wait_for_finish(within, poll)

    # -- reads and operator actions ---------------------------------------------

    async def job_get(self, job_id: int) -> Job | None:
        # One snapshot, so a job moving to history meanwhile is seen once.
        return await self._db.session(operations.get, job_id, isolation="repeatable_read")

    async def prepare_dependencies(self) -> None:
        await self._inserts.prepare_dependencies()

    async def job_dependencies(self, job_id: int) -> Dependencies:
        return await self._db.session(operations.dependencies, job_id, isolation="repeatable_read")

    async def job_dependency_results(self, job_id: int) -> list[str | None]:
        return await self._db.session(
            operations.dependency_results, job_id, isolation="repeatable_read"
        )

    async def job_list(self, where: JobFilter) -> list[Job]:
        return await self._db.session(operations.job_list, where, isolation="repeatable_read")

    async def job_cancel(self, job_id: int, now: float) -> Job:
        return await self._db.session(operations.cancel, job_id, now)

    async def job_respawn(
        self,
        job_ids: Sequence[int],
        now: float,
        expires_at: float | None = None,
        max_tries: int | None = None,
    ) -> list[int]:
        moved = await self._db.session(
            operations.respawn, list(job_ids), now, expires_at, max_tries
        )
        return [i for i in job_ids if i in moved]

    async def job_purge(self, job_ids: Sequence[int], now: float) -> int:
        return await self._db.session(operations.purge, list(job_ids), now)

    async def job_counts(self, namespace: str | None) -> dict[tuple[str, str, str], int]:
        # One snapshot: a fold committing meanwhile is counted whole or not at all.
        return await self._db.session(operations.counts, namespace, isolation="repeatable_read")

    # -- queues as the HTTP API sees them ----------------------------------------

    async def job_take(
        self, namespace: str, queue: str, limit: int, worker: str, ttr: float, now: float
    ) -> list[Job]:
        if limit <= 0:
            return []
        return await self._claims.take(namespace, queue, limit, worker, ttr, now)

    async def job_ack(
        self, namespace: str, queue: str, job_ids: Sequence[int], now: float
    ) -> list[int]:
        ids = list(dict.fromkeys(job_ids))
        moved = await self._db.session(claims.ack, namespace, queue, ids, now) if ids else set()
        return [i for i in ids if i in moved]

    async def queue_peek(self, namespace: str, queue: str, now: float) -> Job | None:
        rows = await self._db.fetch("queue_peek", namespace=namespace, queue=queue, now=now)
        return job_from_row(rows[0]) if rows else None

    async def queue_size(self, namespace: str, queue: str, state: State) -> int:
        name = "queue_size_history" if State(state).terminal else "queue_size_hot"
        rows = await self._db.fetch(name, namespace=namespace, queue=queue,
                                    state=State(state).value)  # fmt: skip
        return int(rows[0][0])

    async def queue_clear(self, namespace: str, queue: str, now: float) -> int:
        return await self._db.session(operations.queue_clear, namespace, queue, now)

    async def dead_oldest(self, namespace: str, queue: str, limit: int) -> list[int]:
        rows = await self._db.fetch("dead_oldest", namespace=namespace, queue=queue, limit=limit)
        return [r[0] for r in rows]

    # -- tokens ------------------------------------------------------------------

    async def token_create(self, token: base.Token) -> bool:
        params = {column: getattr(token, column) for column in TOKEN_COLUMNS}

        async def create(conn: Conn) -> bool:
            return bool(await run(conn, Q["token_create"], **params))

        # Not repeated after a connection lost half-way: it would then find its own row.
        return await self._db.session(create, transaction=False, idempotent=False)

    async def token_get(self, digest: str) -> base.Token | None:
        rows = await self._db.fetch("token_get", digest=digest)
        return base.Token(*rows[0]) if rows else None

    async def token_list(self, namespace: str | None) -> list[base.Token]:
        if namespace is None:
            return [base.Token(*row) for row in await self._db.fetch("token_list_all")]
        rows = await self._db.fetch("token_list", namespace=namespace)
        return [base.Token(*row) for row in rows]

    async def token_delete(self, namespace: str, digest: str) -> bool:
        return bool(await self._db.fetch("token_delete", namespace=namespace, digest=digest))

    async def token_limit_set(
        self, digest: str, read: int | None, write: int | None, interval: float | None
    ) -> bool:
        rows = await self._db.fetch("token_limit_set", digest=digest, limit_read=read,
                                    limit_write=write, limit_interval=interval)  # fmt: skip
        return bool(rows)

    # -- lanes -------------------------------------------------------------------

    async def lane_rules(self, namespace: str) -> list[LaneRule]:
        return await self._db.session(operations.lane_rules, namespace)

    async def lane_rule_set(self, namespace: str, rule: LaneRule, now: float) -> None:
        await self._db.session(operations.lane_rule_set, namespace, rule, now)

    async def lane_rule_delete(self, namespace: str, pattern: str, now: float) -> bool:
        return await self._db.session(operations.lane_rule_delete, namespace, pattern, now)

    async def lane_window(self, namespace: str, lane: str) -> LaneWindow:
        rows = await self._db.fetch("lane_window", namespace=namespace, lane=lane)
        return lane_window(rows[0] if rows else None)

    async def lane_view(self, namespace: str, lane: str) -> LaneView:
        return await self._db.session(operations.lane_view, namespace, lane)

    async def lane_ahead(self, namespace: str, lane: str, job_id: int) -> int:
        rows = await self._db.fetch("lane_ahead", namespace=namespace, lane=lane, id=job_id)
        return int(rows[0][0])

    async def lane_list(self, namespace: str, limit: int) -> list[LaneInfo]:
        return await self._db.session(
            operations.lane_list, namespace, limit, isolation="repeatable_read"
        )

    # -- maintenance -------------------------------------------------------------

    async def job_promote_due(self, now: float, limit: int) -> int:
        return await maintenance.promote_due(self._db, now, limit)

    async def job_expired_leases(self, now: float, limit: int) -> list[Claimed]:
        return await maintenance.expired_leases(self._db, now, limit)

    async def job_expire(self, now: float, limit: int) -> list[int]:
        return await self._db.session(maintenance.expire, now, limit)

    async def history_ensure_partitions(self, now: float) -> None:
        await self._db.session(partitions.ensure, now, transaction=False)

    async def history_prune(self, before: float, limit: int) -> int:
        return await self._db.session(maintenance.history_prune, before, limit, transaction=False)

    async def history_fold(self, now: float) -> int:
        return await self._db.session(partitions.fold, now, transaction=False)

    async def leader_acquire(self, name: str, holder: str, ttl: float, now: float) -> bool:
        return await self._leadership.acquire(name, holder, ttl, now)

    async def leader_release(self, name: str, holder: str) -> None:
        await self._leadership.release(name, holder)

    # -- periodic tasks ----------------------------------------------------------

    async def periodic_sync(
        self, namespace: str, entries: Sequence[base.PeriodicEntry], now: float
    ) -> list[base.PeriodicState]:
        return await self._db.session(operations.periodic_sync, namespace, entries, now)

    async def periodic_advance(
        self, namespace: str, task: str, checked_from: float, advance: base.PeriodicAdvance
    ) -> bool:
        params = operations.periodic_advance_params(namespace, task, checked_from, advance)
        return bool(await self._db.fetch("periodic_advance", **params))

    async def periodic_list(self, namespace: str) -> list[base.PeriodicState]:
        rows = await self._db.fetch("periodic_list", namespace=namespace)
        return [base.PeriodicState(*row) for row in rows]

    # -- workers -----------------------------------------------------------------

    async def database_identity(self, fresh: bool = False) -> tuple[str, ...]:
        if fresh or self._identity is None:
            self._identity = await identity.of_store(self._db)
        return self._identity

    async def server_time(self) -> float | None:
        (row,) = await self._db.fetch("server_time")
        return float(row[0])

    async def worker_beat(self, worker: WorkerInfo) -> None:
        await self._db.execute(
            "worker_beat", id=worker.id, namespace=worker.namespace,
            queues=json.dumps(worker.queues), host=worker.host, pid=worker.pid,
            concurrency=worker.concurrency, started_at=worker.started_at,
            heartbeat_at=worker.heartbeat_at, running=json.dumps(worker.running),
            stats=json.dumps(worker.stats),
        )  # fmt: skip

    async def worker_remove(self, worker_id: str) -> None:
        await self._db.execute("worker_remove", id=worker_id)

    async def worker_list(self, alive_since: float | None = None) -> list[WorkerInfo]:
        rows = await self._db.fetch("worker_list", since=alive_since or 0.0)
        return [worker_from_row(r) for r in rows]

    async def worker_prune(self, dead_before: float) -> int:
        status = await self._db.execute("worker_prune", before=dead_before)
        return int(status.split()[-1])
