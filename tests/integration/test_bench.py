"""The benchmarks of lanes, dependencies, rates, history counts, worker processes and
the A/B against a ref still run end to end: tiny sizes, one round, figures not judged.

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

ROOT = Path(__file__).resolve().parents[2]


def run_bench(module: str, options: list[str], pg_cluster: PgCluster) -> str:
    """``python -m bench.MODULE OPTIONS`` on both backends; its output, once it succeeded."""
    done = subprocess.run(
        [sys.executable, "-m", f"bench.{module}", "--backend", "both", *options],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "FERRYQ_BENCH_PG_URL": pg_cluster.url},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


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
    done = subprocess.run(
        [sys.executable, "-m", "bench.processes", "--rounds", "1", "--jobs", "200",
         "--work-ms", "0.5"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "FERRYQ_BENCH_PG_URL": pg_cluster.url},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    for line in ("--processes 1: ", "--processes 2: ", "ratio: "):
        assert line in done.stdout, done.stdout


def test_the_ab_benchmark_alternates_a_ref_with_the_working_tree(pg_cluster: PgCluster) -> None:
    """HEAD against the working tree, every setting and measure at a tiny size; the
    temporary worktree is gone afterwards."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.ab", "HEAD", "--rounds", "1", "--jobs", "50",
         "--enqueues", "5"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "FERRYQ_BENCH_PG_URL": pg_cluster.url},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    report = done.stdout.split("medians of 1 rounds")[1]
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
