"""The processes tests start: a ``ferryq worker`` or ``ferryq server``, a worker of the
tests' own (``python -m tests.acceptance.worker_main``), a helper process.

Each is started with the test run's environment plus what the test gives, from the
repository's root (so ``tests.*`` and ``bench.*`` import), with its stdout and stderr
in files of its own: a pipe nobody reads would stall a chatty process, a file survives
a SIGKILL, and a failure can quote it. A test waits for what a process writes
(``wait_for``: its readiness line) or does, never for a guessed while; it stops a
process with SIGTERM (``stop``: the exit status, or a failure quoting the log if it does
not exit in time), and whatever is still running at the end of the test is killed
(``Processes.close``). Every wait is bounded, and a bound that passes fails the test
with the process's exit status and the end of its log.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[1]
START_SECONDS = 60.0  # from exec to a readiness line: imports and a migration, machine busy
STOP_SECONDS = 60.0  # from SIGTERM to exit: a worker's grace and its last writes
POLL = 0.01  # seconds between two looks at a condition (not a wait for anything)

#: What a worker writes once it runs, its signal handlers in place (ferryq/worker/runner.py).
WORKER_STARTED = re.compile(r"worker \S+ started: queues ")


class ProcessFailed(AssertionError):
    """A process did not do what the test waited for; the message quotes its log."""


class Process:
    """One process a test started: ``popen`` for what the standard library offers,
    ``stdout()``/``stderr()`` for what it wrote so far."""

    def __init__(
        self,
        argv: Sequence[str],
        log_dir: Path,
        name: str,
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path = ROOT,
        stdin: bool = False,
    ) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.stdout_path = log_dir / f"{name}.stdout"
        self.stderr_path = log_dir / f"{name}.stderr"
        with self.stdout_path.open("wb") as out, self.stderr_path.open("wb") as err:
            self.popen = subprocess.Popen(
                list(argv), cwd=cwd, env=dict(env if env is not None else os.environ),
                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL, stdout=out, stderr=err,
            )  # fmt: skip

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    @property
    def stdin(self) -> IO[bytes]:
        assert self.popen.stdin is not None, f"{self.name} was started without stdin"
        return self.popen.stdin

    def poll(self) -> int | None:
        return self.popen.poll()

    def running(self) -> bool:
        return self.popen.poll() is None

    def send_signal(self, sig: int) -> None:
        self.popen.send_signal(sig)

    def stdout(self) -> str:
        return _read(self.stdout_path)

    def stderr(self) -> str:
        return _read(self.stderr_path)

    def describe(self) -> str:
        """Its state and the end of what it wrote: for a failure's message."""
        code = self.popen.poll()
        state = "still running" if code is None else f"exited with {code}"
        return (f"{self.name} (pid {self.pid}) {state}\n--- stderr ---\n{tail(self.stderr())}"
                f"\n--- stdout ---\n{tail(self.stdout())}")  # fmt: skip

    def wait(self, timeout: float = STOP_SECONDS) -> int:
        """Its exit status, once it exits by itself; killed and failed after ``timeout``."""
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise ProcessFailed(f"did not exit within {timeout} s: {self.describe()}") from None

    def stop(self, timeout: float = STOP_SECONDS) -> int:
        """SIGTERM, then its exit status; killed and failed if it outlives ``timeout``."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        return self.wait(timeout)

    def kill(self) -> None:
        """SIGKILL, and reaped: dead when this returns."""
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait()

    def close(self) -> None:
        self.kill()
        if self.popen.stdin is not None:
            self.popen.stdin.close()

    def wait_for(
        self,
        wanted: str | re.Pattern[str] | Callable[[str], bool],
        *,
        stream: str = "stderr",
        within: float = START_SECONDS,
    ) -> str:
        """What it wrote to ``stream`` so far, once that holds ``wanted`` (a text, a
        pattern or a test of the whole text). Fails, quoting its log, if it exits first
        or if ``within`` seconds pass."""
        read = self.stderr if stream == "stderr" else self.stdout
        holds = _matcher(wanted)
        deadline = time.monotonic() + within
        while True:
            exited = self.popen.poll() is not None
            text = read()
            if holds(text):
                return text
            if exited:
                raise ProcessFailed(f"exited before writing {wanted!r}: {self.describe()}")
            if time.monotonic() > deadline:
                raise ProcessFailed(f"no {wanted!r} within {within} s: {self.describe()}")
            time.sleep(POLL)


class Processes:
    """The processes of one test, their logs in ``log_dir``; ``close()`` kills those
    still running. ``env`` is added to the run's environment for each of them."""

    def __init__(self, log_dir: Path, env: Mapping[str, str] | None = None) -> None:
        self.log_dir = log_dir
        self.env = dict(env or {})
        self.started: list[Process] = []

    def start(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        name: str | None = None,
        cwd: Path = ROOT,
        stdin: bool = False,
        clean_env: Sequence[str] = (),
    ) -> Process:
        """``argv`` as a process; ``clean_env`` names variables of the run's environment
        to leave out (``env`` may still set them)."""
        environ = {**os.environ, "PYTHONPATH": str(ROOT), **self.env}
        for variable in clean_env:
            environ.pop(variable, None)
        environ.update(env or {})
        process = Process(argv, self.log_dir, name or f"process-{len(self.started)}",
                          env=environ, cwd=cwd, stdin=stdin)  # fmt: skip
        self.started.append(process)
        return process

    def live(self) -> list[Process]:
        return [process for process in self.started if process.running()]

    def close(self) -> None:
        for process in self.started:
            process.close()


def python(module: str, *args: str) -> list[str]:
    """The command line of ``python -m module args``, with the tests' interpreter."""
    return [sys.executable, "-m", module, *args]


def wait_until(
    condition: Callable[[], bool], *, within: float, interval: float = 0.02, what: str = ""
) -> float:
    """Poll ``condition`` until it holds; the seconds it took. Fails after ``within``."""
    began = time.monotonic()
    while not condition():
        if time.monotonic() - began > within:
            raise AssertionError(f"not true within {within} s: {what or condition}")
        time.sleep(interval)  # the poll interval, not a wait for something to happen
    return time.monotonic() - began


def tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _matcher(wanted: str | re.Pattern[str] | Callable[[str], bool]) -> Callable[[str], bool]:
    if isinstance(wanted, str):
        return lambda text: wanted in text
    if isinstance(wanted, re.Pattern):
        return lambda text: wanted.search(text) is not None
    return wanted
