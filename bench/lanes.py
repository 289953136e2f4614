"""Lanes: what ordering costs, on SQLite and on PostgreSQL.

    python -m bench.lanes [--backend sqlite|postgres|both] [--rounds N] [--jobs N]
                          [--lanes N] [--backlog N] [--samples N] [--singles N]
                          [--batches N]

Three comparisons, each against the same thing without the lane condition, every
measurement on a fresh database, each figure the median of ``--rounds`` runs:

- drain: ``--jobs`` no-op jobs over ``--lanes`` lanes of limit 1 (one enqueue call per
  lane, not measured), drained by one worker process, against the same jobs without
  lanes (target: at least 0.8x);
- pickup: enqueue → task start (p50, p99) of a job in an idle lane while another lane
  holds ``--backlog`` waiting jobs, against the same idle lane on an empty system
  (target: under 2x). The backlog lane's head is delayed by a day: a delayed head
  holds its lane until due (docs/guarantees.md, Lanes), so the whole backlog is
  honestly ``waiting`` in the worker's own queue, and the run checks it still is
  afterwards. Pickup without any lane on an empty system is shown for reference;
- enqueue: ``--singles`` single jobs and ``--batches`` batches of 100 into the lane
  already holding the backlog,
  against an empty lane of an empty database (target: within 20%, i.e. at least
  0.8x). An empty lane beside the backlog is shown for reference: it separates the
  lane's length from the table's size.

PostgreSQL comes from FERRYQ_BENCH_PG_URL or a throwaway cluster made durable
(bench/pg_cluster.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import pathlib
import shutil
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import ferryq
from bench import ferryq_runs as runs
from bench import ferryq_tasks
from bench.pg_cluster import cluster
from tests.pg import fresh_database

SINGLES = 2_000  # single-job enqueues per enqueue measurement
BATCHES = 300  # batches of 100 per enqueue measurement
FILL_BATCH = 10_000
BACKLOG_LANE = "backlog"
IDLE_LANE = "idle"
Databases = Callable[[], contextlib.AbstractContextManager[str]]


def fill_backlog(url: str, backlog: int) -> None:
    """Lane BACKLOG_LANE: a head delayed by a day, then ``backlog`` jobs waiting behind it."""

    async def fill() -> None:
        app = ferryq.App(url)
        await app.enqueue_async(ferryq_tasks.tick.name, lane=BACKLOG_LANE, delay=86_400)
        for first in range(0, backlog, FILL_BATCH):
            count = min(FILL_BATCH, backlog - first)
            await app.enqueue_many_async(ferryq_tasks.tick.name, [[]] * count, lane=BACKLOG_LANE)
        await app.aclose()

    asyncio.run(fill())
    check_backlog(url, backlog)


def check_backlog(url: str, backlog: int) -> None:
    """The backlog is intact: its head still scheduled, every other job still waiting."""
    app = ferryq.App(url)
    try:
        (lane,) = [info for info in app.lanes(limit=10) if info.lane == BACKLOG_LANE]
    finally:
        app.close()
    if (lane.waiting, lane.admitted, lane.running) != (backlog, 1, 0):
        raise RuntimeError(f"backlog lane is not as filled: {lane}")


def enqueue_rates(
    url: str, lane: str, singles: int = SINGLES, batches: int = BATCHES
) -> tuple[float, float]:
    """(single jobs/s, jobs/s in batches of 100) into ``lane``."""

    async def measure() -> tuple[float, float]:
        app = ferryq.App(url)
        await app.store()  # connecting is not enqueueing
        await app.enqueue_async(ferryq_tasks.tick.name, lane=lane)  # nor is a first statement
        started = time.perf_counter()
        for _ in range(singles):
            await app.enqueue_async(ferryq_tasks.tick.name, lane=lane)
        single_rate = singles / (time.perf_counter() - started)
        started = time.perf_counter()
        for _ in range(batches):
            await app.enqueue_many_async(ferryq_tasks.tick.name, [[]] * 100, lane=lane)
        batched = batches * 100 / (time.perf_counter() - started)
        await app.aclose()
        return single_rate, batched

    return asyncio.run(measure())


def one_round(
    databases: Databases, options: argparse.Namespace, workdir: pathlib.Path
) -> dict[str, float]:
    found: dict[str, float] = {}
    samples = options.samples
    sizes = (options.singles, options.batches)
    with databases() as url:
        found["drain"] = runs.drain(url, options.jobs, workdir)
    with databases() as url:
        found["drain_lanes"] = runs.drain(url, options.jobs, workdir, lanes=options.lanes)
    with databases() as url:
        found["p50_plain"], found["p99_plain"] = runs.pickup(url, samples, workdir)
    with databases() as url:
        found["p50"], found["p99"] = runs.pickup(url, samples, workdir, lane=IDLE_LANE)
    with databases() as url:
        found["enqueue_1"], found["enqueue_100"] = enqueue_rates(url, "empty", *sizes)
    with databases() as url:
        started = time.perf_counter()
        fill_backlog(url, options.backlog)
        found["fill_s"] = time.perf_counter() - started
        found["p50_backlog"], found["p99_backlog"] = runs.pickup(
            url, samples, workdir, lane=IDLE_LANE
        )
        check_backlog(url, options.backlog)  # the worker left the backlog alone
        found["enqueue_1_backlog"], found["enqueue_100_backlog"] = enqueue_rates(
            url, BACKLOG_LANE, *sizes
        )
        found["enqueue_1_beside"], found["enqueue_100_beside"] = enqueue_rates(
            url, "beside", *sizes
        )
    return found


@dataclass(frozen=True)
class Row:
    label: str
    measured: str
    baseline: str
    higher_is_better: bool
    bound: float | None  # the ratio measured/baseline must be >= bound (higher) or < bound
    target: str = ""


ROWS = (
    Row("drain, jobs/s", "drain_lanes", "drain", True, 0.8, ">= 0.8x"),
    Row("pickup p50, ms", "p50_backlog", "p50", False, 2.0, "< 2x"),
    Row("pickup p99, ms", "p99_backlog", "p99", False, 2.0, "< 2x"),
    Row("enqueue, single jobs/s", "enqueue_1_backlog", "enqueue_1", True, 0.8, ">= 0.8x"),
    Row("enqueue, batches of 100, jobs/s", "enqueue_100_backlog", "enqueue_100", True, 0.8,
        ">= 0.8x"),
    Row("  empty lane beside it, single", "enqueue_1_beside", "enqueue_1", True, None),
    Row("  empty lane beside it, batches", "enqueue_100_beside", "enqueue_100", True, None),
    Row("pickup without lanes, p50 ms", "p50_plain", "p50", False, None),
    Row("pickup without lanes, p99 ms", "p99_plain", "p99", False, None),
)  # fmt: skip


def report(backend: str, figures: dict[str, list[float]], options: argparse.Namespace) -> None:
    m = {name: runs.median(values) for name, values in figures.items()}
    print(f"\n{backend}: medians of {options.rounds} rounds. One worker process "
          f"({runs.CONCURRENCY} slots), a fresh database per measurement.\n"
          f"  drain: {options.jobs:,} no-op jobs over {options.lanes:,} lanes of limit 1 "
          f"vs the same jobs without lanes.\n"
          f"  pickup ({options.samples} samples): an idle lane while lane "
          f"{BACKLOG_LANE!r} holds {options.backlog:,} waiting jobs (filled in "
          f"{m['fill_s']:.1f} s) vs the idle lane on an empty system.\n"
          f"  enqueue ({options.singles:,} singles, {options.batches} batches of 100): into "
          f"that lane vs into an empty lane of an empty database.")  # fmt: skip
    print(f"{'(ratio = measured / baseline)':34}{'measured':>12}{'baseline':>12}{'ratio':>8}"
          "  target")  # fmt: skip
    for row in ROWS:
        ratio = m[row.measured] / m[row.baseline]
        if row.bound is None:
            verdict = "(reference)"
        else:
            met = ratio >= row.bound if row.higher_is_better else ratio < row.bound
            verdict = f"{row.target} {'met' if met else 'NOT met'}"
        print(f"{row.label:34}{m[row.measured]:>12,.2f}{m[row.baseline]:>12,.2f}"
              f"{ratio:>7.2f}x  {verdict}")  # fmt: skip


def sqlite_databases(workdir: pathlib.Path, query: str = "") -> Databases:
    """A fresh SQLite file per use, in ``workdir``, its URL ending in ``query``."""

    @contextlib.contextmanager
    def fresh() -> Iterator[str]:
        directory = tempfile.mkdtemp(prefix="ferryq-", dir=workdir)
        try:
            yield f"sqlite:///{directory}/bench.db{query}"
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    return fresh


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--lanes", type=int, default=10_000)
    parser.add_argument("--backlog", type=int, default=1_000_000)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--singles", type=int, default=SINGLES)
    parser.add_argument("--batches", type=int, default=BATCHES)
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
