"""Maintenance on PostgreSQL, the leader's duties: promotion of due jobs, the leases
that ran out, expiry, the history's partitions (ferryq.store.postgres.partitions),
and leadership itself: a session advisory lock on the store's listening connection,
or, behind a transaction pooler, a lease row (``LeaseLeadership``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from ferryq.errors import StoreError
from ferryq.faults import one_line
from ferryq.store.base import Claimed
from ferryq.store.postgres import lanes, partitions
from ferryq.store.postgres.connection import CONNECTION_LOST, Conn, Database, run, runner
from ferryq.store.postgres.queries import Q

log = logging.getLogger("ferryq.store.postgres")
#: A frozen leader's session ends after this long, so its lock passes on.
LEADER_IDLE_TIMEOUT = "10s"
#: A lease row is renewed once this share of its time has gone (a third: every 1.7 s
#: of a 5 s lease), so a leader stalled for up to two thirds of it stays the leader.
RENEW_AFTER = 1 / 3


async def promote_due(db: Database, now: float, limit: int) -> int:
    status = await db.execute("job_promote_due", now=now, limit=limit)
    return int(status.split()[-1])


async def expired_leases(db: Database, now: float, limit: int) -> list[Claimed]:
    return [Claimed(*row) for row in await db.fetch("job_expired_leases", now=now, limit=limit)]


async def expire(conn: Conn, now: float, limit: int) -> list[int]:
    run_here = runner(conn)
    found = await run(conn, Q["job_expire_candidates"], now=now, limit=limit)
    await lanes.lock(run_here, {(r[1], r[2]) for r in found if r[2] is not None})
    moved = await run(conn, Q["job_expire"], ids=[r[0] for r in found], now=now)
    await lanes.settle(run_here, {(r[1], r[2]) for r in moved if r[2] is not None}, now)
    return sorted(r[0] for r in moved)


async def history_prune(conn: Conn, before: float, limit: int) -> int:
    await partitions.ensure(conn, time.time())
    pruned = await partitions.prune(conn, before, limit)
    if pruned:
        await run(conn, Q["deps_prune"])
    await run(conn, Q["lane_windows_prune"], before=before)
    return pruned


class Leadership:
    """Leadership by name: a session advisory lock per name, all held on the store's
    listening connection (``Waits.session``), one statement at a time, so maintenance
    and the periodic loop take turns on it. A lost connection takes the locks with it;
    the listener makes another, on which they are taken anew. The first round on a
    connection sets its ``idle_session_timeout``: a frozen leader's session then ends,
    and its locks pass on, while a live worker's rounds (every 0.5 s) keep it."""

    def __init__(self, session: Callable[[], Awaitable[Conn]]) -> None:
        self._session = session
        self._conn: Conn | None = None  # the connection the locks in _leading are on
        self._leading: set[str] = set()
        self._turn = asyncio.Lock()

    async def acquire(self, name: str, holder: str, ttl: float, now: float) -> bool:
        """Whether this store leads ``name`` (the lock is this store's: ``holder``,
        ``ttl`` and ``now`` are the lease's, ``LeaseLeadership``)."""
        async with self._turn:
            return await self._acquire(name)

    async def _acquire(self, name: str) -> bool:
        conn = await self._session()  # a StoreError while there is none
        try:
            if conn is not self._conn:  # a new session: the old one's locks are gone
                self._conn, self._leading = conn, set()
                await _time_out_idle(conn)
            if name in self._leading:
                await conn.execute("SELECT 1")  # keeps the idle timeout away
                return True
            if await conn.fetchval(Q["leader_try"].sql, name):
                self._leading.add(name)
                return True
            return False
        except (*CONNECTION_LOST, asyncpg.PostgresError) as exc:
            # Whatever state it is in, the locks go with it; the listener makes another.
            conn.terminate()
            self._conn, self._leading = None, set()
            raise StoreError(f"leadership check failed, not leading: {one_line(exc)}") from exc

    async def release(self, name: str, holder: str) -> None:
        async with self._turn:
            if self._conn is not None and name in self._leading:
                self._leading.discard(name)
                with contextlib.suppress(Exception):
                    await self._conn.fetchval(Q["leader_unlock"].sql, name)

    async def close(self) -> None:
        """The locks end with the listening connection, which the store's waits close."""
        self._conn, self._leading = None, set()

    def terminate(self) -> None:
        """As ``close``."""
        self._conn, self._leading = None, set()


async def _time_out_idle(conn: Conn) -> None:
    try:
        await conn.execute(f"SET idle_session_timeout = '{LEADER_IDLE_TIMEOUT}'")
    except asyncpg.UndefinedObjectError:  # before PostgreSQL 14: no such setting
        log.warning("this PostgreSQL has no idle_session_timeout: a frozen leader "
                    "keeps its lock until its connection ends")  # fmt: skip


class LeaseLeadership:
    """Leadership by name behind a transaction pooler: a row of ``ferryq_leaders``
    held until ``expires_at``, renewed each round, as on SQLite. A session advisory
    lock would belong to whichever server connection the pooler lent, and be released
    (or kept) as it pleases. A leader that stops renewing (killed, frozen, cut off)
    is followed by another once its lease has run out."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def acquire(self, name: str, holder: str, ttl: float, now: float) -> bool:
        return await self._db.session(_lease_acquire, name, holder, ttl, now)

    async def release(self, name: str, holder: str) -> None:
        params = {"name": name, "holder": holder}
        await self._db.session(_lease, "leader_release", params, transaction=False)

    async def close(self) -> None:
        """Nothing of its own to close: a lease outlives the store until it runs out."""

    def terminate(self) -> None:
        """As ``close``."""


async def _lease_acquire(conn: Conn, name: str, holder: str, ttl: float, now: float) -> bool:
    """Take or renew the lease, writing only when that changes something: a lease
    another holds and has not run out, or this holder's with more than RENEW_AFTER of
    its time left, is only read. Every write ends a transaction that wrote, which wakes
    the polls of every idle worker (waits.Poller): with a write at every round (0.5 s)
    of every worker (the upsert locks the row even when it changes nothing), ten idle
    workers woke each other twenty times a second, forty with periodic tasks."""
    lease = await run(conn, Q["leader_lease"], name=name)
    if lease:
        lease_holder, expires_at = lease[0]
        if lease_holder != holder and expires_at >= now:
            return False
        if lease_holder == holder and expires_at - now > ttl * (1 - RENEW_AFTER):
            return True
    params = {"name": name, "holder": holder, "expires_at": now + ttl, "now": now}
    return bool(await run(conn, Q["leader_acquire"], **params))


async def _lease(conn: Conn, statement: str, params: dict[str, object]) -> list[Any]:
    return await run(conn, Q[statement], **params)
