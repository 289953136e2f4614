"""The raw driver's one-job enqueue: the limit ferryq's is measured against.

Each call inserts one row into ferryq's own ``ferryq_jobs`` (a database ferryq migrated)
and commits it, on the same database and settings as ferryq: the columns of ferryq's
job insert (ferryq/store/*/queries.sql) with the values of a job ferryq enqueued
first, its args ``[i]`` and its times fresh. ``prepare(url)`` migrates and enqueues
that first job. See bench/enqueue.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import time
from collections.abc import Callable
from typing import Any

import asyncpg

from bench import calls

#: The columns ferryq's job insert writes (ferryq/store/*/queries.sql, job_insert).
COLUMNS = ("namespace", "queue", "task", "args", "state", "lane", "priority", "run_at",
           "order_time", "expires_at", "ttr", "max_tries", "retry", "unique_key", "stage",
           "context", "meta", "created_at", "timeout")  # fmt: skip
TIMES = ("run_at", "order_time", "created_at")  # fresh for every row, as ferryq's are


class Rows:
    """Rows like the one ferryq wrote for ``noop(0)``: the same values but for the
    args (``[i]``) and the times (now, each offset from created_at as ferryq's was)."""

    def __init__(self, template: dict[str, Any]) -> None:
        self.template = template
        self.offsets = {name: template[name] - template["created_at"] for name in TIMES}

    def __call__(self, i: int) -> list[Any]:
        now = time.time()
        row = {**self.template, "args": json.dumps([i])}
        row.update((name, now + offset) for name, offset in self.offsets.items())
        return [row[name] for name in COLUMNS]


def _sqlite_path(url: str) -> str:
    return url.removeprefix("sqlite:///").split("?")[0]


def _sqlite_connect(path: str, synchronous: str) -> sqlite3.Connection:
    """A connection with the pragmas ferryq's SQLite store sets on its own."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    for pragma in ("busy_timeout = 10000", "journal_mode = WAL", f"synchronous = {synchronous}",
                   "cache_size = -65536"):  # fmt: skip
        conn.execute(f"PRAGMA {pragma}")
    return conn


def sqlite(
    url: str, n: int, connections: int, synchronous: str, prepare: Callable[[str], None]
) -> float:
    """Inserts/s, one ``BEGIN IMMEDIATE`` + INSERT + ``COMMIT`` per call, from one
    connection in a loop or from ``connections`` threads with a connection each."""
    prepare(url)
    path = _sqlite_path(url)
    with contextlib.closing(sqlite3.connect(path)) as reader:
        reader.row_factory = sqlite3.Row
        found = reader.execute(f"SELECT {', '.join(COLUMNS)} FROM ferryq_jobs "
                               "ORDER BY id DESC LIMIT 1").fetchone()  # fmt: skip
    rows = Rows(dict(found))
    places = ", ".join("?" * len(COLUMNS))
    insert = f"INSERT INTO ferryq_jobs ({', '.join(COLUMNS)}) VALUES ({places})"
    conns = [_sqlite_connect(path, synchronous) for _ in range(connections)]

    def caller(conn: sqlite3.Connection) -> calls.SyncCall:
        def call(i: int) -> None:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(insert, rows(i))
            conn.execute("COMMIT")

        return call

    try:
        if connections == 1:
            return calls.loop(caller(conns[0]), n)
        return calls.threads([caller(conn) for conn in conns], n)
    finally:
        for conn in conns:
            conn.close()


async def postgres(url: str, n: int, connections: int, prepare: Callable[[str], None]) -> float:
    """Inserts/s, one autocommit INSERT per call (asyncpg), from one connection in a
    loop or from ``connections`` connections at once."""
    await asyncio.to_thread(prepare, url)
    conns = [await asyncpg.connect(url) for _ in range(connections)]
    try:
        found = await conns[0].fetchrow(f"SELECT {', '.join(COLUMNS)} FROM ferryq_jobs "
                                        "ORDER BY id DESC LIMIT 1")  # fmt: skip
        rows = Rows(dict(found))
        places = ", ".join(f"${k}" for k in range(1, len(COLUMNS) + 1))
        insert = f"INSERT INTO ferryq_jobs ({', '.join(COLUMNS)}) VALUES ({places})"

        def caller(conn: Any) -> calls.AsyncCall:
            return lambda i: conn.execute(insert, *rows(i))

        if connections == 1:
            return await calls.loop_async(caller(conns[0]), n)
        return await calls.gather([caller(conn) for conn in conns], n)
    finally:
        for conn in conns:
            await conn.close()
