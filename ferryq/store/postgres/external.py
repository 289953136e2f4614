"""Enqueue on the application's own connection, inside its own transaction.

The job exists only if that transaction commits, and the wake-up NOTIFY is sent at
that commit. Works with asyncpg connections and psycopg 3 connections, sync or
async. The insert is written once, async (``insert_with``); for a sync psycopg
connection it is driven without an event loop (``flows.drive``), since it never
really waits.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ferryq.errors import ConfigurationError
from ferryq.store.base import Inserted, NewJob
from ferryq.store.flows import drive
from ferryq.store.postgres.inserts import insert_jobs, insert_with
from ferryq.store.postgres.queries import Statement

Runner = Callable[[Statement, dict[str, Any]], Awaitable[list[Any]]]


def driver_of(connection: object) -> str:
    module = type(connection).__module__
    if module.startswith("asyncpg"):
        return "asyncpg"
    if module.startswith("psycopg"):
        return "psycopg-async" if hasattr(connection, "__aenter__") else "psycopg"
    raise ConfigurationError(
        f"cannot enqueue on a {type(connection).__qualname__}: pass an asyncpg connection "
        "or a psycopg 3 connection"
    )


async def insert_async(connection: Any, job: NewJob, args: Sequence[str]) -> list[Inserted]:
    driver = driver_of(connection)
    if driver == "psycopg":
        raise ConfigurationError("a sync psycopg connection needs enqueue(), not enqueue_async()")
    if driver == "asyncpg":
        return await insert_jobs(connection, job, args)

    async def psycopg_run(statement: Statement, params: dict[str, Any]) -> list[Any]:
        cursor = await connection.execute(statement.pyformat, params)
        return list(await cursor.fetchall()) if cursor.description else []

    return await insert_with(psycopg_run, job, args)


def insert_sync(connection: Any, job: NewJob, args: Sequence[str]) -> list[Inserted]:
    if driver_of(connection) != "psycopg":
        raise ConfigurationError("an async connection needs enqueue_async(), not enqueue()")

    async def run(statement: Statement, params: dict[str, Any]) -> list[Any]:
        cursor = connection.execute(statement.pyformat, params)
        return list(cursor.fetchall()) if cursor.description else []

    return drive(insert_with(run, job, args))
