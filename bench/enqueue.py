"""One job per enqueue call, as web apps enqueue: ferryq against the raw driver and peers.

    python -m bench.enqueue [--calls N] [--rounds N] [--only sqlite,sqlite-full,postgres]

A no-op task ``noop(x: int)``, ``--calls`` calls per measurement (2,000), each call
enqueueing one job and returning once it is committed. Three settings, side by side
in one run:

- ``sqlite``: ferryq's default, ``sqlite:///file.db`` (WAL, synchronous NORMAL);
- ``sqlite-full``: ``sqlite:///file.db?synchronous=full`` (WAL, synchronous FULL);
- ``postgres``: a durable PostgreSQL (fsync, synchronous_commit and full_page_writes
  on; FERRYQ_BENCH_PG_URL or a throwaway cluster, see bench/pg_cluster.py).

Measured on each, a fresh database per measurement (bench/calls.py times them: one
warm-up call per caller first, then ``time.perf_counter`` around the calls):

- ferryq, one caller: ``task.enqueue(i)`` in a loop; ``await task.enqueue_async(i)``
  in a loop;
- ferryq, concurrent: 16 threads calling ``task.enqueue(i)`` (``--calls`` in all);
  100 coroutines under one ``asyncio.gather`` awaiting ``task.enqueue_async(i)``;
- the raw driver (bench/raw_enqueue.py), the limit, on the same database and settings,
  inserting into ferryq's own ``ferryq_jobs`` (migrated by ferryq) a row like the one
  ferryq writes (the columns of queries.sql's job insert, the values of a job ferryq
  enqueued first, fresh times and args): SQLite, the stdlib ``sqlite3`` with ferryq's pragmas
  and ``BEGIN IMMEDIATE`` + INSERT + ``COMMIT`` per call, from one connection in a
  loop and from 16 threads with a connection each; PostgreSQL, asyncpg, one
  autocommit INSERT per call (no wake-up NOTIFY, which ferryq's insert sends), one
  connection in a loop and 16 connections at once. SQLite takes one writer at a
  time: its 16 connections wait for the lock in SQLite's busy handler, which sleeps
  (1 ms, then longer), so that figure falls below one connection's; it is what
  uncoordinated writers get, not a limit;
- peers, one job per call: on SQLite, huey's ``SqliteHuey`` (calling a task
  enqueues it) in a loop and from 16 threads, at the row's synchronous; on
  PostgreSQL, PGQueuer's ``Queries.enqueue(entrypoint, payload)`` and Procrastinate's
  ``await task.defer_async(x=i)``, in a loop and 100 at once, each peer's schema
  installed in the database it is measured on.

Each figure is the median of ``--rounds`` rounds (a round measures everything once,
in turn). A measurement that fails prints ``n/a (reason)`` and the run goes on.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import pathlib
import platform
import shutil
import sqlite3
import subprocess
import tempfile
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from importlib import metadata

import ferryq
from bench import calls
from bench import raw_enqueue as raw
from bench.ferryq_runs import median
from bench.peers import huey_sqlite, postgres_peers

TASK = "bench.noop"
THREADS = 16  # sync callers: a threaded web server's workers
CALLERS = 100  # async callers: requests in flight on one event loop
RAW_CONNECTIONS = 16
ROOT = pathlib.Path(__file__).resolve().parents[1]

Measure = Callable[[str, int, pathlib.Path], float]  # (url, calls, workdir) -> calls/s
Databases = Callable[[], contextlib.AbstractContextManager[str]]
Result = float | str  # calls/s, or why the measurement failed


def noop(x: int) -> None:
    """The task: enqueued only, never run here."""


def _ferryq(url: str) -> tuple[ferryq.App, ferryq.Task[[int], None]]:
    app = ferryq.App(url)
    return app, app.task(name=TASK)(noop)


# -- ferryq ----------------------------------------------------------------------------


def ferryq_loop(url: str, n: int, _workdir: pathlib.Path) -> float:
    app, task = _ferryq(url)
    try:
        return calls.loop(task.enqueue, n)
    finally:
        app.close()


def ferryq_loop_async(url: str, n: int, _workdir: pathlib.Path) -> float:
    async def measure() -> float:
        app, task = _ferryq(url)
        try:
            return await calls.loop_async(task.enqueue_async, n)
        finally:
            await app.aclose()

    return asyncio.run(measure())


def ferryq_threads(url: str, n: int, _workdir: pathlib.Path) -> float:
    app, task = _ferryq(url)
    try:
        return calls.threads([task.enqueue] * THREADS, n)
    finally:
        app.close()


def ferryq_gather(url: str, n: int, _workdir: pathlib.Path) -> float:
    async def measure() -> float:
        app, task = _ferryq(url)
        try:
            return await calls.gather([task.enqueue_async] * CALLERS, n)
        finally:
            await app.aclose()

    return asyncio.run(measure())


def _template_job(url: str) -> None:
    """Migrate a ferryq database and enqueue ``noop(0)``: the row to copy."""
    app, task = _ferryq(url)
    try:
        app.migrate()
        task.enqueue(0)
    finally:
        app.close()


# -- what is measured where ---------------------------------------------------------------


@dataclass(frozen=True)
class Backend:
    key: str
    title: str
    query: str = ""  # added to a SQLite URL
    synchronous: str | None = None  # SQLite's; None for PostgreSQL


BACKENDS = {
    "sqlite": Backend("sqlite", "SQLite, ferryq's default: WAL, synchronous NORMAL", "", "NORMAL"),
    "sqlite-full": Backend("sqlite-full", "SQLite, ?synchronous=full: WAL, synchronous FULL",
                           "?synchronous=full", "FULL"),
    "postgres": Backend("postgres", "PostgreSQL, durable"),
}  # fmt: skip

FERRYQ: dict[str, Measure] = {
    "ferryq.loop": ferryq_loop,
    "ferryq.loop_async": ferryq_loop_async,
    "ferryq.threads": ferryq_threads,
    "ferryq.gather": ferryq_gather,
}
LABELS = {
    "ferryq.loop": "ferryq, task.enqueue(i) in a loop",
    "ferryq.loop_async": "ferryq, await task.enqueue_async(i) in a loop",
    "ferryq.threads": f"ferryq, {THREADS} threads calling task.enqueue(i)",
    "ferryq.gather": f"ferryq, {CALLERS} coroutines awaiting task.enqueue_async(i)",
    "raw.loop": "raw driver, one connection in a loop",
    "raw.concurrent": f"raw driver, {RAW_CONNECTIONS} connections at once",
    "huey.loop": "huey SqliteHuey, calling a task in a loop",
    "huey.threads": f"huey SqliteHuey, {THREADS} threads calling a task",
    "pgqueuer.loop": "PGQueuer, Queries.enqueue(...) in a loop",
    "pgqueuer.gather": f"PGQueuer, {CALLERS} coroutines awaiting Queries.enqueue(...)",
    "procrastinate.loop": "Procrastinate, await defer_async(x=i) in a loop",
    "procrastinate.gather": f"Procrastinate, {CALLERS} coroutines awaiting defer_async",
}


def measures(backend: Backend) -> dict[str, Measure]:
    """Every measurement on ``backend``, in the order they are taken."""
    if backend.synchronous is None:
        return {
            **FERRYQ,
            "raw.loop": lambda url, n, _: asyncio.run(raw.postgres(url, n, 1, _template_job)),
            "raw.concurrent": lambda url, n, _: asyncio.run(
                raw.postgres(url, n, RAW_CONNECTIONS, _template_job)
            ),
            "pgqueuer.loop": lambda url, n, _: postgres_peers.pgqueuer_enqueue_calls(url, n, 1),
            "pgqueuer.gather": lambda url, n, _: postgres_peers.pgqueuer_enqueue_calls(
                url, n, CALLERS
            ),
            "procrastinate.loop": lambda url, n, _: postgres_peers.procrastinate_enqueue_calls(
                url, n, 1
            ),
            "procrastinate.gather": lambda url, n, _: postgres_peers.procrastinate_enqueue_calls(
                url, n, CALLERS
            ),
        }
    sync = backend.synchronous
    return {
        **FERRYQ,
        "raw.loop": lambda url, n, _: raw.sqlite(url, n, 1, sync, _template_job),
        "raw.concurrent": lambda url, n, _: raw.sqlite(
            url, n, RAW_CONNECTIONS, sync, _template_job
        ),
        "huey.loop": lambda _, n, workdir: huey_sqlite.enqueue_calls(
            n, workdir, threads=1, synchronous=sync
        ),
        "huey.threads": lambda _, n, workdir: huey_sqlite.enqueue_calls(
            n, workdir, threads=THREADS, synchronous=sync
        ),
    }


@dataclass(frozen=True)
class Row:
    label: str
    ours: str
    raw: str
    peer_kind: str  # which peer figures compete: "single" or "concurrent"
    single: str | None = None  # the one-caller figure this concurrent one is set against


ROWS = (
    Row("one caller: enqueue() loop", "ferryq.loop", "raw.loop", "single"),
    Row("one caller: enqueue_async() loop", "ferryq.loop_async", "raw.loop", "single"),
    Row(f"{THREADS} threads: enqueue()", "ferryq.threads", "raw.concurrent", "concurrent",
        "ferryq.loop"),
    Row(f"{CALLERS} coroutines: enqueue_async()", "ferryq.gather", "raw.concurrent",
        "concurrent", "ferryq.loop_async"),
)  # fmt: skip
PEERS = {
    "single": ("huey.loop", "pgqueuer.loop", "procrastinate.loop"),
    "concurrent": ("huey.threads", "pgqueuer.gather", "procrastinate.gather"),
}


# -- running ------------------------------------------------------------------------------


def attempt(measure: Measure, databases: Databases, n: int, workdir: pathlib.Path) -> Result:
    """One measurement on a fresh database; a failure becomes its reason."""
    try:
        with databases() as url:
            return measure(url, n, workdir)
    except Exception as exc:
        reason = f"{type(exc).__name__}: {exc}".splitlines()[0]
        return reason[:120]


def sqlite_databases(workdir: pathlib.Path, query: str) -> Databases:
    @contextlib.contextmanager
    def fresh() -> Iterator[str]:
        directory = tempfile.mkdtemp(prefix="enqueue-", dir=workdir)
        try:
            yield f"sqlite:///{directory}/bench.db{query}"
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    return fresh


Figures = dict[str, dict[str, list[Result]]]  # backend -> measure -> one result a round


def run(
    chosen: Sequence[Backend], options: argparse.Namespace, workdir: pathlib.Path
) -> tuple[Figures, dict[str, str]]:
    """Every measurement, round after round; and what each backend's ran on."""
    with contextlib.ExitStack() as stack:
        databases: dict[str, Databases] = {}
        about: dict[str, str] = {}
        for backend in chosen:
            if backend.synchronous is not None:
                databases[backend.key] = sqlite_databases(workdir, backend.query)
                about[backend.key] = _sqlite_header(backend, workdir)
                continue
            from bench.pg_cluster import cluster
            from tests.pg import fresh_database

            pg = stack.enter_context(cluster())
            databases[backend.key] = functools.partial(fresh_database, pg)
            about[backend.key] = _postgres_header(pg.url)
        return _rounds(chosen, databases, options, workdir), about


def _rounds(
    chosen: Sequence[Backend],
    databases: dict[str, Databases],
    options: argparse.Namespace,
    workdir: pathlib.Path,
) -> Figures:
    figures: Figures = {backend.key: defaultdict(list) for backend in chosen}
    for round_no in range(1, options.rounds + 1):
        for backend in chosen:
            found = {name: attempt(measure, databases[backend.key], options.calls, workdir)
                     for name, measure in measures(backend).items()}  # fmt: skip
            for name, result in found.items():
                figures[backend.key][name].append(result)
            shown = ", ".join(f"{name} {_show(result)}" for name, result in found.items())
            print(f"round {round_no}, {backend.key}: {shown}", flush=True)
    return figures


# -- reporting ----------------------------------------------------------------------------


def _show(result: Result) -> str:
    return f"{result:,.0f}/s" if isinstance(result, float) else f"n/a ({result})"


def _median(results: Sequence[Result]) -> Result:
    """The median of the rounds that succeeded, or the first failure's reason."""
    rates = [r for r in results if isinstance(r, float)]
    if rates:
        return median(rates)
    return str(results[0]) if results else "not measured"


def _ratio(a: Result, b: Result) -> str:
    if isinstance(a, float) and isinstance(b, float) and b > 0:
        return f"{a / b:.2f}x"
    return "n/a"


def _cell(result: Result) -> str:
    return f"{result:,.0f}" if isinstance(result, float) else "n/a"


def _best_peer(m: dict[str, Result], kind: str) -> tuple[str, Result]:
    rated = [(name, m[name]) for name in PEERS[kind] if isinstance(m.get(name), float)]
    if not rated:
        return "-", "no peer figure"
    name, best = max(rated, key=lambda pair: float(pair[1]))
    return name.split(".")[0], best


def report(backend: Backend, figures: dict[str, list[Result]], header: str) -> None:
    m = {name: _median(results) for name, results in figures.items()}
    print(f"\n== {backend.title} ==\n{header}")
    print(f"{'calls/s':34}{'ferryq':>9}{'raw':>9}{'best peer':>22}{'/raw':>8}{'/peer':>8}"
          f"{'/single':>9}")  # fmt: skip
    for row in ROWS:
        peer, best = _best_peer(m, row.peer_kind)
        ours = m.get(row.ours, "not measured")
        single = _ratio(ours, m.get(row.single, "")) if row.single else ""
        print(f"{row.label:34}{_cell(ours):>9}{_cell(m.get(row.raw, '')):>9}"
              f"{peer + ' ' + _cell(best):>22}{_ratio(ours, m.get(row.raw, '')):>8}"
              f"{_ratio(ours, best):>8}{single:>9}")  # fmt: skip
    print("every measurement (median; each round):")
    for name, results in figures.items():
        rounds = ", ".join(_cell(r) for r in results)
        failed = [r for r in results if not isinstance(r, float)]
        why = f"  n/a ({failed[0]})" if failed else ""
        print(f"  {LABELS.get(name, name):58}{_cell(m[name]):>9}  [{rounds}]{why}")
    _targets(backend, m)


def _targets(backend: Backend, m: dict[str, Result]) -> None:
    """Issue 24's targets, met or not, from these figures."""
    checks = []
    for row in ROWS[:2]:
        ours, raw = m.get(row.ours), m.get(row.raw)
        _, best = _best_peer(m, "single")
        if isinstance(ours, float) and isinstance(raw, float):
            checks.append(f"{row.ours} >= 0.7x raw: {'met' if ours >= 0.7 * raw else 'NOT met'}")
        if isinstance(ours, float) and isinstance(best, float):
            checks.append(f"{row.ours} >= 1.5x best peer: "
                          f"{'met' if ours >= 1.5 * best else 'NOT met'}")  # fmt: skip
    if backend.synchronous != "NORMAL":
        for row in ROWS[2:]:
            ours, single = m.get(row.ours), m.get(row.single or "")
            if isinstance(ours, float) and isinstance(single, float):
                checks.append(f"{row.ours} >= 10x single: "
                              f"{'met' if ours >= 10 * single else 'NOT met'}")  # fmt: skip
    print("targets (issue 24): " + "; ".join(checks))


def _sqlite_header(backend: Backend, workdir: pathlib.Path) -> str:
    huey_default = huey_sqlite.default_synchronous(workdir)
    return (f"ferryq: sqlite:///file.db{backend.query}: WAL, synchronous {backend.synchronous}. "
            f"raw: stdlib sqlite3 (SQLite {sqlite3.sqlite_version}), the same pragmas.\n"
            f"huey {_version('huey')} SqliteHuey: WAL, synchronous {backend.synchronous} "
            f"(huey's default sets no pragma and gets SQLite's build default, "
            f"{huey_default} here).")  # fmt: skip


def _postgres_header(url: str) -> str:
    from bench.pg_cluster import settings

    shown = ", ".join(f"{k} {v}" for k, v in settings(url).items())
    return (f"server: {shown}.\nraw: asyncpg {_version('asyncpg')}. PGQueuer "
            f"{_version('pgqueuer')} on asyncpg; Procrastinate {_version('procrastinate')} on "
            f"psycopg {_version('psycopg')}; the concurrent peers share a pool of "
            f"{postgres_peers.ENQUEUE_CONNECTIONS} connections.")  # fmt: skip


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def _tree() -> str:
    """The commit measured, and whether ferryq/ had changes not yet committed."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, text=True, capture_output=True, check=True)
        return done.stdout.strip()

    try:
        head, dirty = git("rev-parse", "--short", "HEAD"), git("status", "--porcelain", "ferryq")
    except (OSError, subprocess.CalledProcessError):
        return "not a git checkout"
    return f"{head}{' with uncommitted changes in ferryq/' if dirty else ''}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default=",".join(BACKENDS))
    options = parser.parse_args()
    unknown = set(options.only.split(",")) - set(BACKENDS)
    if unknown:
        parser.error(f"--only takes {','.join(BACKENDS)}, not {','.join(sorted(unknown))}")
    chosen = [BACKENDS[key] for key in options.only.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        figures, about = run(chosen, options, pathlib.Path(tmp))
    print(f"\nferryq {ferryq.__version__} ({_tree()}), Python {platform.python_version()}, "
          f"{os.cpu_count()} cores; medians of "
          f"{options.rounds} rounds, {options.calls:,} calls a measurement, a fresh "
          "database each; /raw, /peer: ferryq's figure over theirs; /single: ferryq "
          "concurrent over ferryq one caller")  # fmt: skip
    for backend in chosen:
        report(backend, figures[backend.key], about[backend.key])


if __name__ == "__main__":
    main()
