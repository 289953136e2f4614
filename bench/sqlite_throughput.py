"""ferryq on SQLite against huey's SqliteHuey, side by side on this machine.

    python -m bench.sqlite_throughput [--jobs N] [--samples N] [--rounds N]

Both queues are measured the same way (see bench/peers/huey_sqlite.py): the queue is
filled first, one consumer process is started, and the drain rate is
``(n - 1) / (last task start - first task start)`` from the tasks' own timestamps,
so interpreter start-up is excluded. Pickup latency is enqueue → task start, one job
at a time, with a random 0-100 ms gap between jobs. Each figure is the median of
``--rounds`` runs, because a 2-core machine is noisy.
"""

from __future__ import annotations

import argparse
import pathlib
import tempfile
from dataclasses import dataclass

import ferryq
from bench import ferryq_runs as runs
from bench.peers import huey_sqlite


@dataclass
class Figures:
    enqueue: float = 0.0
    drain: float = 0.0
    p50: float = 0.0
    p99: float = 0.0


def _sqlite_url(workdir: pathlib.Path) -> str:
    return f"sqlite:///{tempfile.mkdtemp(prefix='ferryq-', dir=workdir)}/bench.db"


def _median(figures: list[Figures], name: str) -> float:
    return runs.median([getattr(f, name) for f in figures])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    ours, peer = [], []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = pathlib.Path(tmp)
        for round_no in range(1, options.rounds + 1):
            mine, theirs = Figures(), Figures()
            mine.enqueue = runs.enqueue(_sqlite_url(workdir), options.jobs)
            mine.drain = runs.drain(_sqlite_url(workdir), options.jobs, workdir)
            theirs.drain = huey_sqlite.drain_throughput(options.jobs, workdir)
            mine.p50, mine.p99 = runs.pickup(_sqlite_url(workdir), options.samples, workdir)
            theirs.p50, theirs.p99 = huey_sqlite.pickup_latency(options.samples, workdir)
            ours.append(mine)
            peer.append(theirs)
            print(f"round {round_no}: ferryq drain {mine.drain:,.0f}/s p50 {mine.p50:.2f} ms "
                  f"p99 {mine.p99:.2f} ms | huey drain {theirs.drain:,.0f}/s "
                  f"p50 {theirs.p50:.1f} ms p99 {theirs.p99:.1f} ms", flush=True)  # fmt: skip
    _report(ours, peer, options)


def _report(ours: list[Figures], peer: list[Figures], options: argparse.Namespace) -> None:
    import huey

    print(f"\nmedians of {options.rounds} rounds, {options.jobs:,} no-op jobs, "
          f"{options.samples} latency samples; ferryq {ferryq.__version__} "
          f"(one worker process, concurrency {runs.CONCURRENCY}), huey {huey.__version__} "
          "SqliteHuey (one consumer, its fastest single-process setting)")  # fmt: skip
    rows = [
        ("drain, jobs/s", "drain", True),
        ("pickup p50, ms", "p50", False),
        ("pickup p99, ms", "p99", False),
    ]
    print(f"{'':18}{'ferryq':>12}{'huey':>12}{'ferryq vs huey':>18}")
    for label, name, higher_is_better in rows:
        a, b = _median(ours, name), _median(peer, name)
        ratio = a / b if higher_is_better else b / a
        print(f"{label:18}{a:>12,.2f}{b:>12,.2f}{ratio:>17.1f}x")
    print(f"{'enqueue, jobs/s':18}{_median(ours, 'enqueue'):>12,.0f}{'-':>12}"
          "   (batches of 1,000)")  # fmt: skip


if __name__ == "__main__":
    main()
