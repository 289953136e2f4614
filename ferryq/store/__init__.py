"""Storage backends. Only this package talks SQL or imports a database driver."""

from __future__ import annotations

from ferryq.errors import ConfigurationError
from ferryq.store.base import Store


def open_store(url: str) -> Store:
    """A store for ``url`` (``sqlite:///path`` or ``postgresql://…``), not yet opened."""
    if url.startswith("sqlite:"):
        from ferryq.store.sqlite.store import SQLiteStore

        return SQLiteStore.from_url(url)
    if url.startswith(("postgresql:", "postgres:")):
        try:
            from ferryq.store.postgres.store import PostgresStore
        except ImportError as exc:
            raise ConfigurationError(
                f"PostgreSQL needs asyncpg: pip install 'ferryq[postgres]' ({exc})"
            ) from None
        return PostgresStore.from_url(url)
    raise ConfigurationError(
        f"unsupported database URL {url!r}: use sqlite:///path/to.db or postgresql://…"
    )


__all__ = ["Store", "open_store"]
