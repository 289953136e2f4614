from __future__ import annotations

import os
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

    def start(self, *args: str) -> subprocess.Popen[str]:
        env = {**os.environ, "FERRYQ_URL": self.url, "FERRYQ_TEST_LOG_DIR": str(self.log_dir),
               "PYTHONPATH": str(ROOT)}  # fmt: skip
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.acceptance.worker_main", *args],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.procs.append(proc)
        return proc

    def stderr_of(self, proc: subprocess.Popen[str]) -> str:
        proc.wait(timeout=60)
        assert proc.stderr is not None
        return proc.stderr.read()

    def log_lines(self) -> list[str]:
        return [
            line for path in self.log_dir.glob("*.log") for line in path.read_text().splitlines()
        ]

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            if proc.stderr is not None:
                proc.stderr.close()


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    group = Workers(f"sqlite:///{tmp_path}/ferryq.db", log_dir)
    yield group
    group.close()


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
