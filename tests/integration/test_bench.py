"""The benchmarks of lanes, dependencies, rates, history counts, worker processes, the
soak, the pooler and the A/B against a ref still run end to end: tiny sizes, one
round, figures not judged.

The lane benchmark starts real worker processes on both backends and checks its own
setup (the backlog lane is filled as described and left alone by the worker); the
counts benchmark checks that the counts read whole and folded agree. The timings
they print mean nothing at these sizes, so none is asserted.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.pg import PgCluster
from tests.pgbouncer import Bouncer

ROOT = Path(__file__).resolve().parents[2]


def run_module(module: str, options: list[str], pg_cluster: PgCluster) -> str:
    """``python -m bench.MODULE OPTIONS`` on ``pg_cluster``; its output, once it succeeded."""
    done = subprocess.run(
        [sys.executable, "-m", f"bench.{module}", *options],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "FERRYQ_BENCH_PG_URL": pg_cluster.url},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


def run_bench(module: str, options: list[str], pg_cluster: PgCluster) -> str:
    """``python -m bench.MODULE OPTIONS`` on both backends; its output, once it succeeded."""
    return run_module(module, ["--backend", "both", *options], pg_cluster)


def test_the_lanes_benchmark_runs_on_both_backends(pg_cluster: PgCluster) -> None:
    options = ["--rounds", "1", "--jobs", "200", "--lanes", "20", "--backlog", "1000",
               "--samples", "5", "--singles", "20", "--batches", "3"]  # fmt: skip
    output = run_bench("lanes", options, pg_cluster)
    for backend in ("sqlite", "postgres"):
        section = output.split(f"{backend}: medians of 1 rounds")[1].split("\n\n")[0]
        for row in ("drain, jobs/s", "pickup p99, ms", "enqueue, batches of 100, jobs/s"):
            assert row in section, section


def test_the_dependencies_and_rates_benchmarks_run_on_every_setting(
    pg_cluster: PgCluster,
) -> None:
    dependencies = run_bench("dependencies", ["--rounds", "1", "--members", "100",
                                              "--singles", "20"], pg_cluster)  # fmt: skip
    rates = run_bench("rates", ["--rounds", "1", "--jobs", "200", "--lanes", "20",
                                "--binding-lanes", "1", "--binding-jobs", "6",
                                "--binding-processes", "1"], pg_cluster)  # fmt: skip
    for setting in ("SQLite NORMAL", "SQLite FULL", "PostgreSQL, durable"):
        section = dependencies.split(f"{setting}: medians of 1 rounds")[1].split("\n\n")[0]
        assert "fan-in of 100: s to the callback" in section, section
        section = rates.split(f"{setting}: medians of 1 rounds")[1].split("\n\n")[0]
        assert "200 jobs over 20 lanes" in section and "200 jobs in no lane" in section, section
        assert "of the sum of the rates used" in section, section


def test_the_history_counts_benchmark_runs_on_both_backends(pg_cluster: PgCluster) -> None:
    output = run_bench("history_counts", ["--rows", "3000", "--reads", "1"], pg_cluster)
    for backend in ("sqlite", "postgres"):
        assert f"{backend}: job_counts over 3,000 history rows: read whole" in output


def test_the_processes_benchmark_runs(pg_cluster: PgCluster) -> None:
    output = run_module("processes", ["--rounds", "1", "--jobs", "200", "--work-ms", "0.5"],
                        pg_cluster)  # fmt: skip
    for line in ("--processes 1: ", "--processes 2: ", "ratio: "):
        assert line in output, output


def test_the_soak_runs_both_arms_through_the_three_phases(pg_cluster: PgCluster) -> None:
    """A few thousand jobs, a transaction open for a second: each arm reports every
    measure before, during and after it; the second arm is the migrations' options."""
    output = run_module("soak", ["--jobs", "2000", "--rate", "1000", "--hold", "1",
                                 "--every", "0.2"], pg_cluster)  # fmt: skip
    report = output.split("medians of 1 rounds")[1]
    assert "PostgreSQL's defaults:" in report, report
    assert "options autovacuum_" in report, report
    for row in ("before      during       after", "pickup p99, ms", "ready scan, ms",
                "total, MB", "dead rows, most", "autovacuums", "load (1 min)"):  # fmt: skip
        assert report.count(row) == 2, report


def test_the_pooled_benchmark_runs(pg_cluster: PgCluster, pgbouncer: Bouncer) -> None:
    """The bench starts a PgBouncer of its own; ``pgbouncer`` is asked for its check
    only (skipped without a pgbouncer binary, failed under CI)."""
    options = ["--rounds", "1", "--jobs", "50", "--calls", "5", "--producers", "2",
               "--producer-calls", "5", "--processes", "1,2", "--samples", "3",
               "--gap", "0", "0.05", "--quiet", "0.2"]  # fmt: skip
    report = run_module("pooled", options, pg_cluster).split("medians of 1 rounds")[1]
    for row in ("drain, 1 worker process(es), jobs/s", "drain, 2 worker process(es), jobs/s",
                "enqueue, one caller, calls/s", "enqueue, 2 processes at once, calls/s",
                "idle worker: pickup p50, ms", "idle worker: CPU, % of a core"):  # fmt: skip
        assert row in report, report


def test_the_ab_benchmark_alternates_a_ref_with_the_working_tree(pg_cluster: PgCluster) -> None:
    """HEAD against the working tree, every setting and measure at a tiny size; the
    temporary worktree is gone afterwards."""
    options = ["HEAD", "--rounds", "1", "--jobs", "50", "--enqueues", "5"]
    report = run_module("ab", options, pg_cluster).split("medians of 1 rounds")[1]
    for row in ("PostgreSQL durable", "SQLite NORMAL", "SQLite FULL", "drain, jobs/s",
                "worker CPU per job, µs", "single enqueue, calls/s"):  # fmt: skip
        assert row in report, report
    worktrees = subprocess.run(["git", "worktree", "list"], cwd=ROOT, capture_output=True,
                               text=True, check=True).stdout  # fmt: skip
    assert "ferryq-ab-" not in worktrees


def test_the_transactional_benchmark_runs_on_both_backends(pg_cluster: PgCluster) -> None:
    output = run_bench("transactional", ["--rounds", "1", "--calls", "20"], pg_cluster)
    for setting in ("SQLite NORMAL", "PostgreSQL, durable"):
        section = output.split(f"{setting}: medians of 1 rounds")[1].split("\n\n")[0]
        for row in ("Session alone", "ratio Session / own, sync", "ratio AsyncSession / own"):
            assert row in section, section
