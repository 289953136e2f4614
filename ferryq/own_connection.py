"""The application's own connection, as ferryq writes on it (``task.using(conn)``).

A framework hands out its own wrapper of the driver's connection; ``driver_connection``
turns one into the connection of the driver that the store writes on (a sqlite3,
psycopg 3 or asyncpg connection, or aiosqlite's), after checking that it can be written
on in a transaction. Anything else comes back as it is, for the store to check.

SQLAlchemy 2 (``ferryq[sqlalchemy]``): a ``Session`` or ``Connection``, and through
``driver_connection_async`` an ``AsyncSession`` or ``AsyncConnection``. The session's
transaction is begun if it is not yet (as its first statement would begin it), and the
job is written in it: it commits or rolls back with the session. Refused before anything
is written, each with a ConfigurationError naming the fix: a closed or invalidated
connection, a transaction that failed and awaits its rollback, a connection in
autocommit mode (the job would commit at once, not with the session), a driver the store
cannot write on. SQLAlchemy is imported only for an object of one of its classes, which
are known by their module's name.

Django's connection (``django.db.connection``, ``connections[alias]``), inside
``transaction.atomic()``, also known by its class's module (Django is not imported
here).
"""

from __future__ import annotations

from typing import Any

from ferryq.errors import ConfigurationError

#: The SQLAlchemy classes whose objects ``task.using`` takes.
KINDS = frozenset({"Session", "Connection", "AsyncSession", "AsyncConnection"})
#: The drivers the stores write on, by the module of their connection's class, and
#: what to write in the engine's URL for each backend.
DRIVERS = ("psycopg", "asyncpg", "sqlite3", "aiosqlite")
DIALECTS = (
    "postgresql+psycopg:// or postgresql+asyncpg:// (async), sqlite:// or sqlite+aiosqlite://"
)


def sqlalchemy_kind(connection: object) -> str | None:
    """ "Session", "Connection", "AsyncSession" or "AsyncConnection" for an object of
    that SQLAlchemy class or of a subclass of it; None for anything else."""
    for cls in type(connection).__mro__:
        if cls.__module__.startswith("sqlalchemy.") and cls.__name__ in KINDS:
            return cls.__name__
    return None


def driver_connection(connection: object) -> object:
    """The driver's connection under ``connection`` (itself if none is known)."""
    if _is_django(connection):
        return _django_driver_connection(connection)
    kind = sqlalchemy_kind(connection)
    if kind is None:
        return connection
    if kind.startswith("Async"):
        raise ConfigurationError(f"a SQLAlchemy {kind} needs enqueue_async(), not enqueue()")
    with _refusals(kind):
        wrapper: Any = connection
        conn: Any = wrapper.connection() if kind == "Session" else wrapper
        _check_open(conn, kind)
        if not conn.in_transaction():
            conn.begin()  # as a first statement would: the session's commit ends it
        raw = conn.connection
    return _checked(kind, raw.dbapi_connection, raw.driver_connection)


async def driver_connection_async(connection: object) -> object:
    """``driver_connection`` for a call from a coroutine: an AsyncSession or an
    AsyncConnection is awaited for its connection. On asyncpg, whose SQLAlchemy adapter
    sends BEGIN at its first statement, not at the session's begin, a statement is sent
    through the session first if none was yet: the job's insert, sent on asyncpg's
    connection directly, would otherwise commit at once, and the session's commit,
    knowing of no transaction, would commit nothing."""
    if _is_django(connection):
        raise ConfigurationError(
            "Django's connections are for sync code: enqueue() on it inside "
            "transaction.atomic(), not enqueue_async()"
        )
    kind = sqlalchemy_kind(connection)
    if kind is None:
        return connection
    if not kind.startswith("Async"):
        return driver_connection(connection)
    with _refusals(kind):
        wrapper: Any = connection
        conn: Any = await wrapper.connection() if kind == "AsyncSession" else wrapper
        _check_open(conn, kind)
        if not conn.in_transaction():
            await conn.begin()
        raw = await conn.get_raw_connection()
    driver: Any = _checked(kind, raw.dbapi_connection, raw.driver_connection)
    if _module(driver) == "asyncpg" and not driver.is_in_transaction():
        with _refusals(kind):
            await conn.exec_driver_sql("SELECT 1")
    return driver


class _refusals:
    """SQLAlchemy's errors for a connection that cannot be used, as ConfigurationErrors
    that name the fix."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, _: Any) -> None:
        if exc is None:
            return
        from sqlalchemy import exc as errors

        if isinstance(exc, errors.PendingRollbackError):
            raise ConfigurationError(
                f"the SQLAlchemy {self.kind}'s transaction failed ({_first_line(exc)}): call "
                "rollback() on it, then enqueue in the transaction that follows"
            ) from exc
        if isinstance(exc, errors.ResourceClosedError):
            raise _closed(self.kind) from exc


def _check_open(conn: Any, kind: str) -> None:
    if conn.closed:
        raise _closed(kind)
    if conn.invalidated:
        raise ConfigurationError(
            f"the SQLAlchemy {kind}'s connection was invalidated (lost): call rollback() "
            "on it, then enqueue in the transaction that follows"
        )


def _checked(kind: str, dbapi: Any, driver: Any) -> object:
    """The driver's connection, once it is known to be one the stores write on, open,
    in no failed transaction and not in autocommit mode."""
    module = _module(driver)
    if module not in DRIVERS:
        raise ConfigurationError(
            f"cannot enqueue on a SQLAlchemy {kind} on {module} ({type(driver).__qualname__}): "
            f"make its engine with {DIALECTS}"
        )
    if module == "psycopg":
        if driver.closed:
            raise _closed(kind)
        if driver.info.transaction_status.name == "INERROR":
            raise ConfigurationError(
                f"the SQLAlchemy {kind}'s transaction failed (a statement in it raised): "
                "call rollback() on it, then enqueue in the transaction that follows"
            )
    elif module == "asyncpg" and driver.is_closed():
        raise _closed(kind)
    if _autocommit(module, dbapi, driver):
        raise ConfigurationError(
            f"the SQLAlchemy {kind} is in autocommit mode (isolation_level='AUTOCOMMIT'): "
            "the job would commit at once, not with your transaction; enqueue on one "
            "without AUTOCOMMIT"
        )
    return driver


def _autocommit(module: str, dbapi: Any, driver: Any) -> bool:
    """Whether the driver's connection commits each statement by itself, with no
    transaction open that the job would join."""
    if module == "psycopg":
        return bool(driver.autocommit) and driver.info.transaction_status.name == "IDLE"
    if module == "asyncpg":
        return bool(dbapi.autocommit) and not driver.is_in_transaction()
    # sqlite3, or aiosqlite's (read from here as SQLAlchemy's adapter reads it): a
    # closed one is refused by the store, which says so.
    try:
        return dbapi.isolation_level is None and not driver.in_transaction
    except Exception:  # closed: the store's own check names it
        return False


def _module(driver: object) -> str:
    return type(driver).__module__.partition(".")[0]


def _closed(kind: str) -> ConfigurationError:
    return ConfigurationError(
        f"the SQLAlchemy {kind}'s connection is closed: enqueue on an open one "
        "(a new Session, or engine.connect())"
    )


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _is_django(connection: object) -> bool:
    """Django's wrapper, or ``django.db.connection``, the proxy that stands for it."""
    module = type(connection).__module__
    return module == "django.utils.connection" or module.startswith(
        ("django.db.backends.", "django.contrib.gis.db.backends.")
    )


def _django_driver_connection(connection: Any) -> object:
    """Under Django's wrapper, its driver's connection: only inside ``atomic()``, where
    Django has a transaction open (outside, every statement would commit at once)."""
    if not connection.in_atomic_block:
        raise ConfigurationError(
            f"Django's connection {connection.alias!r} has no transaction open: enqueue on "
            "it inside transaction.atomic(), or without it to commit at once"
        )
    connection.validate_no_broken_transaction()  # an error earlier in the block
    connection.ensure_connection()
    return connection.connection
