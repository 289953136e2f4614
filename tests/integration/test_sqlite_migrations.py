"""SQLite migrations applied to a database that already holds jobs."""

from __future__ import annotations

import pathlib
import sqlite3

from ferryq.job import State
from ferryq.store import open_store
from ferryq.store.base import Finish
from ferryq.store.sql import split_script
from ferryq.store.sqlite.queries import MIGRATIONS
from tests.conformance.jobs import NS
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
    # Written as version 6 wrote them, in its columns: three jobs, two finished out of
    # id order (3 succeeded, then 1 died), the other one running.
    conn.execute("BEGIN IMMEDIATE")
    for n in (1, 2, 3):
        conn.execute(
            "INSERT INTO ferryq_jobs (id, namespace, queue, task, args, state, run_at, "
            "order_time, ttr, max_tries, created_at) "
            "VALUES (?, ?, 'default', 't', ?, 'ready', ?, ?, 60, 3, ?)",
            (n, NS, f"[{n}]", START, START, START),
        )
    conn.execute("UPDATE ferryq_jobs SET state = 'running', attempts = 1, fence = 1, "
                 "claimed_at = ?, started_at = ?, lease_until = ?, worker = 'w'",
                 (START, START, START + 60))  # fmt: skip
    for job_id, state, finished_at, result, error in (
        (3, "succeeded", START + 1, "3", None), (1, "dead", START + 2, None, '{"message": "x"}')
    ):  # fmt: skip
        conn.execute("INSERT INTO ferryq_history SELECT * FROM ferryq_jobs WHERE id = ?",
                     (job_id,))  # fmt: skip
        conn.execute("UPDATE ferryq_history SET state = ?, finished_at = ?, result = ?, "
                     "error = ?, lease_until = NULL WHERE id = ?",
                     (state, finished_at, result, error, job_id))  # fmt: skip
        conn.execute("DELETE FROM ferryq_jobs WHERE id = ?", (job_id,))
    conn.execute("COMMIT")
    conn.close()
    ids = [1, 2, 3]

    store = open_store(f"sqlite:///{path}")
    await store.open()
    try:
        assert await store.schema_version() == len(MIGRATIONS)
        jobs = {i: await store.job_get(i) for i in ids}
        assert {i: (j.state, j.result, j.error, j.fence) for i, j in jobs.items() if j} == {
            1: (State.DEAD, None, {"message": "x"}, 1), 2: (State.RUNNING, None, None, 1),
            3: (State.SUCCEEDED, 3, None, 1),
        }  # fmt: skip
        await store.job_finish_many([Finish("succeeded", ids[1], 1, START + 3, START)])
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
