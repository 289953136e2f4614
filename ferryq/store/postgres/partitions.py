"""Daily partitions of ferryq_history: created ahead of time, counted once their day
is over (folded), dropped past retention."""

from __future__ import annotations

import logging
import math
from datetime import UTC, datetime
from typing import Any

import asyncpg

from ferryq.store.postgres.queries import Q

log = logging.getLogger("ferryq.store.postgres")
DAY = 86400
AHEAD = 3  # days of partitions that exist before they are needed
FOLD_AFTER = 3600  # seconds after a partition's day ends before it is folded
LOCK_WAIT_MS = 200  # the longest a prune or fold waits for its lock, blocking writers
_PREFIX = "ferryq_history_p"
_DEFAULT = "ferryq_history_default"


def name_of(day: int) -> str:
    """The partition holding rows finished on UTC day ``day`` (days since the epoch)."""
    return _PREFIX + datetime.fromtimestamp(day * DAY, UTC).strftime("%Y%m%d")


def day_of(name: str) -> int:
    stamp = datetime.strptime(name.removeprefix(_PREFIX), "%Y%m%d").replace(tzinfo=UTC)
    return int(stamp.timestamp()) // DAY


async def ensure(conn: Any, now: float) -> None:
    """Create the partitions from yesterday to AHEAD days out, if missing."""
    today = math.floor(now / DAY)
    existing = {row[0] for row in await conn.fetch(Q["history_partitions"].sql)}
    for day in range(today - 1, today + AHEAD + 1):
        name = name_of(day)
        if name in existing:
            continue
        try:
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 7))", name)
                if await conn.fetchval("SELECT to_regclass($1)", name) is not None:
                    continue
                # Made apart, then attached: ATTACH takes a lock that lets inserts into
                # the history go on, where CREATE ... PARTITION OF would block them.
                await conn.execute(
                    f"CREATE TABLE {name} (LIKE ferryq_history INCLUDING DEFAULTS, "
                    f"CHECK (finished_at >= {day * DAY} AND finished_at < {(day + 1) * DAY}))"
                )
                await conn.execute(
                    f"ALTER TABLE ferryq_history ATTACH PARTITION {name} "
                    f"FOR VALUES FROM ({day * DAY}) TO ({(day + 1) * DAY})"
                )
        except asyncpg.PostgresError as exc:
            # Rows of that day already sit in the default partition: they stay there
            # and are pruned from it; the day simply has no partition of its own.
            log.warning("cannot create history partition %s: %s", name, exc)


async def prune(conn: Any, before: float, limit: int) -> int:
    """Drop whole partitions older than ``before``, and their counts; trim the default
    partition."""
    removed = 0
    for name, _folded in await conn.fetch(Q["history_partitions"].sql):
        if (day_of(name) + 1) * DAY <= before:
            # Detaching locks ferryq_history whole, once a day. (DETACH ... CONCURRENTLY
            # would not, but it refuses while a default partition exists.) The lock
            # waits for every open reader of the history, and every finish waits
            # behind it: so it is given up after LOCK_WAIT_MS and tried next round.
            try:
                async with conn.transaction():
                    # Under the partition's lock, as ``ensure`` makes it: another round
                    # (a burst's own beside the loop's, a leader that has just lost its
                    # place) may have dropped it since the list was read.
                    await conn.execute(
                        "SELECT pg_advisory_xact_lock(hashtextextended($1, 7))", name
                    )
                    if await conn.fetchval("SELECT to_regclass($1)", name) is None:
                        continue
                    rows = await conn.fetchval(f"SELECT count(*) FROM {name}")
                    await conn.execute(f"SET LOCAL lock_timeout = '{LOCK_WAIT_MS}ms'")
                    await conn.execute(f"ALTER TABLE ferryq_history DETACH PARTITION {name}")
                    await conn.execute(f"DROP TABLE {name}")
                    await conn.execute(Q["history_counts_drop"].sql, day_of(name))
            except asyncpg.LockNotAvailableError:
                log.info("history partition %s is in use; dropping it next round", name)
                break
            log.info("dropped history partition %s (%d jobs)", name, rows)
            removed += int(rows)
    statement = Q["history_prune_default"]
    status = await conn.execute(statement.sql, *statement.args({"before": before, "limit": limit}))
    return removed + int(status.split()[-1])


async def fold(conn: Any, now: float) -> int:
    """Fold the oldest partition not folded yet whose day ended FOLD_AFTER ago:
    count it into ferryq_history_counts and give it the trigger that keeps those
    counts, in one transaction (see migration 0008). Return its rows; an empty one
    costs nothing to fold, so the next is folded too.

    Creating the trigger locks the partition against writes until the commit, so the
    count sees every row written before and the trigger every row written after.
    Writes to a day that is over are rare (a respawn, a purge, a worker whose clock
    is behind); they wait for the count.
    """
    for name, folded in await conn.fetch(Q["history_partitions"].sql):
        day = day_of(name)
        if folded or (day + 1) * DAY + FOLD_AFTER > now:
            continue
        try:
            async with conn.transaction():
                # Writes to that day wait behind the lock as long as it is waited for.
                await conn.execute(f"SET LOCAL lock_timeout = '{LOCK_WAIT_MS}ms'")
                await conn.execute(
                    # OR REPLACE: a leader that has just lost its place may fold the
                    # same day at once; the later fold counts it again, under the lock.
                    f"CREATE OR REPLACE TRIGGER ferryq_history_counted "
                    f"AFTER INSERT OR DELETE ON {name} "
                    f"FOR EACH ROW EXECUTE FUNCTION ferryq_history_count('{day}')"
                )
                await conn.execute(Q["history_counts_drop"].sql, day)
                groups = await conn.fetch(
                    "INSERT INTO ferryq_history_counts (day, namespace, queue, state, n) "
                    f"SELECT {day}, namespace, queue, state, count(*) FROM {name} "
                    "GROUP BY namespace, queue, state RETURNING n"
                )
                rows = sum(int(n) for (n,) in groups)
        except asyncpg.LockNotAvailableError:
            log.info("history partition %s is being written; folding it next round", name)
            return 0
        log.info("folded history partition %s (%d jobs)", name, rows)
        if rows:
            return rows
    return 0


async def counts(conn: Any, namespace: str | None) -> list[Any]:
    """Counts by (namespace, queue, state): the hot table, the folded days, and the
    partitions not folded (the default one too) read whole. Run it in one snapshot
    (REPEATABLE READ), so that a fold committing meanwhile is seen whole or not at
    all."""
    unfolded = [name for name, folded in await conn.fetch(Q["history_partitions"].sql)
                if not folded]  # fmt: skip
    statement = Q["job_counts"]
    assert statement.names == ("namespace",)
    sql = statement.sql.rstrip().rstrip(";") + "".join(
        f" UNION ALL SELECT namespace, queue, state, count(*) FROM {name}"
        " WHERE $1::text IS NULL OR namespace = $1 GROUP BY namespace, queue, state"
        for name in [*unfolded, _DEFAULT]
    )
    return list(await conn.fetch(sql, namespace))
