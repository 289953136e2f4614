from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


class Workers:
    """Real worker processes on one database; all are killed at the end of the test."""

    def __init__(self, url: str, log_dir: Path) -> None:
        self.url = url
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen[str]] = []
        self.stderr_paths: dict[int, Path] = {}

    def start(
        self, *args: str, module: str = "tests.acceptance.worker_main"
    ) -> subprocess.Popen[str]:
        env = {**os.environ, "FERRYQ_URL": self.url, "FERRYQ_TEST_LOG_DIR": str(self.log_dir),
               "PYTHONPATH": str(ROOT)}  # fmt: skip
        # Logs go to a file: a pipe nobody reads would stall a chatty worker.
        with open(self.log_dir / f"worker-{len(self.procs)}.stderr", "w") as stderr:
            proc = subprocess.Popen(
                [sys.executable, "-m", module, *args],
                cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=stderr, text=True,
            )  # fmt: skip
        self.procs.append(proc)
        self.stderr_paths[proc.pid] = Path(stderr.name)
        return proc

    def stderr_of(self, proc: subprocess.Popen[str]) -> str:
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            log = self.stderr_paths[proc.pid].read_text()
            raise AssertionError(f"still running 60 s on; it wrote:\n{log}") from None
        return self.stderr_paths[proc.pid].read_text()

    def log_lines(self) -> list[str]:
        return [
            line for path in self.log_dir.glob("*.log") for line in path.read_text().splitlines()
        ]

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    """Worker processes on a SQLite file."""
    yield from _workers(f"sqlite:///{tmp_path}/ferryq.db", tmp_path)


@pytest.fixture
def pg_workers(pg_url: str, tmp_path: Path) -> Iterator[Workers]:
    """Worker processes on a PostgreSQL database."""
    yield from _workers(pg_url, tmp_path)


@pytest.fixture(params=["sqlite", "postgres"])
def any_workers(request: pytest.FixtureRequest) -> Workers:
    """Worker processes on SQLite, then on PostgreSQL."""
    name = "workers" if request.param == "sqlite" else "pg_workers"
    found: Workers = request.getfixturevalue(name)
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
