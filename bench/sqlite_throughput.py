"""ferryq on SQLite against huey's SqliteHuey, side by side on this machine.

    python -m bench.sqlite_throughput [--jobs N] [--samples N] [--rounds N]

ferryq is measured at its default, ``sqlite:///file.db`` (WAL, synchronous NORMAL: a
commit survives a crash of the process, and the last ones may be lost to a power
cut), and at ``sqlite:///file.db?synchronous=full`` (WAL, synchronous FULL: every
commit is on disk when it returns). huey's ``SqliteHuey`` runs at FULL (``fsync=True``;
its default sets no pragma and leaves SQLite's build default, FULL for the stdlib's
SQLite here), so ferryq FULL against huey is like for like.

Every queue is measured the same way (see bench/peers/huey_sqlite.py): the queue is
filled first, one consumer process is started, and the drain rate is
``(n - 1) / (last task start - first task start)`` from the tasks' own timestamps,
so interpreter start-up is excluded. Pickup latency is enqueue → task start, one job
at a time, with a random 0-100 ms gap between jobs. Each figure is the median of
``--rounds`` runs, because a 2-core machine is noisy.
"""

from __future__ import annotations

import argparse
import pathlib
import sqlite3
import tempfile
from collections import defaultdict

import ferryq
from bench import ferryq_runs as runs
from bench.peers import huey_sqlite

#: ferryq's settings measured: column title -> URL query.
SETTINGS = {"ferryq NORMAL": "", "ferryq FULL": "?synchronous=full"}
PEER = "huey FULL"
Figures = dict[str, dict[str, list[float]]]  # queue -> measure -> one figure a round


def _sqlite_url(workdir: pathlib.Path, query: str) -> str:
    return f"sqlite:///{tempfile.mkdtemp(prefix='ferryq-', dir=workdir)}/bench.db{query}"


def _ferryq_round(
    workdir: pathlib.Path, query: str, options: argparse.Namespace
) -> dict[str, float]:
    found = {
        "enqueue": runs.enqueue(_sqlite_url(workdir, query), options.jobs),
        "drain": runs.drain(_sqlite_url(workdir, query), options.jobs, workdir),
    }
    found["p50"], found["p99"] = runs.pickup(_sqlite_url(workdir, query), options.samples, workdir)
    return found


def _huey_round(workdir: pathlib.Path, options: argparse.Namespace) -> dict[str, float]:
    found = {"drain": huey_sqlite.drain_throughput(options.jobs, workdir)}
    found["p50"], found["p99"] = huey_sqlite.pickup_latency(options.samples, workdir)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    figures: Figures = {name: defaultdict(list) for name in (*SETTINGS, PEER)}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = pathlib.Path(tmp)
        huey_default = huey_sqlite.default_synchronous(workdir)
        for round_no in range(1, options.rounds + 1):
            found = {name: _ferryq_round(workdir, query, options)
                     for name, query in SETTINGS.items()}  # fmt: skip
            found[PEER] = _huey_round(workdir, options)
            for name, measured in found.items():
                for measure, value in measured.items():
                    figures[name][measure].append(value)
            print(f"round {round_no}: " + " | ".join(
                f"{name} drain {f['drain']:,.0f}/s p50 {f['p50']:.2f} ms p99 {f['p99']:.2f} ms"
                for name, f in found.items()), flush=True)  # fmt: skip
    _report(figures, options, huey_default)


def _report(figures: Figures, options: argparse.Namespace, huey_default: str) -> None:
    import huey

    print(f"\nmedians of {options.rounds} rounds, {options.jobs:,} no-op jobs, "
          f"{options.samples} latency samples; SQLite {sqlite3.sqlite_version}, WAL; "
          f"ferryq {ferryq.__version__} (one worker process, concurrency "
          f"{runs.CONCURRENCY}) at synchronous NORMAL (its default) and FULL; huey "
          f"{huey.__version__} SqliteHuey at FULL (its default: {huey_default} here), one "
          "consumer, its fastest single-process setting")  # fmt: skip
    ours = list(SETTINGS)
    print(f"{'':18}" + "".join(f"{name:>15}" for name in (*ours, PEER))
          + "".join(f"{name.split()[1] + ' vs huey':>16}" for name in ours))  # fmt: skip
    for label, measure, higher_is_better in (("drain, jobs/s", "drain", True),
                                             ("pickup p50, ms", "p50", False),
                                             ("pickup p99, ms", "p99", False)):  # fmt: skip
        theirs = runs.median(figures[PEER][measure])
        values = [runs.median(figures[name][measure]) for name in ours]
        ratios = [v / theirs if higher_is_better else theirs / v for v in values]
        print(f"{label:18}" + "".join(f"{v:>15,.2f}" for v in (*values, theirs))
              + "".join(f"{r:>15.1f}x" for r in ratios))  # fmt: skip
    enqueues = "".join(f"{runs.median(figures[name]['enqueue']):>15,.0f}" for name in ours)
    print(f"{'enqueue, jobs/s':18}{enqueues}{'-':>15}   (batches of 1,000)")


if __name__ == "__main__":
    main()
