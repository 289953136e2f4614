"""Daily partitions of ferryq_history: created ahead of time, dropped past retention."""

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
_PREFIX = "ferryq_history_p"


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
    """Drop whole partitions older than ``before``; trim the default partition."""
    removed = 0
    for (name,) in await conn.fetch(Q["history_partitions"].sql):
        if (day_of(name) + 1) * DAY <= before:
            rows = await conn.fetchval(f"SELECT count(*) FROM {name}")
            # Detaching takes a brief lock on ferryq_history, once a day. (DETACH ...
            # CONCURRENTLY would not, but it refuses while a default partition exists.)
            async with conn.transaction():
                await conn.execute(f"ALTER TABLE ferryq_history DETACH PARTITION {name}")
                await conn.execute(f"DROP TABLE {name}")
            log.info("dropped history partition %s (%d jobs)", name, rows)
            removed += int(rows)
    statement = Q["history_prune_default"]
    status = await conn.execute(statement.sql, *statement.args({"before": before, "limit": limit}))
    return removed + int(status.split()[-1])
