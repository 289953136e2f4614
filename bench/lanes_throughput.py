"""Lanes: what ordering costs, on SQLite and on PostgreSQL.

    python -m bench.lanes_throughput [--backend sqlite|postgres|both] [--rounds N]
                                     [--jobs N] [--lanes N] [--backlog N] [--samples N]

Three comparisons, each against the same thing without the lane condition, every
measurement on a fresh database, each figure the median of ``--rounds`` runs:

- drain: ``--jobs`` no-op jobs over ``--lanes`` lanes of limit 1, drained by one
  worker process, against the same jobs without lanes (target: at least 0.8x);
- pickup: enqueue → task start of a job in an idle lane while another lane holds
  ``--backlog`` waiting jobs, against an empty system (target: under 2x). The backlog
  lane's head is delayed by a day, so the lane holds all of it, honestly waiting;
- enqueue: single jobs and batches of 100 into a lane already holding ``--backlog``
  waiting jobs, against an empty lane (target: within 20%).

PostgreSQL comes from FERRYQ_BENCH_PG_URL or a throwaway cluster, as in
bench/postgres_throughput.py.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import pathlib
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator

import ferryq
from bench import ferryq_runs as runs
from bench import ferryq_tasks
from bench.postgres_throughput import cluster
from tests.pg import fresh_database

SINGLES = 500  # single-job enqueues per enqueue measurement
BATCHES = 50  # batches of 100 per enqueue measurement
Databases = Callable[[], contextlib.AbstractContextManager[str]]


def fill_backlog(url: str, backlog: int) -> None:
    """Lane "backlog": a head delayed by a day, then ``backlog`` jobs waiting behind it."""

    async def fill() -> None:
        app = ferryq.App(url)
        await app.enqueue_async(ferryq_tasks.tick.name, lane="backlog", delay=86_400)
        for first in range(0, backlog, 10_000):
            count = min(10_000, backlog - first)
            await app.enqueue_many_async(ferryq_tasks.tick.name, [[]] * count, lane="backlog")
        await app.aclose()

    asyncio.run(fill())


def enqueue_rates(url: str, lane: str) -> tuple[float, float]:
    """(single jobs/s, jobs/s in batches of 100) into ``lane``."""

    async def measure() -> tuple[float, float]:
        app = ferryq.App(url)
        await app.store()
        started = time.perf_counter()
        for _ in range(SINGLES):
            await app.enqueue_async(ferryq_tasks.tick.name, lane=lane)
        singles = SINGLES / (time.perf_counter() - started)
        started = time.perf_counter()
        for _ in range(BATCHES):
            await app.enqueue_many_async(ferryq_tasks.tick.name, [[]] * 100, lane=lane)
        batched = BATCHES * 100 / (time.perf_counter() - started)
        await app.aclose()
        return singles, batched

    return asyncio.run(measure())


def one_round(
    databases: Databases, options: argparse.Namespace, workdir: pathlib.Path
) -> dict[str, float]:
    found: dict[str, float] = {}
    with databases() as url:
        found["drain"] = runs.drain(url, options.jobs, workdir)
    with databases() as url:
        found["drain_lanes"] = runs.drain(url, options.jobs, workdir, lanes=options.lanes)
    with databases() as url:
        found["p50"], found["p99"] = runs.pickup(url, options.samples, workdir, lane="idle")
    with databases() as url:
        found["enqueue_1"], found["enqueue_100"] = enqueue_rates(url, "fresh")
    with databases() as url:
        fill_backlog(url, options.backlog)
        found["p50_backlog"], found["p99_backlog"] = runs.pickup(
            url, options.samples, workdir, lane="idle"
        )
        found["enqueue_1_backlog"], found["enqueue_100_backlog"] = enqueue_rates(url, "backlog")
    return found


def report(backend: str, figures: dict[str, list[float]], options: argparse.Namespace) -> None:
    m = {name: runs.median(values) for name, values in figures.items()}
    print(f"\n{backend}: medians of {options.rounds} rounds; {options.jobs:,} no-op jobs, "
          f"{options.lanes:,} lanes of limit 1; backlog {options.backlog:,} waiting jobs; "
          f"one worker process ({runs.CONCURRENCY} slots)")  # fmt: skip
    print(f"{'':34}{'lanes':>12}{'baseline':>12}{'ratio':>8}  target")
    rows = (
        ("drain, jobs/s", "drain_lanes", "drain", True, 0.8, "lanes >= 0.8x"),
        ("pickup p50 beside a backlog, ms", "p50_backlog", "p50", False, 0.5, "< 2x empty"),
        ("pickup p99 beside a backlog, ms", "p99_backlog", "p99", False, None, ""),
        ("enqueue into a backlog lane, /s", "enqueue_1_backlog", "enqueue_1", True, 0.8,
         "within 20%"),
        ("  in batches of 100, jobs/s", "enqueue_100_backlog", "enqueue_100", True, 0.8,
         "within 20%"),
    )  # fmt: skip
    for label, ours, base, higher, floor, target in rows:
        ratio = m[ours] / m[base] if higher else m[base] / m[ours]
        verdict = "" if floor is None else ("met" if ratio >= floor else "NOT met")
        print(f"{label:34}{m[ours]:>12,.2f}{m[base]:>12,.2f}{ratio:>7.2f}x  {target} {verdict}")


def sqlite_databases(workdir: pathlib.Path) -> Databases:
    @contextlib.contextmanager
    def fresh() -> Iterator[str]:
        yield f"sqlite:///{tempfile.mkdtemp(prefix='ferryq-', dir=workdir)}/bench.db"

    return fresh


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--lanes", type=int, default=10_000)
    parser.add_argument("--backlog", type=int, default=1_000_000)
    parser.add_argument("--samples", type=int, default=100)
    options = parser.parse_args()
    backends = ("sqlite", "postgres") if options.backend == "both" else (options.backend,)
    results: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        workdir = pathlib.Path(tmp)
        for backend in backends:
            if backend == "sqlite":
                databases = sqlite_databases(workdir)
            else:
                pg = stack.enter_context(cluster())
                databases = functools.partial(fresh_database, pg)
            results[backend] = defaultdict(list)
            for round_no in range(1, options.rounds + 1):
                found = one_round(databases, options, workdir)
                for name, value in found.items():
                    results[backend][name].append(value)
                print(f"{backend} round {round_no}: " + ", ".join(
                    f"{k} {v:,.2f}" for k, v in found.items()), flush=True)  # fmt: skip
    for backend, figures in results.items():
        report(backend, figures, options)


if __name__ == "__main__":
    main()
