"""How fast the dashboard answers with a long history, on SQLite and on PostgreSQL.

    python -m bench.dashboard [--jobs N] [--requests N] [--backends sqlite,postgres]

For each backend: a fresh database whose history holds ``--jobs`` finished jobs (one
bulk INSERT … SELECT through the driver: 98 % succeeded, 1.5 % dead, 0.5 % cancelled,
over four queues, a tenth of them in 5,000 lanes, a twentieth in a second namespace,
finished over the last 20 hours), plus a thousand ready jobs enqueued through ferryq.
Then a real ``ferryq server`` on loopback, an operator signed in, and every page asked
for once and then ``--requests`` times more: the first answer, the median and the
slowest of the others are printed, in milliseconds, as the browser sees them (the
whole HTTP answer). The aim: the jobs list and the job page under 200 ms. The first
overview waits for its counts of the whole history; later ones are served from the
last computed overview while it is recomputed in the background.

PostgreSQL is FERRYQ_BENCH_PG_URL (an admin URL on a server of yours) or a throwaway
cluster from the machine's binaries made durable (``bench.pg_cluster``).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import asyncpg
import httpx

import ferryq
from bench.pg_cluster import cluster
from tests.pg import fresh_database
from tests.server.harness import running_server

CREDENTIAL = ("admin", "bench-password")
SPAN = 20 * 3600.0  # history finished over the last 20 hours
LANES = 5000

# One row of history per g in 1..jobs; every column derived from g, so both backends
# hold the same jobs. {t0} and {step} are the first finish and the spacing, {g} is g as
# text and {jsonb} the cast PostgreSQL needs for its jsonb column.
_ROW = {
    "id": "g",
    "namespace": "CASE WHEN g % 20 = 0 THEN 'tenant-b' ELSE 'default' END",
    "queue": (
        "CASE WHEN g % 20 = 7 THEN 'uploads' WHEN g % 10 = 3 THEN 'reports' "
        "WHEN g % 4 = 1 THEN 'images' ELSE 'mail' END"
    ),
    "task": (
        "CASE WHEN g % 20 = 7 THEN 'upload' WHEN g % 10 = 3 THEN 'report' "
        "WHEN g % 4 = 1 THEN 'resize' ELSE 'send' END"
    ),
    "args": "'[\"user' || {g} || '@example.com\"]'",
    "state": (
        "CASE WHEN g % 200 < 3 THEN 'dead' WHEN g % 200 = 3 THEN 'cancelled' ELSE 'succeeded' END"
    ),
    "lane": "CASE WHEN g % 10 = 5 THEN 'post:' || {lane} ELSE NULL END",
    "run_at": "{t0} + g * {step}",
    "order_time": "{t0} + g * {step}",
    "ttr": "60",
    "max_tries": "3",
    "attempts": "CASE WHEN g % 200 < 3 THEN 3 ELSE 1 END",
    "fence": "CASE WHEN g % 200 < 3 THEN 3 ELSE 1 END",
    "result": "CASE WHEN g % 200 < 4 THEN NULL ELSE '{{\"ok\": true}}' END",
    "error": (
        'CASE WHEN g % 200 < 3 THEN \'{{"type": "ConnectionError", "message": '
        '"refused", "traceback": null, "attempt": 3}}\'{jsonb} ELSE NULL END'
    ),
    "created_at": "{t0} + g * {step}",
    "claimed_at": "{t0} + g * {step} + 0.05",
    "started_at": "{t0} + g * {step} + 0.051",
    "finished_at": "{t0} + g * {step} + 0.07",
    "worker": "'bench:1'",
}


def _select(jobs: int, now: float, postgres: bool) -> str:
    fill = {"t0": repr(now - SPAN), "step": repr(SPAN / jobs),
            "g": "g::text" if postgres else "g",
            "lane": f"(g % {LANES})::text" if postgres else f"(g % {LANES})",
            "jsonb": "::jsonb" if postgres else ""}  # fmt: skip
    return ", ".join(expr.format(**fill) for expr in _ROW.values())


def fill_sqlite(path: Path, jobs: int, now: float) -> None:
    conn = sqlite3.connect(path)
    try:
        with conn:
            conn.execute(
                f"INSERT INTO ferryq_history ({', '.join(_ROW)}) "
                f"WITH RECURSIVE n(g) AS (SELECT 1 UNION ALL SELECT g + 1 FROM n WHERE g < ?) "
                f"SELECT {_select(jobs, now, postgres=False)} FROM n",
                (jobs,),
            )
            # Jobs enqueued from now on get ids above the history's.
            conn.execute("DELETE FROM sqlite_sequence WHERE name = 'ferryq_jobs'")
            conn.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('ferryq_jobs', ?)",
                         (jobs,))  # fmt: skip
    finally:
        conn.close()


async def fill_postgres(url: str, jobs: int, now: float) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            f"INSERT INTO ferryq_history ({', '.join(_ROW)}) "
            f"SELECT {_select(jobs, now, postgres=True)} FROM generate_series(1, {jobs}) AS g"
        )
        await conn.execute(f"SELECT setval(pg_get_serial_sequence('ferryq_jobs', 'id'), {jobs})")
        await conn.execute("ANALYZE")  # as autovacuum would, soon after a load like this
    finally:
        await conn.close()


async def _open(url: str) -> None:
    """The schema and, on PostgreSQL, the history partitions of the days around now."""
    app = ferryq.App(url)
    await app.store()
    await app.aclose()


def prepare(url: str, jobs: int) -> None:
    """Schema, history, and a thousand ready jobs enqueued the ordinary way."""
    asyncio.run(_open(url))
    now = time.time()
    started = time.monotonic()
    if url.startswith("sqlite"):
        fill_sqlite(Path(url.removeprefix("sqlite:///")), jobs, now)
    else:
        asyncio.run(fill_postgres(url, jobs, now))
    print(f"  filled {jobs:,} finished jobs in {time.monotonic() - started:.1f} s")
    app = ferryq.App(url)
    app.enqueue_many("send", [(f"hot{i}@example.com",) for i in range(1000)], queue="mail")
    app.close()


def cases(jobs: int) -> list[tuple[str, str]]:
    middle = jobs // 2
    dead = next(g for g in range(middle, jobs) if g % 200 == 1)
    return [
        ("jobs: newest page", "/ui/jobs"),
        ("jobs: a page in the middle", f"/ui/jobs?after={middle}"),
        ("jobs: state=dead", "/ui/jobs?state=dead"),
        ("jobs: queue=uploads", "/ui/jobs?queue=uploads"),
        ("jobs: task=report", "/ui/jobs?task=report"),
        ("jobs: namespace=tenant-b", "/ui/jobs?ns=tenant-b"),
        ("jobs: lane=post:42 (20 jobs)", "/ui/jobs?lane=post%3A42"),
        ("jobs: args contain (1 job)", f"/ui/jobs?q=user{middle + 7}%40"),
        ("jobs: task=nothing (no job)", "/ui/jobs?task=nothing"),
        ("job page: succeeded", f"/ui/jobs/{middle + 10}"),
        ("job page: dead", f"/ui/jobs/{dead}"),
        ("dead letters", "/ui/dead"),
        ("overview", "/ui/"),
        ("lanes", "/ui/lanes"),
        ("workers", "/ui/workers"),
    ]


@contextmanager
def signed_in(api: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=api, timeout=120) as client:
        form = client.get("/ui/login").text
        found = re.search(r'name="csrf" value="([^"]+)"', form)
        assert found is not None
        user, password = CREDENTIAL
        answer = client.post("/ui/login", data={"csrf": found[1], "user": user,
                                                "password": password})  # fmt: skip
        assert answer.status_code == 303, answer.text
        yield client


def measure(client: httpx.Client, path: str, requests: int) -> tuple[float, float, float]:
    """The first answer, then the median and slowest of ``requests`` more, in ms.

    A first overview that is still being counted is asked for again until it is there:
    its time is until the counts are shown.
    """
    began = time.perf_counter()
    while 'id="counting"' in (first_answer := client.get(path)).text:
        time.sleep(0.05)
    assert first_answer.status_code == 200, path
    first = (time.perf_counter() - began) * 1000
    took = []
    for _ in range(requests):
        began = time.perf_counter()
        answer = client.get(path)
        took.append((time.perf_counter() - began) * 1000)
        assert answer.status_code == 200, (path, answer.status_code)
    return first, statistics.median(took), max(took)


def run_backend(url: str, name: str, options: argparse.Namespace, logs: Path) -> None:
    print(f"\n{name}: {options.jobs:,} jobs in history")
    prepare(url, options.jobs)
    with running_server(url, logs, credential=":".join(CREDENTIAL)) as server:
        print(f"  {'page':<34} {'first':>10} {'median':>10} {'slowest':>10}")
        with signed_in(server.api) as client:
            for label, path in cases(options.jobs):
                first, median, slowest = measure(client, path, options.requests)
                mark = "" if median < 200 else "   over 200 ms"
                print(f"  {label:<34} {first:7.1f} ms {median:7.1f} ms {slowest:7.1f} ms{mark}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=7)
    parser.add_argument("--backends", default="sqlite,postgres")
    options = parser.parse_args()
    backends = options.backends.split(",")
    with tempfile.TemporaryDirectory(prefix="ferryq-bench-dashboard-") as tmp:
        folder = Path(tmp)
        if "sqlite" in backends:
            run_backend(f"sqlite:///{folder}/bench.db", "SQLite", options, folder)
        if "postgres" in backends:
            with cluster() as pg, fresh_database(pg) as url:
                run_backend(url, "PostgreSQL", options, folder)


if __name__ == "__main__":
    main()
