"""A soak on PostgreSQL: jobs at a steady rate while another transaction stays open.

    python -m bench.soak [--jobs N] [--rate N] [--hold S] [--rounds N] [--every S]
                         [--options k=v,k=v] [--backlog N]

``--jobs`` no-op jobs (500,000) go through one database at ``--rate`` jobs/s (2,500):
the bench enqueues them in batches of 100, each batch due when its turn comes, and one
worker process drains them as they come. Half-way through the time left beside it,
another connection runs ``BEGIN; SELECT txid_current()`` and keeps that transaction
open for ``--hold`` seconds (60), as a forgotten session or a long report would: no
vacuum may remove a row that died after it began. Each run reports three phases,
before, during and after that transaction:

- pickup p50/p99, ms: from a job's batch being sent to the job's start (the ticks of
  bench/ferryq_tasks.py; the queue is FIFO, so the i-th start is the i-th job sent).
  This is what a claim's cost adds up to, as users see it;
- ready scan, ms: the median time of the claim's read alone (the head of the ready
  index, 50 rows, without locks), timed every ``--every`` s from another connection;
- throughput, jobs/s started;
- ``ferryq_jobs``' size at the end of the phase (heap, indexes, total), the most dead
  and live rows seen (pg_stat_user_tables), and the autovacuums of the table;
- the machine's load (1-minute average, median of the samples).

With ``--backlog N`` the table also holds N ready jobs of another queue and N jobs
delayed by a day (bench/postgres_throughput.py's preload) from the start: live rows
that raise PostgreSQL's default threshold of a vacuum (50 rows + 20% of the table's).

Two arms, each on a fresh database, alternated round by round: the table with
PostgreSQL's default autovacuum settings (``ALTER TABLE ... RESET``) and with the
table's options as the migrations set them (or ``--options``). Figures are medians of
``--rounds`` rounds. PostgreSQL: FERRYQ_BENCH_PG_URL, or a durable throwaway cluster
(bench/pg_cluster.py): fsync and synchronous_commit on.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import statistics
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field

import psycopg
from psycopg.rows import TupleRow

import ferryq
from bench import ferryq_runs as runs
from bench import ferryq_tasks
from bench.pg_cluster import cluster
from bench.postgres_throughput import preload
from tests.pg import fresh_database

TABLE = "ferryq_jobs"
BATCH = 100
PHASES = ("before", "during", "after")
DEFAULTS = "PostgreSQL's defaults"
#: The claim's read without its locks: the head of the ready index, in claim order.
READY_SCAN = ("SELECT id FROM ferryq_jobs WHERE state = 'ready' AND namespace = 'default'"
              " AND queue = 'default' ORDER BY order_time, id LIMIT 50")  # fmt: skip
STATS = (
    "SELECT n_dead_tup, n_live_tup, autovacuum_count, n_tup_upd, n_tup_hot_upd,"
    " pg_relation_size(relid), pg_indexes_size(relid), pg_total_relation_size(relid)"
    " FROM pg_stat_user_tables WHERE relname = 'ferryq_jobs'"
)
MB = 1 << 20
Figures = dict[str, float]  # measure -> value, of one phase of one run


@dataclass
class Sample:
    at: float
    scan_ms: float
    load: float
    dead: int
    live: int
    autovacuums: int
    updates: int
    hot_updates: int
    heap: int
    indexes: int
    total: int


@dataclass
class Sampler:
    """Samples of the table's statistics and sizes, every ``every`` s, on a thread."""

    url: str
    every: float
    samples: list[Sample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="soak-sampler")
        self._thread.start()

    def stop(self) -> list[Sample]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return self.samples

    def _run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while True:
                self.samples.append(self._sample(conn))
                if self._stop.wait(self.every):
                    self.samples.append(self._sample(conn))
                    return

    def _sample(self, conn: psycopg.Connection[TupleRow]) -> Sample:
        began = time.perf_counter()
        conn.execute(READY_SCAN).fetchall()
        scan_ms = (time.perf_counter() - began) * 1000
        row = conn.execute(STATS).fetchone()
        assert row is not None, "no statistics of ferryq_jobs"
        return Sample(time.time(), scan_ms, os.getloadavg()[0], *row)


def hold_open(url: str, at: float, seconds: float, span: list[float]) -> threading.Thread:
    """From ``at``, a transaction with an xid kept open for ``seconds``, on a thread;
    its begin and end times go to ``span``."""

    def hold() -> None:
        time.sleep(max(0.0, at - time.time()))
        with psycopg.connect(url) as conn:
            conn.execute("SELECT txid_current()")  # psycopg began the transaction
            span.append(time.time())
            time.sleep(seconds)
            conn.rollback()
            span.append(time.time())

    thread = threading.Thread(target=hold, name="soak-hold")
    thread.start()
    return thread


def produce(url: str, jobs: int, rate: float) -> list[float]:
    """Enqueue ``jobs`` in batches at ``rate`` jobs/s; the time each job was sent."""

    async def batches() -> list[float]:
        app = ferryq.App(url)
        await app.store()
        sent: list[float] = []
        began = time.time()
        for first in range(0, jobs, BATCH):
            count = min(BATCH, jobs - first)
            await asyncio.sleep(max(0.0, began + first / rate - time.time()))
            sent.extend([time.time()] * count)
            await app.enqueue_many_async(ferryq_tasks.tick.name, [[]] * count)
        await app.aclose()
        return sent

    return asyncio.run(batches())


def table_options(url: str) -> dict[str, str]:
    """The storage options of ferryq_jobs, as its reloptions list them."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT reloptions FROM pg_class WHERE relname = %s", (TABLE,))
        found = row.fetchone()
    pairs = (found[0] if found else None) or []
    return dict(str(pair).split("=", 1) for pair in pairs)


def set_options(url: str, options: dict[str, str]) -> None:
    """Reset every option of ferryq_jobs, then set ``options``; vacuum it to start clean."""
    with psycopg.connect(url, autocommit=True) as conn:
        present = table_options(url)
        if present:
            conn.execute(f"ALTER TABLE {TABLE} RESET ({', '.join(present)})")
        if options:
            pairs = ", ".join(f"{key} = {value}" for key, value in options.items())
            conn.execute(f"ALTER TABLE {TABLE} SET ({pairs})")
        conn.execute(f"VACUUM ANALYZE {TABLE}")
        conn.execute("CHECKPOINT")


def one_run(
    url: str, options: dict[str, str], args: argparse.Namespace, workdir: pathlib.Path
) -> dict[str, Figures]:
    """One arm's run on a fresh database: its figures by phase."""
    if args.backlog:
        preload(url, args.backlog)
    set_options(url, options)
    ticks = runs.ticks_file(workdir)
    worker = runs.start_worker(url, ticks, stderr=ticks.with_name("worker.log"))
    sampler = Sampler(url, args.every)
    span: list[float] = []
    try:
        warm_up = ferryq.App(url)  # the worker's start is not pickup
        warm_up.enqueue(ferryq_tasks.tick.name)
        warm_up.close()
        runs.wait_ticks(ticks, 1, worker)
        sampler.start()
        lasting = args.jobs / args.rate
        holder = hold_open(url, time.time() + max(0.0, lasting - args.hold) / 2, args.hold, span)
        sent = produce(url, args.jobs, args.rate)
        runs.wait_ticks(ticks, args.jobs + 1, worker)
        holder.join()
    finally:
        samples = sampler.stop()
        runs.stop(worker)
    return phases(sent, sorted(runs.read_ticks(ticks))[1:], samples, span)


def phases(
    sent: list[float], started: list[float], samples: list[Sample], span: list[float]
) -> dict[str, Figures]:
    began, released = span
    bounds = {"before": (sent[0], began), "during": (began, released),
              "after": (released, max(started[-1], samples[-1].at))}  # fmt: skip
    figures: dict[str, Figures] = {}
    for phase, (low, high) in bounds.items():
        waits = sorted((s - e) * 1000 for s, e in zip(started, sent, strict=True)
                       if low <= s < high)  # fmt: skip
        seen = [s for s in samples if low <= s.at < high] or [samples[-1]]
        figures[phase] = summary(waits, seen, high - low)
    figures["after"]["first autovacuum, s after"] = first_autovacuum(samples, released)
    last = samples[-1]
    figures["after"]["HOT updates, %"] = 100 * last.hot_updates / max(1, last.updates)
    return figures


def summary(waits: list[float], seen: list[Sample], seconds: float) -> Figures:
    q = statistics.quantiles(waits, n=100, method="inclusive") if len(waits) > 1 else [0.0] * 99
    end = seen[-1]
    return {
        "pickup p50, ms": q[49],
        "pickup p99, ms": q[98],
        "ready scan, ms": statistics.median(s.scan_ms for s in seen),
        "jobs/s": len(waits) / seconds,
        "heap, MB": end.heap / MB,
        "indexes, MB": end.indexes / MB,
        "total, MB": end.total / MB,
        "dead rows, most": max(s.dead for s in seen),
        "live rows, most": max(s.live for s in seen),
        "autovacuums": end.autovacuums - seen[0].autovacuums,
        "load (1 min)": statistics.median(s.load for s in seen),
    }


def first_autovacuum(samples: list[Sample], released: float) -> float:
    """Seconds from the transaction's end to the first sample that counts an
    autovacuum of the table more (-1: none before the run ended)."""
    count = next((s.autovacuums for s in samples if s.at >= released), None)
    for sample in samples:
        if sample.at >= released and count is not None and sample.autovacuums > count:
            return sample.at - released
    return -1.0


def parse_options(text: str) -> dict[str, str]:
    return dict(pair.strip().split("=", 1) for pair in text.split(",") if pair.strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=500_000)
    parser.add_argument("--rate", type=float, default=2_500.0, help="jobs/s sent")
    parser.add_argument("--hold", type=float, default=60.0, help="s the transaction is open")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--every", type=float, default=1.0, help="s between samples")
    parser.add_argument("--options", default="", help="k=v,... instead of the migrations'")
    parser.add_argument("--backlog", type=int, default=0, help="ready and delayed jobs, each")
    args = parser.parse_args()
    print(f"start: load average {runs.load_average()}", flush=True)
    results: dict[str, list[dict[str, Figures]]] = defaultdict(list)
    with cluster() as pg, tempfile.TemporaryDirectory() as tmp:
        with fresh_database(pg) as url:
            ours = parse_options(args.options) or table_options(url)
        if not ours:
            raise SystemExit("ferryq_jobs has no options and --options gives none: one arm only")
        arms = {DEFAULTS: {}, "options " + ",".join(f"{k}={v}" for k, v in ours.items()): ours}
        for round_no in range(1, args.rounds + 1):
            order = list(arms) if round_no % 2 else list(arms)[::-1]
            for arm in order:
                with fresh_database(pg) as url:
                    results[arm].append(one_run(url, arms[arm], args, pathlib.Path(tmp)))
                print(f"round {round_no}, {arm}: load average {runs.load_average()}", flush=True)
                report(arm, results[arm][-1:], args)
    beside = f", beside {args.backlog:,} ready and delayed jobs each" if args.backlog else ""
    print(f"\nmedians of {args.rounds} rounds; {args.jobs:,} no-op jobs at {args.rate:,.0f}/s"
          f"{beside}, a transaction open {args.hold:g} s in the middle; one worker "
          f"({runs.CONCURRENCY} slots), {os.cpu_count()} cores")  # fmt: skip
    for arm, runs_of_arm in results.items():
        report(arm, runs_of_arm, args)
    print(f"end: load average {runs.load_average()}")


def report(arm: str, results: list[dict[str, Figures]], args: argparse.Namespace) -> None:
    print(f"\n{arm}:")
    print(f"  {'':28}" + "".join(f"{phase:>12}" for phase in PHASES))
    for measure in results[0]["before"]:
        line = f"  {measure:28}"
        for phase in PHASES:
            line += f"{statistics.median(r[phase][measure] for r in results):>12,.1f}"
        print(line)
    for measure in ("first autovacuum, s after", "HOT updates, %"):
        print(f"  {measure:28}{statistics.median(r['after'][measure] for r in results):>36,.1f}")


if __name__ == "__main__":
    main()
