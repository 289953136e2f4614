"""``ferryq worker --processes N``: one process keeping N worker processes running.

Each child is an ordinary ``ferryq worker`` with this one's command line. The
supervisor restarts a child that dies, after a pause that grows while deaths follow
each other; gives up when a child keeps dying as it starts (a module that fails to
import, a database it cannot open); passes SIGTERM/SIGINT on to every child; and never
opens the database. See docs/operations.md, "Several processes".

It is one thread with no event loop: it sleeps in ``select`` on a pipe that every
signal it watches (SIGCHLD included) writes a byte to, or until its next deadline.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from ferryq.worker.runner import MIN_FINISH_WAIT

log = logging.getLogger("ferryq.supervisor")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
#: A child still running this long after the longest stop it may take on its own
#: (grace, then as long again, 5 s at least, to write outcomes) is killed.
KILL_MARGIN = 5.0
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


@dataclass(frozen=True)
class RestartPolicy:
    """When a child that died is started again, and when the supervisor gives up."""

    #: The pause before the first restart; each death in a row doubles it.
    first_delay: float = 0.5
    max_delay: float = 30.0
    #: A child that ran this long starts its slot's pauses over.
    stable_after: float = 30.0
    #: A child that dies sooner than this after its start died "at start"...
    quick_death: float = 5.0
    #: ...and when that happens this many times in a row in one slot, the supervisor
    #: stops the other children and exits with the status of that last death.
    crash_limit: int = 5


@dataclass
class _Slot:
    """One of the N places a child runs in, across its restarts."""

    number: int
    delay: float
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    restart_at: float | None = None
    quick_deaths: int = 0
    done: bool = False
    status: int = 0  # its exit status once done (128 + N for a death by signal N)


class Supervisor:
    """Runs ``command`` in ``processes`` children until they stop; ``run()`` returns
    the exit status for the supervisor (docs/operations.md)."""

    def __init__(
        self,
        command: Sequence[str],
        processes: int,
        *,
        grace: float,
        burst: bool = False,
        policy: RestartPolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.command = list(command)
        self.grace = grace
        self.burst = burst
        self.policy = policy or RestartPolicy()
        self.clock = clock
        self.slots = [_Slot(n, self.policy.first_delay) for n in range(1, processes + 1)]
        self._stopping = False
        self._kill_at: float | None = None
        self._gave_up: int | None = None  # the exit status, once it gave up
        self._before_exec = _stop_with_parent()

    def run(self) -> int:
        with _signal_pipe((*STOP_SIGNALS, signal.SIGCHLD)) as signals:
            for slot in self.slots:
                self._start(slot)
            while not all(slot.done for slot in self.slots):
                for signum in _wait(signals, self._timeout()):
                    if signum != signal.SIGCHLD:
                        self._on_signal(signal.Signals(signum))
                self._tend(self.clock())
        if self._gave_up is not None:
            return self._gave_up
        return max(slot.status for slot in self.slots)

    # -- children ----------------------------------------------------------------

    def _start(self, slot: _Slot) -> None:
        slot.restart_at = None
        slot.started_at = self.clock()
        # A process group of its own: a Ctrl-C in a terminal reaches the supervisor
        # alone, which passes it on once (a worker takes a second one as "exit now").
        slot.proc = subprocess.Popen(
            self.command, stdin=subprocess.DEVNULL, process_group=0, preexec_fn=self._before_exec
        )
        log.info("worker process %s: pid %d", self._name(slot), slot.proc.pid,
                 extra=self._fields(slot, slot.proc.pid))  # fmt: skip

    def _tend(self, now: float) -> None:
        for slot in self.slots:
            status = None if slot.proc is None else slot.proc.poll()
            if status is not None:
                self._ended(slot, status, now)
            elif slot.restart_at is not None and now >= slot.restart_at:
                self._start(slot)
        if self._kill_at is not None and now >= self._kill_at:
            self._kill_at = None
            for slot in self.slots:
                if slot.proc is not None:
                    log.error("worker process %s (pid %d) still running %.0f s after the stop:"
                              " killing it", self._name(slot), slot.proc.pid, self._stop_bound(),
                              extra=self._fields(slot, slot.proc.pid))  # fmt: skip
                    slot.proc.kill()

    def _ended(self, slot: _Slot, returncode: int, now: float) -> None:
        assert slot.proc is not None
        pid, slot.proc = slot.proc.pid, None
        status, lived = _exit_status(returncode), now - slot.started_at
        if self._stopping and returncode == -signal.SIGTERM:
            # Killed by the stop's own SIGTERM: it was still starting, before a worker
            # handles signals and so before it claims a job. Nothing was left undone.
            slot.done, slot.status = True, 0
            return
        if self._stopping or (self.burst and status == 0):
            slot.done, slot.status = True, status
            if status != 0:
                log.warning("worker process %s (pid %d) %s", self._name(slot), pid,
                            _describe(returncode),
                            extra=self._fields(slot, pid, status=status))  # fmt: skip
            return
        policy = self.policy
        if lived >= policy.stable_after:
            slot.delay = policy.first_delay
        slot.quick_deaths = slot.quick_deaths + 1 if lived < policy.quick_death else 0
        if slot.quick_deaths >= policy.crash_limit:
            log.error("worker process %s (pid %d) %s %.1f s after its start, %d times in a"
                      " row now: giving up", self._name(slot), pid, _describe(returncode), lived,
                      slot.quick_deaths, extra=self._fields(slot, pid, status=status,
                                                            ran=round(lived, 3)))  # fmt: skip
            slot.done, slot.status = True, status
            self._gave_up = status or 1
            self._stop()
            return
        log.warning("worker process %s (pid %d) %s after %.1f s; starting it again in %.1f s",
                    self._name(slot), pid, _describe(returncode), lived, slot.delay,
                    extra=self._fields(slot, pid, status=status, ran=round(lived, 3),
                                       restart_in=slot.delay))  # fmt: skip
        slot.restart_at = now + slot.delay
        slot.delay = min(slot.delay * 2, policy.max_delay)

    def _name(self, slot: _Slot) -> str:
        return f"{slot.number}/{len(self.slots)}"

    def _fields(self, slot: _Slot, pid: int, **more: object) -> dict[str, object]:
        """A record's structured fields (``ferryq.logs``: the JSON log format shows them)."""
        return {"fields": {"process": slot.number, "processes": len(self.slots), "pid": pid,
                           **more}}  # fmt: skip

    # -- stopping ----------------------------------------------------------------

    def _on_signal(self, sig: signal.Signals) -> None:
        if self._stopping:
            log.warning("%s while stopping: passing it on; the worker processes exit at once",
                        sig.name)  # fmt: skip
            self._send_sigterm()
            return
        log.info("%s: stopping %d worker process(es); running jobs have %.0f s to finish",
                 sig.name, len(self.slots), self.grace)  # fmt: skip
        self._stop()

    def _stop(self) -> None:
        self._stopping = True
        for slot in self.slots:
            if slot.proc is None:  # waiting to be started again: it is not
                slot.done, slot.restart_at = True, None
        self._send_sigterm()
        self._kill_at = self.clock() + self._stop_bound()

    def _send_sigterm(self) -> None:
        """SIGTERM for SIGINT too: a worker takes either as a stop, and a child still
        starting, its handlers not yet in place, then ends quietly (see _ended)."""
        for slot in self.slots:
            if slot.proc is not None and slot.proc.returncode is None:
                slot.proc.send_signal(signal.SIGTERM)

    def _stop_bound(self) -> float:
        return self.grace + max(self.grace, MIN_FINISH_WAIT) + KILL_MARGIN

    def _timeout(self) -> float | None:
        """Seconds until the next restart or kill is due; None: none is."""
        due = [s.restart_at for s in self.slots if s.restart_at is not None]
        if self._kill_at is not None:
            due.append(self._kill_at)
        return max(0.0, min(due) - self.clock()) if due else None


def worker_command(argv: Sequence[str]) -> list[str]:
    """A child's command: ``ferryq`` with this process's arguments, as given, and
    ``--processes=1`` after them (an option given twice takes its last value)."""
    args = list(argv)
    end = args.index("--") if "--" in args else len(args)  # options go before a "--"
    return [sys.executable, "-m", "ferryq", *args[:end], "--processes=1", *args[end:]]


def _exit_status(returncode: int) -> int:
    """A shell's exit status for a child's ``returncode`` (negative: killed by a signal)."""
    return 128 - returncode if returncode < 0 else returncode


def _describe(returncode: int) -> str:
    if returncode < 0:
        return f"was killed by {signal.Signals(-returncode).name}"
    return f"exited with status {returncode}"


def _stop_with_parent() -> Callable[[], None] | None:
    """On Linux, what a new child runs before ``exec`` so that it gets SIGTERM (a
    graceful stop) when the supervisor dies, even by SIGKILL: no orphaned workers."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here, not in the child
    parent = os.getpid()

    def arrange() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the supervisor died before it was arranged
            os._exit(1)

    return arrange


@contextlib.contextmanager
def _signal_pipe(signals: Sequence[signal.Signals]) -> Iterator[int]:
    """While open, each of ``signals`` writes its number to the pipe read by the
    returned fd (Python's wakeup fd), so a ``select`` on it wakes for any of them."""
    read_fd, write_fd = os.pipe()
    for fd in (read_fd, write_fd):
        os.set_blocking(fd, False)
    previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    previous = {sig: signal.signal(sig, _noted) for sig in signals}
    try:
        yield read_fd
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        signal.set_wakeup_fd(previous_fd)
        os.close(read_fd)
        os.close(write_fd)


def _noted(signum: int, frame: object) -> None:
    """A signal's handler: it is read from the wakeup fd."""


def _wait(fd: int, timeout: float | None) -> bytes:
    """The signals that arrived, once one has or ``timeout`` seconds have passed."""
    readable, _, _ = select.select([fd], [], [], timeout)
    if not readable:
        return b""
    with contextlib.suppress(BlockingIOError):
        return os.read(fd, 4096)
    return b""
