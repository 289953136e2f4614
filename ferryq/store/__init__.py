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
        raise ConfigurationError("the PostgreSQL backend is not available in this version")
    raise ConfigurationError(
        f"unsupported database URL {url!r}: use sqlite:///path/to.db or postgresql://…"
    )


__all__ = ["Store", "open_store"]
