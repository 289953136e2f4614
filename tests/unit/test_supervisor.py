"""The command line a supervisor gives its worker processes."""

from __future__ import annotations

import sys

from ferryq.worker.supervisor import worker_command

PYTHON = [sys.executable, "-m", "ferryq"]


def test_a_child_gets_every_argument_as_given_and_one_process() -> None:
    argv = ["--url", "sqlite:///a.db", "worker", "jobs:app", "--processes", "4", "-c", "5",
            "--log-format", "json"]  # fmt: skip
    assert worker_command(argv) == [*PYTHON, *argv, "--processes=1"]
    assert worker_command(["worker", "jobs:app", "--processes=4"]) == [
        *PYTHON, "worker", "jobs:app", "--processes=4", "--processes=1",
    ]  # fmt: skip


def test_the_one_process_option_goes_before_a_double_dash() -> None:
    assert worker_command(["worker", "--processes", "2", "--", "jobs:app"]) == [
        *PYTHON, "worker", "--processes", "2", "--processes=1", "--", "jobs:app",
    ]  # fmt: skip
