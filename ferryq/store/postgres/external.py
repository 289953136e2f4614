"""Enqueue on the application's own connection, inside its own transaction.

The job exists only if that transaction commits, and the wake-up NOTIFY is sent at
that commit. Works with asyncpg connections and psycopg 3 connections, sync or
async. The insert is written once, async (``insert_with``); for a sync psycopg
connection it is driven without an event loop (``flows.drive``), since it never
really waits.

Before the first insert on a connection, it is checked to reach the store's database
(the database's name and its server's start time, compared with what the store reads;
``identity.same``), once per connection object, kept weakly; one of another database or
server is refused before anything is written. A transaction that failed earlier is
refused with the fix named (roll it back), not with the server's bare error.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ferryq.errors import ConfigurationError
from ferryq.store.base import Inserted, NewJob
from ferryq.store.flows import drive
from ferryq.store.postgres.connection import runner
from ferryq.store.postgres.identity import IDENTITY_WITHOUT_CONTROL, same
from ferryq.store.postgres.inserts import insert_with
from ferryq.store.postgres.queries import Statement

Runner = Callable[[Statement, dict[str, Any]], Awaitable[list[Any]]]
#: What the store's database is (``identity.of_store``), asked for when a connection not
#: yet checked comes: as the store read it before, or read again (``True``) where that
#: differs from the connection's (the server may have restarted since).
Expected = Callable[[bool], Awaitable[tuple[str, ...]]]
#: The connections found to reach the store's database.
_checked: weakref.WeakSet[Any] = weakref.WeakSet()
#: SQLSTATE in_failed_sql_transaction: a statement failed earlier in the transaction.
FAILED_TRANSACTION = "25P02"


def driver_of(connection: object) -> str:
    package = type(connection).__module__.partition(".")[0]
    if package == "asyncpg":
        return "asyncpg"
    if package == "psycopg":
        return "psycopg-async" if hasattr(connection, "__aenter__") else "psycopg"
    hint = ""
    if package == "psycopg2":
        hint = " (psycopg2 is not psycopg 3: pip install 'psycopg[binary]')"
    raise ConfigurationError(
        f"cannot enqueue on a {type(connection).__qualname__}: pass an asyncpg connection "
        f"or a psycopg 3 connection{hint}"
    )


def _key(connection: Any) -> Any:
    """What ``_checked`` keeps for ``connection``: under an asyncpg pool's proxy (new at
    each acquire, and not weakly referable), the connection itself."""
    return getattr(connection, "_con", None) or connection


def _remember(connection: Any) -> None:
    with contextlib.suppress(TypeError):  # not weakly referable: checked every time
        _checked.add(_key(connection))


async def insert_async(
    connection: Any, job: NewJob, args: Sequence[str], expected: Expected
) -> list[Inserted]:
    driver = driver_of(connection)
    if driver == "psycopg":
        raise ConfigurationError("a sync psycopg connection needs enqueue(), not enqueue_async()")
    run: Runner
    if driver == "asyncpg":
        run = runner(connection)
        identity = connection.fetchrow
    else:

        async def run(statement: Statement, params: dict[str, Any]) -> list[Any]:
            cursor = await connection.execute(statement.pyformat, params)
            return list(await cursor.fetchall()) if cursor.description else []

        async def identity(query: str) -> Any:
            return await (await connection.execute(query)).fetchone()

    try:
        if _key(connection) not in _checked:
            seen = tuple(await identity(IDENTITY_WITHOUT_CONTROL))
            if not _same(seen, await expected(False)):
                _check_database(seen, await expected(True))
            _remember(connection)
        return await insert_with(run, job, args)
    except Exception as exc:
        _raise_failed_transaction(exc)
        raise


def insert_sync(
    connection: Any, job: NewJob, args: Sequence[str], expected: Callable[[bool], tuple[str, ...]]
) -> list[Inserted]:
    if driver_of(connection) != "psycopg":
        raise ConfigurationError("an async connection needs enqueue_async(), not enqueue()")

    async def run(statement: Statement, params: dict[str, Any]) -> list[Any]:
        cursor = connection.execute(statement.pyformat, params)
        return list(cursor.fetchall()) if cursor.description else []

    try:
        if _key(connection) not in _checked:
            row = connection.execute(IDENTITY_WITHOUT_CONTROL).fetchone()
            if not _same(tuple(row), expected(False)):
                _check_database(tuple(row), expected(True))
            _remember(connection)
        return drive(insert_with(run, job, args))
    except Exception as exc:
        _raise_failed_transaction(exc)
        raise


def _same(seen: tuple[Any, ...], expected: tuple[str, ...]) -> bool:
    return same(tuple(str(value) for value in seen), expected)


def _check_database(seen: tuple[Any, ...], expected: tuple[str, ...]) -> None:
    seen = tuple(str(value) for value in seen)
    if not same(seen, expected):
        raise ConfigurationError(
            f"the connection reaches database {seen[0]!r} of another server or database "
            f"than the App's ({expected[0]!r}): enqueue on a connection to the App's database"
        )


def _raise_failed_transaction(exc: Exception) -> None:
    if getattr(exc, "sqlstate", None) == FAILED_TRANSACTION:
        raise ConfigurationError(
            "the connection's transaction failed (a statement in it raised): roll it back, "
            "then enqueue in the transaction that follows"
        ) from exc
