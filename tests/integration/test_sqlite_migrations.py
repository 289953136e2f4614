"""SQLite migrations applied to a database that already holds jobs."""

from __future__ import annotations

import pathlib
import sqlite3

from ferryq.job import State
from ferryq.store import open_store
from ferryq.store.base import Finish
from ferryq.store.sql import split_script
from ferryq.store.sqlite import store as sqlite_store
from ferryq.store.sqlite.queries import MIGRATIONS
from tests.conformance.jobs import NS, new_job
from tests.conftest import START


def migrated_to(path: pathlib.Path, version: int) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(
        "CREATE TABLE ferryq_migrations "
        "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
    )
    for number, name, sql in MIGRATIONS:
        if number <= version:
            for statement in split_script(sql):
                conn.execute(statement)
            conn.execute("INSERT INTO ferryq_migrations VALUES (?, ?, ?)", (number, name, START))
    return conn


async def test_history_keeps_every_job_when_it_is_rekeyed_in_finish_order(
    tmp_path: pathlib.Path,
) -> None:
    path = tmp_path / "old.db"
    conn = migrated_to(path, 6)
    # Written as version 6 wrote them: three jobs, two finished out of id order.
    conn.execute("BEGIN IMMEDIATE")
    ids = [row.id for row in sqlite_store._insert_many(conn, new_job(START), ["[1]", "[2]", "[3]"])]
    claimed = {c.id: c for c in sqlite_store._claim(conn, NS, ["default"], 3, "w", START)}
    finishes = [
        Finish("succeeded", ids[2], claimed[ids[2]].fence, START + 1, START, result="3"),
        Finish("dead", ids[0], claimed[ids[0]].fence, START + 2, START, error={"message": "x"}),
    ]
    sqlite_store._finish_many(conn, finishes)
    before = {i: sqlite_store._get(conn, i) for i in ids}
    conn.execute("COMMIT")
    conn.close()

    store = open_store(f"sqlite:///{path}")
    await store.open()
    try:
        assert await store.schema_version() == len(MIGRATIONS)
        assert {i: await store.job_get(i) for i in ids} == before
        await store.job_finish_many(
            [Finish("succeeded", ids[1], claimed[ids[1]].fence, START + 3, START)]
        )
        finished = await store.job_get(ids[1])
        assert finished is not None and finished.state == State.SUCCEEDED
        # The history written before migration 0008 is counted, then folded.
        counts = {(NS, "default", "succeeded"): 2, (NS, "default", "dead"): 1}
        assert await store.job_counts(NS) == counts
        assert await store.history_fold(START + 3) == 3
        assert await store.job_counts(NS) == counts
    finally:
        await store.close()
    with sqlite3.connect(path) as check:
        order = [row[0] for row in check.execute("SELECT id FROM ferryq_history ORDER BY hid")]
        plan = check.execute("EXPLAIN QUERY PLAN SELECT * FROM ferryq_history WHERE id = 1")
        assert order == [ids[2], ids[0], ids[1]]  # the order they finished in
        assert "INDEX" in " ".join(row[3] for row in plan)
