"""Dependencies: what a fan-in and a job's dependencies cost, on SQLite and PostgreSQL.

    python -m bench.dependencies [--backend sqlite|postgres|both] [--rounds N]
                                 [--members N] [--singles N]

Two comparisons, each against the same work without dependencies, every measurement
on a fresh database, each figure the median of ``--rounds`` runs:

- fan-in: ``--members`` no-op jobs and a callback that runs after all of them
  (``after=members``), drained by one worker process: the time from the first
  member's start to the callback's start, against ``--members`` + 1 independent jobs
  (first start to last start). The ratio is the price of holding the callback and of
  the trigger that counts the members down as they end;
- enqueue: ``--singles`` jobs enqueued one call each with 10 dependencies (jobs
  enqueued before, delayed a day so they stay unfinished), against the same calls
  without dependencies.

SQLite runs at ferryq's default (NORMAL) and at FULL; PostgreSQL comes from
FERRYQ_BENCH_PG_URL or a throwaway cluster made durable (bench/pg_cluster.py).
"""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import time

import ferryq
from bench import ferryq_runs as runs
from bench import ferryq_tasks, settings
from bench.lanes import Databases

DEPENDENCIES = 10


def fill(url: str, members: int, fan_in: bool) -> None:
    """``members`` ticks and one more: after all of them (``fan_in``) or not."""

    async def enqueue() -> None:
        app = ferryq.App(url)
        handles: list[ferryq.JobHandle] = []
        for first in range(0, members, 1000):
            count = min(1000, members - first)
            handles += await app.enqueue_many_async(ferryq_tasks.tick.name, [[]] * count)
        await app.enqueue_async(ferryq_tasks.tick.name, after=handles if fan_in else None)
        await app.aclose()

    asyncio.run(enqueue())


def to_last(url: str, members: int, workdir: pathlib.Path, fan_in: bool) -> float:
    """Seconds from the first start to the last (the callback's, with ``fan_in``)."""
    fill(url, members, fan_in)
    ticks = runs.ticks_file(workdir)
    proc = runs.start_worker(url, ticks)
    try:
        runs.wait_ticks(ticks, members + 1, proc)
    finally:
        runs.stop(proc)
    stamps = runs.read_ticks(ticks)
    if fan_in and stamps[-1] != max(stamps):
        raise RuntimeError("the callback did not start last")
    return max(stamps) - min(stamps)


def enqueue_rate(url: str, singles: int, dependencies: int) -> float:
    """Jobs/s enqueued one call each, each after ``dependencies`` unfinished jobs."""

    async def measure() -> float:
        app = ferryq.App(url)
        after = await app.enqueue_many_async(
            ferryq_tasks.tick.name, [[]] * max(dependencies, 1), delay=86_400
        )
        options = {"after": after[:dependencies]} if dependencies else {}
        await app.enqueue_async(ferryq_tasks.tick.name, **options)  # a first statement
        started = time.perf_counter()
        for _ in range(singles):
            await app.enqueue_async(ferryq_tasks.tick.name, **options)
        rate = singles / (time.perf_counter() - started)
        await app.aclose()
        return rate

    return asyncio.run(measure())


def one_round(
    databases: Databases, workdir: pathlib.Path, options: argparse.Namespace
) -> dict[str, float]:
    found: dict[str, float] = {}
    for fan_in, name in ((False, "independent_s"), (True, "fan_in_s")):
        with databases() as url:
            found[name] = to_last(url, options.members, workdir, fan_in)
    for dependencies, name in ((0, "enqueue_plain"), (DEPENDENCIES, "enqueue_after")):
        with databases() as url:
            found[name] = enqueue_rate(url, options.singles, dependencies)
    return found


def report(backend: str, figures: dict[str, list[float]], options: argparse.Namespace) -> None:
    m = {name: runs.median(values) for name, values in figures.items()}
    members = options.members
    print(f"\n{backend}: medians of {options.rounds} rounds, one worker process "
          f"({runs.CONCURRENCY} slots), a fresh database per measurement.")  # fmt: skip
    print(f"{'':44}{'measured':>12}{'baseline':>12}{'ratio':>8}")
    print(f"{f'fan-in of {members:,}: s to the callback':44}{m['fan_in_s']:>12.3f}"
          f"{m['independent_s']:>12.3f}{m['fan_in_s'] / m['independent_s']:>7.2f}x"
          f"  (baseline: {members + 1:,} independent jobs)")  # fmt: skip
    print(f"{f'enqueue with {DEPENDENCIES} dependencies, jobs/s':44}"
          f"{m['enqueue_after']:>12,.0f}{m['enqueue_plain']:>12,.0f}"
          f"{m['enqueue_after'] / m['enqueue_plain']:>7.2f}x"
          f"  (baseline: without dependencies)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=10_000)
    parser.add_argument("--singles", type=int, default=2_000)
    settings.run(parser, one_round, report)


if __name__ == "__main__":
    main()
