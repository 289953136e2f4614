"""``ferryq worker --processes N``: a supervisor process and its real worker processes."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import ferryq
from tests.acceptance.conftest import Workers, fifos, read_fifo
from tests.acceptance.tasks import hold, record
from tests.processes import START_SECONDS, Process, python, wait_until

TARGET = "tests.acceptance.tasks:app"


class Supervisors:
    """Supervisors started through ``workers``; each is killed at the end of the test,
    its children first."""

    def __init__(self, workers: Workers) -> None:
        self.workers = workers
        self.procs: list[Process] = []

    def start(self, *args: str, root_args: tuple[str, ...] = ()) -> Process:
        """A ``ferryq worker`` of ``args``; its stderr holds its children's too."""
        proc = self.workers.worker(*root_args, "worker", TARGET, *args, module="ferryq")
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.procs:
            for child in children(proc.pid):
                _kill(child)
            proc.kill()


@pytest.fixture
def supervisors(workers: Workers) -> Iterator[Supervisors]:
    group = Supervisors(workers)
    yield group
    group.close()


@pytest.fixture
def any_supervisors(any_workers: Workers) -> Iterator[Supervisors]:
    group = Supervisors(any_workers)
    yield group
    group.close()


def children(pid: int) -> set[int]:
    """The live (not zombie) child processes of ``pid``."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:  # gone meanwhile
            continue
        state, ppid = stat.rpartition(")")[2].split()[:2]
        if int(ppid) == pid and state != "Z":
            found.add(int(entry))
    return found


def cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_text().split("\0")[:-1]


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _enqueue_hold(app: ferryq.App, started: Path, go: Path | None) -> ferryq.JobHandle:
    # A lease of 5 s: a ``ferryq worker`` renews it every 1.7 s, and on SQLite a
    # process starting beside it may hold the write lock for a moment.
    return app.enqueue(hold.name, [str(started), None if go is None else str(go)], ttr=5,
                       max_tries=3, retry=ferryq.backoff.fixed(0))  # fmt: skip


def wait_for_workers(app: ferryq.App, supervisor: Process, count: int) -> set[int]:
    """The supervisor's ``count`` children, once each is a worker that has heartbeated
    (a signal then finds its handlers in place)."""

    def running() -> bool:
        pids = children(supervisor.pid)
        return len(pids) == count and {w.pid for w in app.stats().workers} == pids

    wait_until(running, within=START_SECONDS, what=f"{count} worker processes running")
    return children(supervisor.pid)


def test_a_killed_worker_process_is_replaced_and_no_job_is_lost(
    any_supervisors: Supervisors, tmp_path: Path
) -> None:
    url = any_supervisors.workers.url
    app = ferryq.App(url, namespace="procs")
    (started,) = fifos(tmp_path, "started")
    held = _enqueue_hold(app, started, None)  # its first attempt never ends
    # A short lease: jobs the killed process had claimed run again within seconds.
    handles = app.enqueue_many(record.name, [(n,) for n in range(40)], ttr=2)
    supervisor = any_supervisors.start(
        "--processes", "3", "--concurrency", "2", root_args=("--namespace", "procs")
    )
    victim = int(read_fifo(started))
    first = children(supervisor.pid)
    assert victim in first and len(first) == 3
    # Every child runs this command line (the --namespace given included), one process.
    command = [sys.executable, "-m", "ferryq", "--namespace", "procs", "worker", TARGET,
               "--processes", "3", "--concurrency", "2", "--processes=1"]  # fmt: skip
    wait_until(lambda: all(cmdline(child) == command for child in first), within=START_SECONDS,
               what=f"every worker process running {command}")  # fmt: skip
    # Each in a process group of its own: a terminal's Ctrl-C reaches the supervisor alone.
    assert all(os.getpgid(child) == child for child in first)
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: len(children(supervisor.pid) - first) == 1, within=START_SECONDS,
               what="a new worker process in place of the killed one")  # fmt: skip
    assert len(children(supervisor.pid)) == 3
    assert held.result(timeout=60).startswith("attempt 2 by ")
    assert "lease expired" in app.get_job(held.id).errors[0]["message"]
    for handle in handles:
        handle.result(timeout=60)
    assert app.stats().counts["default"]["succeeded"] == 41
    log = supervisor.stderr()
    assert f"(pid {victim}) was killed by SIGKILL after" in log
    assert log.count("starting it again") == 1
    wait_for_workers(app, supervisor, 3)
    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait() == 0, supervisor.describe()
    assert children(supervisor.pid) == set()
    app.close()


def test_sigterm_lets_every_worker_process_finish_its_job_then_exits_0(
    supervisors: Supervisors, tmp_path: Path
) -> None:
    app = ferryq.App(supervisors.workers.url)
    pairs = [fifos(tmp_path, f"started-{n}", f"go-{n}") for n in range(2)]
    handles = [_enqueue_hold(app, started, go) for started, go in pairs]
    # One job a process: no slot or prefetch for a second one.
    supervisor = supervisors.start("--processes", "2", "--concurrency", "1", "--prefetch", "0")
    pids = {int(read_fifo(started)) for started, _ in pairs}
    assert pids == children(supervisor.pid)
    supervisor.send_signal(signal.SIGTERM)
    supervisor.wait_for(lambda log: log.count("SIGTERM: stopping;") == 2)
    for _, go in pairs:
        go.write_text("go\n")
    assert supervisor.wait() == 0, supervisor.describe()
    assert {h.result(timeout=5) for h in handles} == {f"attempt 1 by {pid}" for pid in pids}
    assert "SIGTERM: stopping 2 worker process(es)" in supervisor.stderr()
    app.close()


def test_a_stop_while_the_worker_processes_start_is_clean(supervisors: Supervisors) -> None:
    supervisor = supervisors.start("--processes", "3")
    supervisor.wait_for("worker process 3/3: pid")
    supervisor.send_signal(signal.SIGTERM)  # whether each child is still starting or not
    assert supervisor.wait() == 0, supervisor.describe()


def test_a_second_signal_makes_every_worker_process_exit_at_once(
    supervisors: Supervisors, tmp_path: Path
) -> None:
    app = ferryq.App(supervisors.workers.url)
    (started,) = fifos(tmp_path, "started")
    _enqueue_hold(app, started, None)  # never ends by itself: the grace (30 s) would wait
    supervisor = supervisors.start("--processes", "2")
    read_fifo(started)
    wait_for_workers(app, supervisor, 2)
    supervisor.send_signal(signal.SIGINT)
    # It passes SIGTERM on: a worker takes either as a stop.
    supervisor.wait_for(lambda log: log.count("SIGTERM: stopping;") == 2)
    supervisor.send_signal(signal.SIGINT)
    assert supervisor.wait() == 1, supervisor.describe()  # the children's: "exiting at once"
    log = supervisor.stderr()
    # The idle one stopped at the first; the one running a job exits at the second.
    assert log.count("second SIGTERM: exiting at once") == 1, log
    assert "SIGINT while stopping: passing it on" in log
    app.close()


def test_worker_processes_stop_when_their_supervisor_is_killed(supervisors: Supervisors) -> None:
    app = ferryq.App(supervisors.workers.url)
    supervisor = supervisors.start("--processes", "2")
    pids = wait_for_workers(app, supervisor, 2)
    supervisor.kill()
    supervisor.wait()

    def gone(pid: int) -> bool:
        """Exited: a zombie whose every thread has ended (a leader whose other threads
        still run shows as a zombie too), or reaped."""
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
            return state == "Z" and len(os.listdir(f"/proc/{pid}/task")) <= 1
        except FileNotFoundError:
            return True

    wait_until(lambda: all(gone(pid) for pid in pids), within=START_SECONDS,
               what="the worker processes stopped")  # fmt: skip
    # A graceful stop, not a kill: each says so (its last lines may still be on their
    # way from its log thread as its first thread ends).
    wait_until(lambda: supervisor.stderr().count("SIGTERM: stopping;") == 2,
               within=START_SECONDS, what="both workers stopping on SIGTERM")  # fmt: skip
    assert app.stats().workers == []  # each said goodbye
    app.close()


def test_a_worker_hearing_its_parent_die_twice_still_stops_gracefully(
    workers: Workers, tmp_path: Path
) -> None:
    # A supervisor with a second thread that dies makes Linux send each child its
    # parent-death SIGTERM twice: as the child passes to the other thread, then to init.
    app = ferryq.App(workers.url)
    started, go = fifos(tmp_path, "started", "go")
    _enqueue_hold(app, started, go)
    # The parent starts the worker from a thread of its own and prints its pid; the
    # worker writes to the parent's stderr.
    argv = python("tests.acceptance.parent_of_two_threads", *python("ferryq", "worker", TARGET))
    parent = workers.start(argv, name="parent", stdin=True)
    child = int(parent.wait_for(lambda out: out.endswith("\n"), stream="stdout"))
    try:
        assert int(read_fifo(started)) == child  # running a job: its handlers are in place
        parent.stdin.write(b"1\n")  # the first parent-death signal
        parent.stdin.flush()
        parent.wait_for("SIGTERM: stopping")
        parent.stdin.write(b"2\n")  # the second, while the job still runs
        parent.stdin.flush()
        assert parent.wait() == 0, parent.describe()
        # The worker, the parent gone, still writes to the parent's stderr.
        wait_until(lambda: "SIGTERM again after the parent process" in parent.stderr()
                   or "exiting at once" in parent.stderr(), within=START_SECONDS,
                   what="the worker hearing the second signal")  # fmt: skip
        assert "exiting at once" not in parent.stderr(), parent.stderr()
        with open(go, "w") as fifo:  # the job ends; the worker stops as it should
            fifo.write("go\n")
        wait_until(lambda: not Path(f"/proc/{child}").exists()
                   or Path(f"/proc/{child}/stat").read_text().rpartition(")")[2].split()[0]
                   == "Z", within=START_SECONDS, what="the worker stopping")  # fmt: skip
        text = parent.stderr()
        assert "stopped after" in text and "0 unwritten" in text, text
        assert app.stats().workers == []  # it said goodbye
    finally:
        _kill(child)
        app.close()


def test_a_worker_process_that_will_not_stop_is_killed_after_the_grace_and_a_margin(
    supervisors: Supervisors,
) -> None:
    app = ferryq.App(supervisors.workers.url)
    supervisor = supervisors.start("--processes", "2", "--grace", "1")
    frozen, other = sorted(wait_for_workers(app, supervisor, 2))
    os.kill(frozen, signal.SIGSTOP)  # deaf to SIGTERM until killed
    began = time.monotonic()
    supervisor.send_signal(signal.SIGTERM)
    # grace 1 s, then up to 5 s for a child's own writes, then a margin of 5 s
    assert supervisor.wait() == 128 + signal.SIGKILL, supervisor.describe()
    assert time.monotonic() - began >= 11
    log = supervisor.stderr()
    assert f"(pid {frozen}) still running 11 s after the stop: killing it" in log
    assert f"(pid {other})" not in log.split("SIGTERM: stopping 2")[1]  # it stopped cleanly
    app.close()


def test_worker_processes_that_die_at_start_make_it_give_up(
    supervisors: Supervisors, tmp_path: Path
) -> None:
    # The supervisor never opens the database; each child fails to, and exits 2.
    url = f"sqlite:///{tmp_path}/no-such-folder/ferryq.db"
    began = time.monotonic()
    supervisor = supervisors.start("--processes", "2", root_args=("--url", url))
    # Five starts of each process and 15.5 s of pauses: a hang's bound, not a speed.
    assert supervisor.wait(timeout=240) == 2, supervisor.describe()
    took = time.monotonic() - began
    log = supervisor.stderr()
    assert log.count("giving up") == 1
    assert "exited with status 2" in log.split("giving up")[0].splitlines()[-1]
    # Pauses of 0.5, 1, 2 and 4 s between the five starts of a process: no tight loop.
    for pause in ("0.5", "1.0", "2.0", "4.0"):
        assert log.count(f"starting it again in {pause} s") in (1, 2), log
    assert log.count("starting it again") <= 8
    assert log.count("does not exist") <= 10
    assert took >= 7.5


def test_a_target_that_does_not_import_fails_once_and_at_once(workers: Workers) -> None:
    worker = workers.worker("worker", "tests.no_such_module:app", "--processes", "3",
                            module="ferryq")  # fmt: skip
    assert worker.wait() == 2, worker.describe()
    assert worker.stderr().count("cannot import module 'tests.no_such_module'") == 1
    assert "worker process" not in worker.stderr()
    assert not Path(workers.url.removeprefix("sqlite:///")).exists()


def test_burst_processes_drain_the_queue_then_the_supervisor_exits_0(
    supervisors: Supervisors,
) -> None:
    app = ferryq.App(supervisors.workers.url)
    handles = app.enqueue_many(record.name, [(n,) for n in range(200)])
    supervisor = supervisors.start("--processes", "3", "--burst")
    assert supervisor.wait() == 0, supervisor.describe()
    assert [h.result(timeout=5) for h in handles] == list(range(200))
    assert "starting it again" not in supervisor.stderr()
    app.close()
