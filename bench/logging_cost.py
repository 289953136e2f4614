"""What the worker's one log line per attempt costs the drain, on both backends.

    python -m bench.logging_cost [--jobs N] [--rounds N] [--backends sqlite,postgres]

One worker process drains a queue filled beforehand (bench.ferryq_runs.drain), three
ways in each round, on fresh databases of one server: ``--log-level warning`` (no
line per attempt), ``--log-level info`` in text and in JSON, each written to a file.
Tracing is off (no hooks). Figures are medians of ``--rounds`` rounds; the ratio is
the drain with lines over the drain without.
"""

from __future__ import annotations

import argparse
import contextlib
import pathlib
import tempfile
from collections.abc import Callable, Iterator

from bench import ferryq_runs as runs

WAYS = {
    "off": ("--log-level", "warning"),
    "text": ("--log-level", "info", "--log-format", "text"),
    "json": ("--log-level", "info", "--log-format", "json"),
}


@contextlib.contextmanager
def _urls(backend: str, workdir: pathlib.Path) -> Iterator[Callable[[], str]]:
    """A maker of fresh database URLs on one server of ``backend``."""
    if backend == "sqlite":
        yield lambda: f"sqlite:///{tempfile.mkdtemp(dir=workdir)}/bench.db"
        return
    from bench.pg_cluster import cluster
    from tests.pg import fresh_database

    with cluster() as pg, contextlib.ExitStack() as databases:
        yield lambda: databases.enter_context(fresh_database(pg))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backends", default="sqlite,postgres")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = pathlib.Path(tmp)
        for backend in options.backends.split(","):
            figures: dict[str, list[float]] = {way: [] for way in WAYS}
            with _urls(backend, workdir) as fresh_url:
                for round_no in range(1, options.rounds + 1):
                    for way, args in WAYS.items():
                        log = workdir / f"{backend}-{way}-{round_no}.log"
                        rate = runs.drain(fresh_url(), options.jobs, workdir, args=args, stderr=log)
                        figures[way].append(rate)
                    print(f"{backend} round {round_no}: " + ", ".join(
                        f"{way} {figures[way][-1]:,.0f}/s" for way in WAYS))  # fmt: skip
            off = runs.median(figures["off"])
            for way in ("text", "json"):
                rate = runs.median(figures[way])
                print(f"{backend}: lines in {way} {rate:,.0f}/s against none {off:,.0f}/s: "
                      f"{rate / off:.2f}x (cost {1 - rate / off:.1%})")  # fmt: skip


if __name__ == "__main__":
    main()
