"""Enqueue in a SQLAlchemy session's transaction against ferryq's own connection.

    python -m bench.transactional [--backend sqlite|postgres|both] [--rounds N] [--calls N]

One job per transaction, ``--calls`` transactions per measurement (1,000), a no-op task
``noop(x: int)``, on one caller:

- ``own, sync``: ``task.enqueue(i)``, committed by ferryq on its own connection;
- ``Session``: ``with Session(engine) as s, s.begin(): task.using(s).enqueue(i)``,
  sqlite3 or psycopg 3 (the session is made and ended each time, as a web request does);
- ``own, async``: ``await task.enqueue_async(i)``;
- ``AsyncSession``: the same in an ``AsyncSession``, aiosqlite or asyncpg;
- ``Session alone``, ``AsyncSession alone``: the session's transaction with a
  ``SELECT 1`` and no job, what the session costs by itself.

On SQLite the application's connections commit as ferryq's own (synchronous NORMAL in
WAL, set at connect): sqlite3's default, FULL, syncs at every commit.

SQLite is ferryq's default (WAL, synchronous NORMAL) in a temporary folder; PostgreSQL
is durable (bench/pg_cluster.py). Each figure is the median of ``--rounds`` rounds, a
round measuring each in turn on a fresh database after one warm-up transaction; the
ratios are the session's median over ferryq's own (the aim: 0.8 or more).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import ferryq
from bench.pg_cluster import cluster
from tests.pg import fresh_database

MEASURES = (
    "own, sync", "Session", "Session alone", "own, async", "AsyncSession", "AsyncSession alone"
)  # fmt: skip
#: What the session costs by itself: a transaction of one SELECT 1 and no job.
ONE = text("SELECT 1")
RATIOS = (("Session", "own, sync"), ("AsyncSession", "own, async"))


def _with_driver(url: str, sqlite: str, postgres: str) -> str:
    return (sqlite if url.startswith("sqlite") else postgres) + url[url.index(":") :]


def _normal(engine: Engine, url: str) -> None:
    """SQLite: the application's connections commit as ferryq's do (WAL, synchronous
    NORMAL): a connection's default, FULL, would sync the WAL at each commit, which is
    the application's setting to choose and not what is measured here."""
    if url.startswith("sqlite"):
        event.listen(engine, "connect", lambda conn, _: conn.execute("PRAGMA synchronous = NORMAL"))


def one_round(url: str, calls: int) -> dict[str, float]:
    """Jobs per second of each measure on the database at ``url``, migrated here."""
    app = ferryq.App(url)
    noop = app.task(name="noop")(lambda x: None)
    app.portal_call(app.store())
    engine = create_engine(_with_driver(url, "sqlite", "postgresql+psycopg"))
    _normal(engine, url)
    found: dict[str, float] = {}
    try:

        def own(i: int) -> None:
            noop.enqueue(i)

        def in_session(i: int) -> None:
            with Session(engine) as session, session.begin():
                noop.using(session).enqueue(i)

        def alone(i: int) -> None:
            with Session(engine) as session, session.begin():
                session.execute(ONE)

        found["own, sync"] = _timed(own, calls)
        found["Session"] = _timed(in_session, calls)
        found["Session alone"] = _timed(alone, calls)
        found.update(app.portal_call(_async_round(app, noop, url, calls)))
    finally:
        engine.dispose()
        app.close()
    return found


async def _async_round(
    app: ferryq.App, noop: ferryq.Task[[int], None], url: str, calls: int
) -> dict[str, float]:
    engine = create_async_engine(_with_driver(url, "sqlite+aiosqlite", "postgresql+asyncpg"))
    _normal(engine.sync_engine, url)
    try:

        async def in_session(i: int) -> None:
            async with AsyncSession(engine) as session, session.begin():
                await noop.using(session).enqueue_async(i)

        async def alone(i: int) -> None:
            async with AsyncSession(engine) as session, session.begin():
                await session.execute(ONE)

        return {
            "own, async": await _timed_async(noop.enqueue_async, calls),
            "AsyncSession": await _timed_async(in_session, calls),
            "AsyncSession alone": await _timed_async(alone, calls),
        }
    finally:
        await engine.dispose()


def _timed(call: Callable[[int], object], calls: int) -> float:
    call(-1)  # warm-up: connections opened, statements prepared
    began = time.perf_counter()
    for i in range(calls):
        call(i)
    return calls / (time.perf_counter() - began)


async def _timed_async(call: Callable[[int], object], calls: int) -> float:
    await call(-1)  # type: ignore[misc]
    began = time.perf_counter()
    for i in range(calls):
        await call(i)  # type: ignore[misc]
    return calls / (time.perf_counter() - began)


@contextlib.contextmanager
def databases(
    backend: str, folder: Path
) -> Iterator[Callable[[], contextlib.AbstractContextManager[str]]]:
    """Fresh databases of ``backend``, one a round."""
    if backend == "sqlite":
        count = iter(range(1_000_000))

        @contextlib.contextmanager
        def sqlite_file() -> Iterator[str]:
            yield f"sqlite:///{folder / f'round-{next(count)}.db'}"

        yield sqlite_file
        return
    with cluster() as pg:
        yield lambda: fresh_database(pg)


def report(backend: str, figures: dict[str, list[float]], rounds: int) -> None:
    setting = "SQLite NORMAL" if backend == "sqlite" else "PostgreSQL, durable"
    print(f"\n{setting}: medians of {rounds} rounds, jobs/s, one job per transaction")
    medians = {name: statistics.median(figures[name]) for name in MEASURES}
    for name in MEASURES:
        print(f"  {name:<20} {medians[name]:>10,.0f}")
    for session, own in RATIOS:
        print(f"  ratio {session} / {own}: {medians[session] / medians[own]:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--backend", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=1_000)
    options = parser.parse_args()
    backends = ("sqlite", "postgres") if options.backend == "both" else (options.backend,)
    results: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for backend in backends:
            results[backend] = {name: [] for name in MEASURES}
            with databases(backend, Path(tmp)) as fresh:
                for round_no in range(1, options.rounds + 1):
                    with fresh() as url:
                        found = one_round(url, options.calls)
                    for name, value in found.items():
                        results[backend][name].append(value)
                    print(f"{backend} round {round_no}: " + ", ".join(
                        f"{k} {v:,.0f}" for k, v in found.items()), flush=True)  # fmt: skip
    for backend, figures in results.items():
        report(backend, figures, options.rounds)


if __name__ == "__main__":
    main()
