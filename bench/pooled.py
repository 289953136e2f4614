"""ferryq through PgBouncer in transaction mode against the server itself, side by side.

    python -m bench.pooled [--rounds N] [--jobs N] [--calls N] [--producers N]
                           [--producer-calls N] [--processes 1,2,4,8] [--samples N]
                           [--gap FROM TO] [--quiet SECONDS]

One durable PostgreSQL (bench/pg_cluster.py: FERRYQ_BENCH_PG_URL, or a throwaway
cluster made durable) with a real PgBouncer in front of it (the tests' harness,
tests/pgbouncer.py: ``pool_mode = transaction``, ``default_pool_size = 10``). Three
settings, each measurement on a fresh database:

- ``direct``: the server's own URL, the default mode (LISTEN for wake-ups);
- ``pooled``: the same database through PgBouncer, ``?pooler=transaction``, no direct
  URL: idle waits poll ``pg_current_snapshot()`` (ferryq/store/postgres/waits.py);
- ``pooled + direct URL``: the same, with the server's own URL for LISTEN
  (``ferryq worker --direct-url``); measured where wake-ups matter (the drain, the
  idle worker) only.

The measures, each setting in turn, the order reversed every other round:

- drain: one ``ferryq worker`` process (500 slots) drains ``--jobs`` no-op jobs
  filled beforehand; ``(n - 1) / (last start - first start)`` from the tasks' own
  clocks (bench/ferryq_runs.py);
- single enqueue: one process calling ``task.enqueue(i)`` ``--calls`` times in a loop,
  one job per call; concurrent enqueue: ``--producers`` processes (8) at once, each
  calling it ``--producer-calls`` times (both by bench/producers.py);
- aggregate drain by ``ferryq worker --processes N`` for each N of ``--processes``
  (N = 1 is the drain above), direct and pooled;
- an idle worker: pickup latency, jobs enqueued one at a time ``--gap`` seconds apart
  (0.2 to 0.5, at random) to a worker with nothing else to do, enqueue call to task
  start; then, in another worker that ran one job and was left alone, its CPU
  (utime + stime of /proc/PID/stat) over ``--quiet`` seconds, as % of one core.

Prints each round's figures, then the medians and the ratios pooled / direct, with
the load average at the start and the end of the run (the machine's other work shows
in every figure).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pathlib
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import ferryq
from bench import ferryq_runs as runs
from bench import producers
from bench.ferryq_tasks import tick
from bench.pg_cluster import cluster
from tests.pg import PgCluster, fresh_database
from tests.pgbouncer import POOL_SIZE, Bouncer, find_pgbouncer

#: After the worker's one job: its finish written and start-up's last work done
#: before the quiet interval's CPU is counted.
SETTLE_SECONDS = 2.0
DIRECT, POOLED, LISTENING = "direct", "pooled", "pooled + direct URL"
SETTINGS = (DIRECT, POOLED, LISTENING)

Figures = dict[str, dict[str, list[float]]]  # setting -> measure -> one value per round


@dataclass(frozen=True)
class Target:
    """A fresh database as one setting reaches it: the URL its processes get, and the
    worker's extra arguments."""

    url: str
    worker_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class Setup:
    """What every measure of the run shares: the server, the pooler in front of it, a
    directory for the ticks' files, the command line's options."""

    pg: PgCluster
    bouncer: Bouncer
    workdir: pathlib.Path
    options: argparse.Namespace

    @contextlib.contextmanager
    def target(self, setting: str) -> Iterator[Target]:
        with fresh_database(self.pg) as url:
            if setting == DIRECT:
                yield Target(url)
                return
            through = self.bouncer.through(url)
            pooled = f"{through}{'&' if '?' in through else '?'}pooler=transaction"
            yield Target(pooled, ("--direct-url", url) if setting == LISTENING else ())


Measure = Callable[[Target, Setup], dict[str, float]]  # its figures, by name


def idle_cpu(target: Target, seconds: float, workdir: pathlib.Path) -> float:
    """% of one core a worker process uses over ``seconds`` with nothing to do, once it
    has run one job (its start-up is over)."""
    app = ferryq.App(target.url)
    app.enqueue(tick.name)
    app.close()
    ticks = runs.ticks_file(workdir)
    proc = runs.start_worker(target.url, ticks, args=target.worker_args)
    try:
        runs.wait_ticks(ticks, 1, proc)
        time.sleep(SETTLE_SECONDS)
        began, before = time.monotonic(), sum(runs.cpu_seconds(proc.pid))
        time.sleep(seconds)
        used, elapsed = sum(runs.cpu_seconds(proc.pid)) - before, time.monotonic() - began
    finally:
        runs.stop(proc)
    if proc.returncode not in (0, None):
        raise RuntimeError(f"the idle worker exited with {proc.returncode}")
    return 100 * used / elapsed


def drain_with(processes: int) -> Measure:
    def measure(target: Target, setup: Setup) -> dict[str, float]:
        args = (*target.worker_args, "--processes", str(processes))
        rate = runs.drain(target.url, setup.options.jobs, setup.workdir, args=args)
        return {f"drain x{processes}": rate}

    return measure


def single_enqueue(target: Target, setup: Setup) -> dict[str, float]:
    return {"single enqueue": producers.measure("ferryq", target.url, 1, setup.options.calls)}


def concurrent_enqueue(target: Target, setup: Setup) -> dict[str, float]:
    options = setup.options
    rate = producers.measure("ferryq", target.url, options.producers, options.producer_calls)
    return {"concurrent enqueue": rate}


def idle_worker(target: Target, setup: Setup) -> dict[str, float]:
    options = setup.options
    p50, p99 = runs.pickup(target.url, options.samples, setup.workdir, gap=tuple(options.gap),
                           worker_args=target.worker_args)  # fmt: skip
    return {"pickup p50": p50, "pickup p99": p99,
            "idle CPU": idle_cpu(target, options.quiet, setup.workdir)}  # fmt: skip


def measures(options: argparse.Namespace) -> list[tuple[Measure, Sequence[str]]]:
    """Each measure with the settings it is taken on."""
    found: list[tuple[Measure, Sequence[str]]] = [
        (drain_with(1), SETTINGS),
        (single_enqueue, (DIRECT, POOLED)),
        (concurrent_enqueue, (DIRECT, POOLED)),
    ]
    found += [(drain_with(n), (DIRECT, POOLED)) for n in options.processes if n != 1]
    found.append((idle_worker, SETTINGS))
    return found


def one_round(setup: Setup, into: Figures, reverse: bool) -> None:
    for measure, settings in measures(setup.options):
        for setting in reversed(settings) if reverse else settings:
            with setup.target(setting) as target:
                for name, value in measure(target, setup).items():
                    into[setting][name].append(value)


ROWS = (  # measure, label, format of its figures
    ("drain x{}", "drain, {} worker process(es), jobs/s", ",.0f"),
    ("single enqueue", "enqueue, one caller, calls/s", ",.0f"),
    ("concurrent enqueue", "enqueue, {producers} processes at once, calls/s", ",.0f"),
    ("pickup p50", "idle worker: pickup p50, ms", ".1f"),
    ("pickup p99", "idle worker: pickup p99, ms", ".1f"),
    ("idle CPU", "idle worker: CPU, % of a core", ".2f"),
)


def rows(options: argparse.Namespace) -> list[tuple[str, str, str]]:
    """The report's rows as ROWS, the drain once for each number of processes."""
    found: list[tuple[str, str, str]] = []
    for key, label, form in ROWS:
        if "{}" in key:
            found += [(key.format(n), label.format(n), form) for n in options.processes]
        else:
            found.append((key, label.format(producers=options.producers), form))
    return found


def report(figures: Figures, options: argparse.Namespace, loads: list[str]) -> None:
    print(f"\nmedians of {options.rounds} rounds; one durable PostgreSQL, PgBouncer "
          f"pool_mode=transaction, default_pool_size {POOL_SIZE}; {os.cpu_count()} cores; "
          f"{options.jobs:,} jobs a drain, {options.calls:,} single enqueues, "
          f"{options.producers} x {options.producer_calls:,} concurrent ones, "
          f"{options.samples} pickups {options.gap[0]:g}-{options.gap[1]:g} s apart, "
          f"{options.quiet:g} s idle")  # fmt: skip
    print(f"load average at start {loads[0]}, at end {loads[-1]}")
    print(f"ratio: the setting's median / direct's\n{'':44}{DIRECT:>10}{POOLED:>10}{'ratio':>7}"
          f"{LISTENING:>21}{'ratio':>7}")  # fmt: skip
    for key, label, form in rows(options):
        base = runs.median(figures[DIRECT][key])
        line = f"{label:44}{base:>10{form}}"
        for setting, width in ((POOLED, 10), (LISTENING, 21)):
            if figures[setting][key]:
                value = runs.median(figures[setting][key])
                ratio = f"{value / base:.2f}x" if base else "-"
                line += f"{value:>{width}{form}}{ratio:>7}"
        print(line)


def numbers(text: str) -> list[int]:
    return [int(n) for n in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=10_000, help="jobs of each drain")
    parser.add_argument("--calls", type=int, default=1_000, help="single enqueues")
    parser.add_argument("--producers", type=int, default=8)
    parser.add_argument("--producer-calls", type=int, default=250, help="calls of each producer")
    parser.add_argument("--processes", type=numbers, default=[1, 2, 4, 8],
                        help="worker processes of the drains, e.g. 1,2")  # fmt: skip
    parser.add_argument("--samples", type=int, default=100, help="pickups of an idle worker")
    parser.add_argument("--gap", type=float, nargs=2, default=[0.2, 0.5], metavar=("FROM", "TO"),
                        help="seconds between two pickups' enqueues")  # fmt: skip
    parser.add_argument("--quiet", type=float, default=10.0, help="seconds of idle CPU counted")
    options = parser.parse_args()
    if 1 not in options.processes:
        options.processes.insert(0, 1)  # the one-process drain is measured anyway
    binary = find_pgbouncer()
    if binary is None:
        raise SystemExit("no pgbouncer: install it (scripts/ensure-pgbouncer.sh) or set "
                         "FERRYQ_TEST_PGBOUNCER")  # fmt: skip
    figures: Figures = defaultdict(lambda: defaultdict(list))
    loads = [runs.load_average()]
    with cluster() as pg, tempfile.TemporaryDirectory(prefix="ferryq-bench-") as tmp:
        bouncer = Bouncer(binary, pg.url)
        try:
            bouncer.create()
            setup = Setup(pg, bouncer, pathlib.Path(tmp), options)
            for round_no in range(1, options.rounds + 1):
                one_round(setup, figures, reverse=round_no % 2 == 0)
                loads.append(runs.load_average())
                print(f"round {round_no} (load {loads[-1]}): " + " | ".join(
                    f"{setting}: " + ", ".join(f"{key} {values[-1]:,.1f}"
                                               for key, values in figures[setting].items())
                    for setting in SETTINGS), flush=True)  # fmt: skip
        finally:
            bouncer.destroy()
    report(figures, options, loads)


if __name__ == "__main__":
    main()
