"""ferryq on PostgreSQL against PGQueuer and Procrastinate, side by side.

    python -m bench.postgres_throughput [--jobs N] [--samples N] [--rounds N]
                                        [--loaded N] [--peers pgqueuer,procrastinate]

One local PostgreSQL serves every queue: FERRYQ_BENCH_PG_URL (an admin URL on a
server of yours) or a throwaway cluster started from the machine's binaries as the
tests do, then made durable (fsync, synchronous_commit and full_page_writes on; see
bench/pg_cluster.py). Every measurement gets a fresh database. Figures: batched enqueue (1,000 a
transaction), drain by one consumer process, pickup latency at light load, and
ferryq's drain again once its tables hold ``--loaded`` ready, delayed and finished
jobs each. Each figure is the median of ``--rounds`` runs.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import pathlib
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any, TypeVar

import asyncpg

import ferryq
from bench import ferryq_runs as runs
from bench.pg_cluster import cluster
from tests.pg import PgCluster, fresh_database

T = TypeVar("T")
#: Procrastinate drains a few hundred jobs a second here: it gets fewer jobs.
SLOW_PEER_JOBS = 5_000


def preload(url: str, rows: int) -> None:
    """Fill ferryq's tables: ``rows`` ready (another queue), delayed and finished jobs."""

    async def fill() -> None:
        app = ferryq.App(url)
        await app.store()  # creates the schema and today's history partitions
        await app.aclose()
        now = time.time()
        conn = await asyncpg.connect(url)
        try:
            columns = ("namespace, queue, task, args, state, run_at, order_time, ttr, "
                       "max_tries, created_at")  # fmt: skip
            for queue, state, due in (
                ("backlog", "ready", now),
                ("default", "scheduled", now + 86400),
            ):
                await conn.execute(
                    f"INSERT INTO ferryq_jobs ({columns}) SELECT 'default', $1, 'bench.tick', '[]',"
                    " $2, $3, $3, 60, 3, $4 FROM generate_series(1, $5)",
                    queue, state, due, now, rows,
                )  # fmt: skip
            await conn.execute(
                "INSERT INTO ferryq_history (id, namespace, queue, task, args, state, run_at,"
                " order_time, ttr, max_tries, attempts, fence, result, created_at, finished_at)"
                " SELECT 100000000 + g, 'default', 'default', 'bench.tick', '[]', 'succeeded',"
                " $1, $1, 60, 3, 1, 1, 'null', $1, $1 - random() * 80000"
                " FROM generate_series(1, $2) AS g",
                now, rows,
            )  # fmt: skip
            # Settle the new rows first, so autovacuum and the checkpointer do not
            # work through them during the measurement.
            await conn.execute("VACUUM ANALYZE ferryq_jobs")
            await conn.execute("VACUUM ANALYZE ferryq_history")
            await conn.execute("CHECKPOINT")
        finally:
            await conn.close()

    asyncio.run(fill())


def _peer_functions(names: list[str]) -> dict[str, dict[str, Callable[..., Any]]]:
    """The peers' enqueue(dsn, n), drain(dsn, n) and pickup(dsn, samples), adapted."""
    if not names:
        return {}
    peers = importlib.import_module("bench.peers.postgres_peers")
    found: dict[str, dict[str, Callable[..., Any]]] = {}
    for name in names:
        enqueue, drain, pickup = (getattr(peers, f"{name}_{kind}")
                                  for kind in ("enqueue", "drain", "pickup"))  # fmt: skip
        found[name] = {
            "enqueue": enqueue,
            "drain": lambda url, n, _workdir, drain=drain: drain(url, n),
            "pickup": lambda url, samples, _workdir, pickup=pickup: pickup(url, samples),
        }
    return found


Figures = dict[str, dict[str, list[float]]]  # queue -> measure -> one figure per round


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--loaded", type=int, default=1_000_000)
    parser.add_argument("--peers", default="pgqueuer,procrastinate")
    options = parser.parse_args()
    queues = {"ferryq": _ferryq_functions()}
    queues.update(_peer_functions([p for p in options.peers.split(",") if p]))
    figures: Figures = {name: defaultdict(list) for name in queues}
    with cluster() as pg, tempfile.TemporaryDirectory() as tmp:
        workdir = pathlib.Path(tmp)
        for round_no in range(1, options.rounds + 1):
            for name, measure in queues.items():
                jobs = SLOW_PEER_JOBS if name == "procrastinate" else options.jobs
                _measure(pg, measure, figures[name], jobs, options.samples, workdir)
            print(f"round {round_no}: " + " | ".join(
                f"{q} drain {f['drain'][-1]:,.0f}/s enqueue {f['enqueue'][-1]:,.0f}/s "
                f"p50 {f['p50'][-1]:.2f} ms" for q, f in figures.items()), flush=True)  # fmt: skip
        for _ in range(options.rounds if options.loaded else 0):
            with fresh_database(pg) as url:
                preload(url, options.loaded)
                figures["ferryq"]["loaded"].append(runs.drain(url, options.jobs, workdir))
            print(f"loaded drain: {figures['ferryq']['loaded'][-1]:,.0f}/s", flush=True)
    _report(figures, options)


def _measure(
    pg: PgCluster,
    measure: dict[str, Callable[..., Any]],
    into: dict[str, list[float]],
    jobs: int,
    samples: int,
    workdir: pathlib.Path,
) -> None:
    with fresh_database(pg) as url:
        into["enqueue"].append(float(measure["enqueue"](url, jobs)))
    with fresh_database(pg) as url:
        into["drain"].append(float(measure["drain"](url, jobs, workdir)))
    with fresh_database(pg) as url:
        p50, p99 = measure["pickup"](url, samples, workdir)
    into["p50"].append(p50)
    into["p99"].append(p99)


def _ferryq_functions() -> dict[str, Callable[..., Any]]:
    return {"enqueue": runs.enqueue, "drain": runs.drain, "pickup": runs.pickup}


def _report(figures: Figures, options: argparse.Namespace) -> None:
    ours = {k: runs.median(v) for k, v in figures["ferryq"].items()}
    print(f"\nmedians of {options.rounds} rounds on one local PostgreSQL; {options.jobs:,} "
          f"no-op jobs ({SLOW_PEER_JOBS:,} for procrastinate), {options.samples} latency "
          f"samples; one consumer process each (ferryq: {runs.CONCURRENCY} slots)")  # fmt: skip
    print(f"{'':22}{'ferryq':>12}" + "".join(f"{name:>15}{'ratio':>8}" for name in figures
                                            if name != "ferryq"))  # fmt: skip
    for label, key, higher in (("drain, jobs/s", "drain", True),
                               ("batched enqueue, /s", "enqueue", True),
                               ("pickup p50, ms", "p50", False),
                               ("pickup p99, ms", "p99", False)):  # fmt: skip
        line = f"{label:22}{ours[key]:>12,.2f}"
        for name, theirs in figures.items():
            if name == "ferryq":
                continue
            value = runs.median(theirs[key])
            ratio = ours[key] / value if higher else value / ours[key]
            line += f"{value:>15,.2f}{ratio:>7.1f}x"
        print(line)
    if "loaded" in ours:
        change = ours["loaded"] / ours["drain"] - 1
        trend = f"{abs(change):.0%} {'faster' if change >= 0 else 'slower'} than empty"
        print(f"\nferryq drain with {options.loaded:,} ready, delayed and finished jobs "
              f"each: {ours['loaded']:,.0f} jobs/s ({trend})")  # fmt: skip


if __name__ == "__main__":
    main()
