"""Rates per lane: what the rate gate costs a claim, on SQLite and PostgreSQL.

    python -m bench.rates [--backend sqlite|postgres|both] [--rounds N] [--jobs N]
                          [--lanes N]

A rate that never binds (10,000 starts in any millisecond) is set on every lane, so
each claim goes through the gate (pick, rules, the windows locked, read and written,
the claim) and none is held back: what is measured is the gate's price, not the rate.
Each drain of ``--jobs`` no-op jobs by one worker process is compared with the same
drain without a rate, every measurement on a fresh database, each figure the median
of ``--rounds`` runs:

- lanes: the jobs spread over ``--lanes`` lanes of limit 1 (with a rate, a freed
  lane's next job is not handed to the finishing worker: it goes through ``ready``);
- plain: the jobs in no lane, in a namespace that has a rate (the gate's rules are
  read, no window is).

How exactly a binding rate is kept, across worker processes, is the acceptance
test's (tests/acceptance/test_lane_rates.py). SQLite runs at ferryq's default
(NORMAL) and at FULL; PostgreSQL comes from FERRYQ_BENCH_PG_URL or a throwaway
cluster made durable (bench/pg_cluster.py).
"""

from __future__ import annotations

import argparse
import pathlib

import ferryq
from bench import ferryq_runs as runs
from bench import settings
from bench.lanes import Databases

NEVER_BINDS = (10_000, 0.001)  # n, per


def rated(url: str, pattern: str) -> None:
    app = ferryq.App(url)
    try:
        app.migrate()
        app.set_lane_rate(pattern, *NEVER_BINDS)
    finally:
        app.close()


def one_round(
    databases: Databases, workdir: pathlib.Path, options: argparse.Namespace
) -> dict[str, float]:
    found: dict[str, float] = {}
    for with_rate in (False, True):
        suffix = "_rated" if with_rate else ""
        with databases() as url:
            if with_rate:
                rated(url, "l:*")
            found[f"lanes{suffix}"] = runs.drain(url, options.jobs, workdir, lanes=options.lanes)
        with databases() as url:
            if with_rate:
                rated(url, "elsewhere:*")
            found[f"plain{suffix}"] = runs.drain(url, options.jobs, workdir)
    return found


def report(backend: str, figures: dict[str, list[float]], options: argparse.Namespace) -> None:
    m = {name: runs.median(values) for name, values in figures.items()}
    print(f"\n{backend}: medians of {options.rounds} rounds, one worker process "
          f"({runs.CONCURRENCY} slots), a fresh database per measurement.")  # fmt: skip
    print(f"{'drain, jobs/s':44}{'rated':>12}{'no rate':>12}{'ratio':>8}")
    for name, label in (
        ("lanes", f"{options.jobs:,} jobs over {options.lanes:,} lanes"),
        ("plain", f"{options.jobs:,} jobs in no lane"),
    ):
        print(f"{label:44}{m[f'{name}_rated']:>12,.0f}{m[name]:>12,.0f}"
              f"{m[f'{name}_rated'] / m[name]:>7.2f}x")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--lanes", type=int, default=4_000)
    settings.run(parser, one_round, report)


if __name__ == "__main__":
    main()
