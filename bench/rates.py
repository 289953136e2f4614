"""Rates per lane: what the rate gate costs a claim, on SQLite and PostgreSQL.

    python -m bench.rates [--backend sqlite|postgres|both] [--rounds N] [--jobs N]
                          [--lanes N] [--binding-lanes N] [--binding-jobs N]
                          [--binding-processes N]

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

And how fully a binding rate is used: ``--binding-lanes`` lanes of ``--binding-jobs``
jobs each, every lane at 5 starts a second (limit 5, so several of a lane's jobs are
ready together), drained by ``--binding-processes`` worker processes competing for
them: the starts a second of each lane after its first window, from the claim times
the database recorded, summed, against the sum of the rates (``--binding-jobs 0``
leaves it out). How exactly a binding rate is kept, across worker processes, is the
acceptance test's (tests/acceptance/test_lane_rates_across_processes.py). SQLite runs
at ferryq's default (NORMAL) and at FULL; PostgreSQL comes from FERRYQ_BENCH_PG_URL or a
throwaway cluster made durable (bench/pg_cluster.py).
"""

from __future__ import annotations

import argparse
import pathlib
from collections import defaultdict

import ferryq
from bench import ferryq_runs as runs
from bench import ferryq_tasks, settings
from bench.lanes import Databases

NEVER_BINDS = (10_000, 0.001)  # n, per
BINDING = (5, 1.0)  # n, per: the acceptance test's rate


def rated(url: str, pattern: str) -> None:
    app = ferryq.App(url)
    try:
        app.migrate()
        app.set_lane_rate(pattern, *NEVER_BINDS)
    finally:
        app.close()


def binding_use(url: str, workdir: pathlib.Path, options: argparse.Namespace) -> float:
    """The starts a second of rated lanes drained by competing worker processes, as a
    fraction of the sum of their rates (see the module's docstring)."""
    rate, per = BINDING
    lanes, jobs = options.binding_lanes, options.binding_jobs
    app = ferryq.App(url)
    try:
        app.migrate()
        app.set_lane_limit("b:*", rate)
        app.set_lane_rate("b:*", rate, per=per)
        for lane in range(lanes):
            app.enqueue_many(ferryq_tasks.tick.name, [[]] * jobs, lane=f"b:{lane}")
        ticks = runs.ticks_file(workdir)
        procs = [runs.start_worker(url, ticks, args=("--concurrency", "8"))
                 for _ in range(options.binding_processes)]  # fmt: skip
        try:
            runs.wait_ticks(ticks, lanes * jobs, procs[0])
        finally:
            for proc in procs:
                runs.stop(proc)
        claimed: dict[str | None, list[float]] = defaultdict(list)
        for job in app.list_jobs(state="succeeded", limit=lanes * jobs):
            claimed[job.lane].append(job.claimed_at or 0.0)
    finally:
        app.close()
    used = sum((jobs - rate) / (max(times) - min(times)) for times in claimed.values())
    return float(used / (lanes * rate / per))


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
    if options.binding_jobs:
        with databases() as url:
            found["binding"] = binding_use(url, workdir, options)
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
    if "binding" in m:
        rate, per = BINDING
        print(f"a binding rate ({rate} per {per:g} s) over {options.binding_lanes} lanes of "
              f"{options.binding_jobs} jobs, {options.binding_processes} worker processes: "
              f"{m['binding']:.0%} of the sum of the rates used")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--lanes", type=int, default=4_000)
    parser.add_argument("--binding-lanes", type=int, default=20)
    parser.add_argument("--binding-jobs", type=int, default=200)
    parser.add_argument("--binding-processes", type=int, default=3)
    settings.run(parser, one_round, report)


if __name__ == "__main__":
    main()
