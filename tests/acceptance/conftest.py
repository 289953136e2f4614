"""Worker processes for the acceptance tests, through the suite's one harness
(tests/processes.py), and the ways tests and handlers signal to one another."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import POOLED, pooled_url
from tests.processes import Process, Processes, python


class Workers(Processes):
    """Worker processes on one database (``FERRYQ_URL``); their handlers log to
    ``log_dir`` (``FERRYQ_TEST_LOG_DIR``: tests/acceptance/worker_support.py), and all
    are killed at the end of the test."""

    def __init__(self, url: str, log_dir: Path) -> None:
        super().__init__(log_dir, env={"FERRYQ_URL": url, "FERRYQ_TEST_LOG_DIR": str(log_dir)})
        self.url = url

    def worker(self, *args: str, module: str = "tests.acceptance.worker_main") -> Process:
        """``python -m module args``: the tests' worker, unless ``module`` says another
        (``ferryq`` for the command line's own)."""
        return self.start(python(module, *args), name=f"worker-{len(self.started)}")

    def log_lines(self) -> list[str]:
        """Every line the handlers logged so far, from every process."""
        return [
            line for path in self.log_dir.glob("*.log") for line in path.read_text().splitlines()
        ]


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    """Worker processes on a SQLite file."""
    yield from _workers(f"sqlite:///{tmp_path}/ferryq.db", tmp_path)


@pytest.fixture
def pg_workers(pg_url: str, tmp_path: Path) -> Iterator[Workers]:
    """Worker processes on a PostgreSQL database."""
    yield from _workers(pg_url, tmp_path)


@pytest.fixture
def pooled_workers(pgbouncer_url: str, tmp_path: Path) -> Iterator[Workers]:
    """Worker processes on a PostgreSQL database through the session's PgBouncer, in
    transaction mode (``pooler=transaction``, no direct URL)."""
    yield from _workers(pooled_url(pgbouncer_url), tmp_path)


@pytest.fixture(params=["sqlite", "postgres"])
def any_workers(request: pytest.FixtureRequest) -> Workers:
    """Worker processes on SQLite, then on PostgreSQL; a test that proves its scenario
    through the pooler too adds ``POOLED`` to the parameters
    (``pytest.mark.parametrize("any_workers", [..., POOLED], indirect=True)``)."""
    names = {"sqlite": "workers", "postgres": "pg_workers", POOLED: "pooled_workers"}
    found: Workers = request.getfixturevalue(names[request.param])
    return found


def _workers(url: str, tmp_path: Path) -> Iterator[Workers]:
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    group = Workers(url, log_dir)
    yield group
    group.close()


@contextlib.contextmanager
def write_lock(path: str) -> Iterator[None]:
    """SQLite's write lock on the file at ``path``, held by a connection of this
    process (another process, to the workers) until the block ends."""
    conn = sqlite3.connect(path, isolation_level=None, timeout=30)
    try:
        conn.execute("BEGIN IMMEDIATE")
        yield
        conn.execute("ROLLBACK")
    finally:
        conn.close()


def fifos(folder: Path, *names: str) -> list[Path]:
    """New FIFOs named ``names`` in ``folder``: a job and the test signal through them."""
    made = [folder / name for name in names]
    for path in made:
        os.mkfifo(path)
    return made


def read_fifo(path: Path, timeout: float = 30.0) -> str:
    """Block until a writer sends a line through the FIFO (or fail after ``timeout``)."""
    result: list[str] = []
    reader = threading.Thread(target=lambda: result.append(path.read_text()), daemon=True)
    reader.start()
    reader.join(timeout)
    if not result:
        # Unblock the reader thread by opening the FIFO for writing once.
        with open(path, "w"):
            pass
        raise TimeoutError(f"nothing arrived through {path} within {timeout} s")
    return result[0]
