"""Storage backends. Only this package talks SQL or imports a database driver."""

from __future__ import annotations

import importlib.util
from collections.abc import Awaitable, Callable, Sequence
from urllib.parse import urlsplit, urlunsplit

from ferryq.errors import ConfigurationError
from ferryq.store.base import Inserted, NewJob, Store


def safe_url(url: str) -> str:
    """The URL without its password, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", "@", 1)))


def open_store(url: str, *, read_only: bool = False, direct_url: str | None = None) -> Store:
    """A store for ``url`` (``sqlite:///path`` or ``postgresql://…``), not yet opened.

    ``read_only``: the caller only reads, so a SQLite file is never created, and one
    that cannot be written is opened to read (PostgreSQL needs no such care).
    ``direct_url``: PostgreSQL behind a pooler, the same database reached directly,
    for LISTEN (SQLite has no use for it)."""
    if url.startswith("sqlite:"):
        from ferryq.store.sqlite.store import SQLiteStore

        return SQLiteStore.from_url(url, read_only=read_only)
    if url.startswith(("postgresql:", "postgres:")):
        try:
            from ferryq.store.postgres.store import PostgresStore
        except ImportError as exc:
            raise ConfigurationError(
                f"PostgreSQL needs asyncpg: pip install 'ferryq[postgres]' ({exc})"
            ) from None
        return PostgresStore.from_url(url, direct_url)
    raise ConfigurationError(
        f"unsupported database URL {url!r}: use sqlite:///path/to.db or postgresql://…"
    )


def insert_on_connection(
    connection: object,
    job: NewJob,
    args: Sequence[str],
    expected: Callable[[bool], tuple[str, ...]],
) -> list[Inserted]:
    """Insert on the application's own (sync) connection, in its open transaction.
    ``expected``: the App's database (``Store.database_identity``), asked for the first
    time a connection is seen, which must reach it."""
    _require_asyncpg()
    from ferryq.store.postgres import external

    return external.insert_sync(connection, job, args, expected)


async def insert_on_connection_async(
    connection: object,
    job: NewJob,
    args: Sequence[str],
    expected: Callable[[bool], Awaitable[tuple[str, ...]]],
) -> list[Inserted]:
    """Insert on the application's own async connection, in its open transaction."""
    _require_asyncpg()
    from ferryq.store.postgres import external

    return await external.insert_async(connection, job, args, expected)


def _require_asyncpg() -> None:
    if importlib.util.find_spec("asyncpg") is None:
        raise ConfigurationError(
            "enqueue on a connection needs asyncpg: pip install 'ferryq[postgres]'"
        )


__all__ = [
    "Store",
    "insert_on_connection",
    "insert_on_connection_async",
    "open_store",
    "safe_url",
]
