"""The settings users run, measured side by side: SQLite at ferryq's default (NORMAL)
and at FULL, and PostgreSQL durable (FERRYQ_BENCH_PG_URL, or a throwaway cluster made
durable: bench/pg_cluster.py). Rounds alternate between them, so that noise of the
machine spreads over all three."""

from __future__ import annotations

import argparse
import contextlib
import pathlib
import tempfile
from collections import defaultdict
from collections.abc import Callable

from bench.lanes import Databases, sqlite_databases
from bench.pg_cluster import cluster
from tests.pg import fresh_database

Figures = dict[str, dict[str, list[float]]]  # setting -> measure -> one value per round
OneRound = Callable[[Databases, pathlib.Path], dict[str, float]]
Round = Callable[[Databases, pathlib.Path, argparse.Namespace], dict[str, float]]
Report = Callable[[str, dict[str, list[float]], argparse.Namespace], None]


def run(parser: argparse.ArgumentParser, one_round: Round, report: Report) -> None:
    """A benchmark's main: ``--backend`` and ``--rounds`` beside the parser's own
    options, ``one_round`` measured on every setting, then ``report`` of each."""
    parser.add_argument("--backend", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()

    def one(databases: Databases, workdir: pathlib.Path) -> dict[str, float]:
        return one_round(databases, workdir, options)

    for name, figures in measure(options.backend, options.rounds, one).items():
        report(name, figures, options)


def measure(backend: str, rounds: int, one_round: OneRound) -> Figures:
    """``one_round`` on each setting of ``backend`` (sqlite, postgres or both),
    ``rounds`` times; each round gets fresh databases from its ``Databases``."""
    results: Figures = defaultdict(lambda: defaultdict(list))
    with tempfile.TemporaryDirectory(prefix="ferryq-bench-") as tmp:
        workdir = pathlib.Path(tmp)
        setups: list[tuple[str, Databases]] = []
        with contextlib.ExitStack() as stack:
            if backend in ("sqlite", "both"):
                setups.append(("SQLite NORMAL", sqlite_databases(workdir, "")))
                setups.append(("SQLite FULL", sqlite_databases(workdir, "?synchronous=full")))
            if backend in ("postgres", "both"):
                pg = stack.enter_context(cluster())
                setups.append(("PostgreSQL, durable", lambda: fresh_database(pg)))
            for _ in range(rounds):
                for name, databases in setups:
                    for key, value in one_round(databases, workdir).items():
                        results[name][key].append(value)
    return results
