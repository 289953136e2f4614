"""History counts: what job_counts (the dashboard, /metrics, `ferryq stats`) costs as
the history grows, read whole and folded.

    python -m bench.history_counts [--backend sqlite|postgres|both] [--rows N] [--reads N]

Fills the history with ``--rows`` finished jobs over the 14 days of the default
retention, today included, in 5 queues and 3 states, then times ``job_counts`` (the
median of ``--reads`` calls) before anything is folded — what every call cost before
migration 0008 — and after maintenance has folded all it may. On PostgreSQL today's
partition is still read whole (a day is folded an hour after it ends); SQLite folds
everything.
The fold's own time is shown too (done once, by maintenance, a step per tick).

PostgreSQL comes from FERRYQ_BENCH_PG_URL or a throwaway cluster made durable
(bench/pg_cluster.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import pathlib
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Iterator

import asyncpg

import ferryq
from bench.pg_cluster import cluster
from ferryq.store import Store, open_store
from ferryq.store.postgres.store import PostgresStore
from ferryq.testing import drain
from tests.pg import fresh_database

DAY = 86_400.0
DAYS = 14


def seed(url: str) -> None:
    """One finished job, the template of every history row the fill writes."""
    app = ferryq.App(url)

    @app.task(queue="q0")
    def noop() -> None:
        return None

    noop.enqueue()
    drain(app)
    app.close()


def fill_sqlite(path: pathlib.Path, rows: int, now: float) -> None:
    conn = sqlite3.connect(path)
    columns = [r[1] for r in conn.execute("PRAGMA table_info(ferryq_history)")
               if r[1] not in ("hid", "id", "queue", "state", "finished_at")]  # fmt: skip
    listed = ", ".join(columns)
    conn.execute(
        f"INSERT INTO ferryq_history (id, queue, state, finished_at, {listed}) "
        "WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < ?) "
        "SELECT 1000000 + i, 'q' || (i % 5), "
        "CASE i % 50 WHEN 0 THEN 'dead' WHEN 1 THEN 'cancelled' ELSE 'succeeded' END, "
        f"? - (? - i) * ?, {listed} FROM s, (SELECT * FROM ferryq_history LIMIT 1)",
        (rows, now, rows, DAYS * DAY / rows),
    )
    conn.commit()
    conn.close()


async def fill_postgres(url: str, store: Store, rows: int, now: float) -> None:
    assert isinstance(store, PostgresStore)
    for day in range(0, DAYS + 3, 3):  # each call: the day before to 3 days after
        await store.history_ensure_partitions(now - day * DAY)
    conn = await asyncpg.connect(url)
    try:
        columns = [r[0] for r in await conn.fetch(
            "SELECT column_name FROM information_schema.columns WHERE table_name = "
            "'ferryq_history' AND column_name NOT IN ('id', 'queue', 'state', 'finished_at') "
            "ORDER BY ordinal_position")]  # fmt: skip
        listed = ", ".join(columns)
        await conn.execute(
            f"INSERT INTO ferryq_history (id, queue, state, finished_at, {listed}) "
            "SELECT 1000000 + i, 'q' || (i % 5), "
            "CASE i % 50 WHEN 0 THEN 'dead' WHEN 1 THEN 'cancelled' ELSE 'succeeded' END, "
            f"$2::float8 - ($1 - i) * $3::float8, {listed} "
            "FROM generate_series(1, $1) i, (SELECT * FROM ferryq_history LIMIT 1) h",
            rows, now, DAYS * DAY / rows,
        )  # fmt: skip
        await conn.execute("ANALYZE ferryq_history")
    finally:
        await conn.close()


async def read_time(store: Store, reads: int) -> tuple[float, int]:
    times, total = [], 0
    for _ in range(reads):
        started = time.perf_counter()
        counts = await store.job_counts(None)
        times.append(time.perf_counter() - started)
        total = sum(counts.values())
    return statistics.median(times) * 1000, total


async def measure(url: str, path: pathlib.Path | None, rows: int, reads: int) -> dict[str, float]:
    now = time.time()
    store = open_store(url)
    await store.open()
    try:
        if path is not None:
            fill_sqlite(path, rows, now)
        else:
            await fill_postgres(url, store, rows, now)
        whole, total_whole = await read_time(store, reads)
        started = time.perf_counter()
        while await store.history_fold(now):
            pass
        fold = time.perf_counter() - started
        folded, total_folded = await read_time(store, reads)
        assert total_whole == total_folded == rows + 1, (total_whole, total_folded)
    finally:
        await store.close()
    return {"whole": whole, "folded": folded, "fold": fold}


@contextlib.contextmanager
def databases(backend: str, workdir: pathlib.Path) -> Iterator[tuple[str, pathlib.Path | None]]:
    if backend == "sqlite":
        path = workdir / "counts.db"
        yield f"sqlite:///{path}", path
        return
    with cluster() as pg, fresh_database(pg) as url:
        yield url, None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--reads", type=int, default=5)
    options = parser.parse_args()
    backends = ("sqlite", "postgres") if options.backend == "both" else (options.backend,)
    with tempfile.TemporaryDirectory() as tmp:
        for backend in backends:
            with databases(backend, pathlib.Path(tmp)) as (url, path):
                seed(url)
                found = asyncio.run(measure(url, path, options.rows, options.reads))
            print(
                f"{backend}: job_counts over {options.rows:,} history rows: read whole "
                f"{found['whole']:,.1f} ms, folded {found['folded']:,.1f} ms "
                f"({found['whole'] / found['folded']:,.0f}x faster); "
                f"folding them took {found['fold']:,.1f} s once",
                flush=True,
            )


if __name__ == "__main__":
    main()
