"""Real worker processes killed and frozen mid-job."""

from __future__ import annotations

import os
import signal
import sqlite3
from pathlib import Path
from urllib.parse import urlsplit

import ferryq
from ferryq.worker.leases import EXIT_STUCK
from tests.acceptance.conftest import Workers, fifos, read_fifo
from tests.acceptance.tasks import hold, two_stages
from tests.pg import PgCluster, drop_database
from tests.processes import Process


def _enqueue_hold(app: ferryq.App, started: str, go: str | None) -> ferryq.JobHandle:
    retry = ferryq.backoff.fixed(0)
    return app.enqueue(hold.name, [started, go], ttr=1, max_tries=3, retry=retry)


def test_a_job_whose_worker_is_killed_runs_again_elsewhere(
    workers: Workers, tmp_path: Path
) -> None:
    app = ferryq.App(workers.url)
    (started,) = fifos(tmp_path, "started")
    handle = _enqueue_hold(app, str(started), None)
    victim = workers.worker()
    pid = int(read_fifo(started))
    assert pid == victim.pid
    victim.kill()
    workers.worker()
    assert handle.result(timeout=30).startswith("attempt 2 by ")
    job = app.get_job(handle.id)
    assert job.attempts == 2 and job.fence == 2
    assert "lease expired" in job.errors[0]["message"]
    app.close()


def _freeze_outside_a_write(proc: Process, db: str) -> None:
    """SIGSTOP ``proc`` at a moment it holds no write lock on the SQLite file ``db``.

    SQLite's write lock belongs to the file: a process frozen inside a write stops
    every other writer until it runs again, and no lease can help (see "Leases and
    time-to-run" in docs/guarantees.md). This is about a worker frozen mid-job, not mid-write."""
    probe = sqlite3.connect(db, isolation_level=None, timeout=0)
    try:
        for _ in range(100):
            proc.send_signal(signal.SIGSTOP)
            os.waitpid(proc.pid, os.WUNTRACED)  # stopped now, not merely signalled
            try:
                probe.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError:  # database is locked: frozen mid-write
                proc.send_signal(signal.SIGCONT)
                continue
            probe.execute("ROLLBACK")
            return
        raise AssertionError("the worker was inside a write at every try")
    finally:
        probe.close()


def test_a_frozen_worker_cannot_overwrite_the_newer_attempt(
    workers: Workers, tmp_path: Path
) -> None:
    app = ferryq.App(workers.url)
    started, go = fifos(tmp_path, "started", "go")
    handle = _enqueue_hold(app, str(started), str(go))
    frozen = workers.worker()
    assert int(read_fifo(started)) == frozen.pid
    _freeze_outside_a_write(frozen, workers.url.removeprefix("sqlite:///"))
    rescuer = workers.worker()
    result = handle.result(timeout=30)
    assert result == f"attempt 2 by {rescuer.pid}"
    frozen.send_signal(signal.SIGCONT)
    # Awake, it finds its lease long passed, and its handler deaf to interruption
    # (blocked opening a FIFO, in C): it exits rather than run beside the newer attempt.
    assert frozen.wait() == EXIT_STUCK, frozen.describe()
    assert "did not stop when asked" in frozen.stderr()
    job = app.get_job(handle.id)
    assert job.state == "succeeded" and job.result == result and job.fence == 2
    app.close()


def test_a_worker_killed_in_stage_two_reruns_stage_two_only(
    any_workers: Workers, tmp_path: Path
) -> None:
    app = ferryq.App(any_workers.url)
    (started,) = fifos(tmp_path, "started")
    # This App has no tasks registered: the task's options go with the enqueue.
    handle = app.enqueue(two_stages.name, [str(started)], ttr=1, max_tries=3,
                         retry=ferryq.backoff.fixed(0))  # fmt: skip
    victim = any_workers.worker()
    assert int(read_fifo(started)) == victim.pid  # stage one done, stage two running
    victim.kill()
    rescuer = any_workers.worker()
    assert handle.result(timeout=30) == {"one_by": victim.pid, "two_by": rescuer.pid}
    runs = sorted(line.split()[1:3] for line in any_workers.log_lines())
    assert runs == [["stage=None", "attempt=1"], ["stage=two", "attempt=1"],
                    ["stage=two", "attempt=2"]]  # fmt: skip
    job = app.get_job(handle.id)
    assert [(s["stage"], s["outcome"], s["attempts"]) for s in job.stages] == [
        (None, "next", 1), ("two", "succeeded", 2),
    ]  # fmt: skip
    assert "lease expired" in job.errors[0]["message"] and job.errors[0]["stage"] == "two"
    app.close()


def test_a_worker_whose_database_went_away_still_stops_on_sigterm(
    pg_workers: Workers, pg_cluster: PgCluster, tmp_path: Path
) -> None:
    worker, job_id, go = _worker_holding_a_job(pg_workers, tmp_path)
    drop_database(pg_cluster.url, urlsplit(pg_workers.url).path.lstrip("/"))
    _end_the_job_and_stop(worker, go)  # the job's outcome has nowhere to go
    _check_it_gave_the_outcome_up(worker, job_id)


def test_a_worker_whose_sqlite_file_stays_locked_still_stops_on_sigterm(
    workers: Workers, tmp_path: Path
) -> None:
    worker, job_id, go = _worker_holding_a_job(workers, tmp_path)
    # Another connection takes the write lock and keeps it, longer than any wait.
    locker = sqlite3.connect(workers.url.removeprefix("sqlite:///"), isolation_level=None)
    locker.execute("BEGIN IMMEDIATE")
    try:
        _end_the_job_and_stop(worker, go)
        _check_it_gave_the_outcome_up(worker, job_id)
    finally:
        locker.execute("ROLLBACK")
        locker.close()


def _worker_holding_a_job(workers: Workers, tmp_path: Path) -> tuple[Process, int, Path]:
    """A ``ferryq worker`` (grace 1 s) running a job that ends when ``go`` is written."""
    app = ferryq.App(workers.url)
    started, go = fifos(tmp_path, "started", "go")
    handle = _enqueue_hold(app, str(started), str(go))
    app.close()
    worker = workers.worker("worker", "tests.acceptance.tasks:app", "--grace", "1",
                            module="ferryq")  # fmt: skip
    assert int(read_fifo(started)) == worker.pid
    return worker, handle.id, go


def _end_the_job_and_stop(worker: Process, go: Path) -> None:
    with open(go, "w") as fifo:
        fifo.write("go\n")
    worker.send_signal(signal.SIGTERM)


def _check_it_gave_the_outcome_up(worker: Process, job_id: int) -> None:
    """It gives the write up after the bound (the grace period, 5 s at least) and says so."""
    assert worker.wait() == 1, worker.describe()
    log = worker.stderr()
    assert f"stopping without writing the outcome of 1 attempt(s), jobs {job_id}:" in log
    assert "Error: the outcome of 1 attempt(s) could not be written" in log


def test_a_second_signal_exits_at_once(workers: Workers, tmp_path: Path) -> None:
    # The first SIGTERM waits for the running job (grace 30 s); the second does not.
    app = ferryq.App(workers.url)
    (started,) = fifos(tmp_path, "started")
    _enqueue_hold(app, str(started), None)  # never ends by itself
    worker = workers.worker()
    assert int(read_fifo(started)) == worker.pid
    worker.send_signal(signal.SIGTERM)
    worker.wait_for("SIGTERM: stopping")
    worker.send_signal(signal.SIGTERM)
    assert worker.wait() == 1, worker.describe()
    assert "second SIGTERM: exiting at once" in worker.stderr()
    app.close()
