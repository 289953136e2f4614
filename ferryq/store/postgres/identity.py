"""The direct URL's check: that it reaches the database the pooled URL reaches.

A direct URL (docs/operations.md, "Behind a connection pooler") carries the wake-ups:
one that pointed at another server, or another database on the same one, would leave
every worker waiting for NOTIFYs that are sent elsewhere. So the store compares the
two when it opens, and refuses to start on a mismatch.
"""

from __future__ import annotations

import asyncpg

from ferryq.errors import StoreError
from ferryq.store import safe_url
from ferryq.store.postgres.connection import Conn, Database
from ferryq.store.postgres.pooler import pooling_of

#: The database's name and its cluster's: ``system_identifier`` is set once by initdb
#: (a replica shares it with its primary), and the postmaster's start time tells two
#: servers apart where a role may not read the control data. The start time as Unix
#: seconds: as text it is written in the session's TimeZone, which two sessions of one
#: server may set apart (Django's is UTC).
START = "extract(epoch FROM pg_postmaster_start_time())::text"
IDENTITY = (
    f"SELECT current_database(), {START}, (SELECT system_identifier::text FROM pg_control_system())"
)
IDENTITY_WITHOUT_CONTROL = f"SELECT current_database(), {START}, ''"


async def check_direct(db: Database, direct_url: str) -> None:
    """A StoreError unless ``direct_url`` reaches ``db``'s database."""
    shown = safe_url(direct_url)
    pooling = pooling_of(direct_url)
    if pooling.pooled:
        raise StoreError(f"the direct URL {shown} names a pooler: drop its pooler= parameter")
    pooled = await db.session(_identity, transaction=False)
    try:
        conn = await asyncpg.connect(pooling.url)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        raise StoreError(f"cannot connect to PostgreSQL at the direct URL {shown}: {exc}") from exc
    try:
        direct = await _identity(conn)
    finally:
        await conn.close()
    if not same(direct, pooled):
        raise StoreError(
            f"the direct URL {shown} reaches database {direct[0]!r} of another server or "
            f"database than {db.safe_url} ({pooled[0]!r}): give the direct URL of the same "
            "database"
        )


async def of_store(db: Database) -> tuple[str, ...]:
    """``db``'s database and server, by what any role may read (IDENTITY_WITHOUT_CONTROL),
    as an application's own connection is checked against it (ferryq.store.postgres.
    external): a statement that failed there would fail the application's transaction."""
    row = await db.session(lambda conn: conn.fetchrow(IDENTITY_WITHOUT_CONTROL), transaction=False)
    return tuple(str(value) for value in row)


def same(one: tuple[str, ...], other: tuple[str, ...]) -> bool:
    """The same database of the same server: the control data compared only where both
    roles may read it."""
    if one[:2] != other[:2]:
        return False
    return not (one[2] and other[2]) or one[2] == other[2]


async def _identity(conn: Conn) -> tuple[str, ...]:
    try:
        row = await conn.fetchrow(IDENTITY)
    except asyncpg.InsufficientPrivilegeError:
        row = await conn.fetchrow(IDENTITY_WITHOUT_CONTROL)
    return tuple(str(value) for value in row)
