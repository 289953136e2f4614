"""The database fails under running workers: stopped, locked, out of connections, or
out of reach while the pooler in front of it is down.

Each test runs real worker processes whose handlers log every attempt (job, fence,
pid, start, end), and checks what a job queue promises whatever the database does:
no two attempts of one job overlap in time, every job ends, no worker dies, and each
fault is logged once per episode rather than once per retry.

What an outage proves depends on its length against the lease (ttr): longer than a
lease, every lease held at the cut lapses during it, so no attempt may run on from a
lapsed lease, and the faults go on long enough for several retries of every duty (at
most one second apart). So each outage is a number of leases, as it was (20 s, 15 s
and 10 s against a ttr of 3 s), at a ttr of 2 s: 6.5, 5 and 3.5 leases, the same
episodes in two thirds of the time. The jobs that span the outage do it on their
first attempt; their retries after it are ordinary jobs, short ones, whose length
proved nothing.
"""

from __future__ import annotations

import contextlib
import itertools
import re
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import psycopg
import pytest

import ferryq
from ferryq.worker.leases import EXIT_STUCK
from tests.acceptance.conftest import Workers, write_lock
from tests.acceptance.tasks import stuck, work, work_async
from tests.pg import LocalCluster, PgCluster
from tests.pgbouncer import Bouncer
from tests.processes import START_SECONDS, wait_until

JOBS = 120
LONG = 6
TTR = 2.0
STOPPED = 6.5 * TTR  # PostgreSQL stopped
LOCKED = 5 * TTR  # SQLite's write lock held by another process
NO_CONNECTIONS = 3.5 * TTR  # every connection PostgreSQL allows taken
RETRY = ferryq.backoff.fixed(0)
WORKERS = 3


@dataclass(frozen=True, slots=True)
class Run:
    job: int
    fence: int
    pid: int
    start: float
    end: float
    outcome: str


def runs(workers: Workers) -> list[Run]:
    found = []
    for line in workers.log_lines():
        if line.startswith("attempt "):
            _, job, fence, pid, start, end, outcome = line.split()
            found.append(Run(int(job), int(fence), int(pid), float(start), float(end), outcome))
    return found


def assert_no_overlap(all_runs: list[Run]) -> None:
    by_job: dict[int, list[Run]] = defaultdict(list)
    for run in all_runs:
        by_job[run.job].append(run)
    overlaps = []
    for job_runs in by_job.values():
        job_runs.sort(key=lambda r: r.start)
        overlaps += [(a, b) for a, b in itertools.pairwise(job_runs) if b.start < a.end]
    assert not overlaps, f"attempts of one job ran at the same time: {overlaps[:5]}"


def assert_stopped_within_lease(all_runs: list[Run], cut_at: float, back_at: float) -> None:
    """Cut off from ``cut_at`` to ``back_at``, no worker can renew a lease: none of its
    leases lasts past ``cut_at + TTR``, so from then until the database is back no
    attempt may run, neither one begun before (not stopped) nor one begun late (a
    prefetched job started on a lapsed lease)."""
    lapsed = cut_at + TTR
    late = [r for r in all_runs if r.end > lapsed and r.start < back_at]
    assert not late, f"attempts ran on a lease that had passed: {late[:5]}"


def rerun_after_done(all_runs: list[Run]) -> list[int]:
    """Jobs that ran again although an attempt had finished its handler."""
    done: dict[int, float] = {}
    for run in sorted(all_runs, key=lambda r: r.start):
        if run.outcome == "done":
            done.setdefault(run.job, run.end)
    return sorted({r.job for r in all_runs if r.job in done and r.start > done[r.job]})


def enqueue(app: ferryq.App, outage: float) -> list[ferryq.JobHandle]:
    """Jobs of 0.2-0.6 s, sync and async, more than the workers' slots can hold, and
    among the first of them (one in five, so that each worker's first claim gets
    some) LONG whose first attempt outlasts the outage: their leases lapse while they
    run. Their retries take 0.2 s."""
    handles = []
    for n in range(JOBS):
        task = work if n % 2 else work_async
        args = [outage + TTR, 0.2] if n % 5 == 0 and n < 5 * LONG else [0.2 + (n % 5) / 10]
        handles.append(app.enqueue(task.name, args, ttr=TTR, max_tries=20, retry=RETRY))
    return handles


def start_workers(workers: Workers, count: int = WORKERS) -> None:
    """Workers with the default heartbeat and maintenance periods."""
    for _ in range(count):
        workers.worker("--concurrency", "4", "--defaults")


def settle(workers: Workers, app: ferryq.App, handles: list[ferryq.JobHandle]) -> list[Run]:
    """Every job succeeds, every worker still runs and stops cleanly; the runs."""
    for handle in handles:
        assert handle.result(timeout=120) == "done"
    for proc in workers.started:
        assert proc.running(), f"a worker died: {proc.describe()}"
    for proc in workers.started:
        assert proc.stop() == 0, proc.describe()
        log = proc.stderr()
        assert "Traceback" not in log, log
        # Once per episode and duty (claims, heartbeat, completions, maintenance…),
        # not once per retry.
        assert log.count(" failed: ") <= 12, log
    all_runs = runs(workers)
    assert_no_overlap(all_runs)
    return all_runs


def wait_for_attempts(workers: Workers, count: int) -> None:
    wait_until(lambda: len(runs(workers)) >= count, within=60, what=f"{count} attempts")


def cut_off_for_six_leases(
    workers: Workers, cut: Callable[[], None], restore: Callable[[], None]
) -> None:
    """Jobs under running workers, then ``cut()`` the database off from them for STOPPED
    seconds and ``restore()`` it: every job ends, no attempt outlives its lease, no job
    that finished meanwhile runs again."""
    app = ferryq.App(workers.url)
    handles = enqueue(app, outage=STOPPED)
    app.close()  # its pooled connections would die with the way to the server
    start_workers(workers)
    wait_for_attempts(workers, 20)
    cut()
    cut_at = time.time()
    try:
        time.sleep(STOPPED)  # the outage itself
    finally:
        back_at = time.time()
        restore()
    app = ferryq.App(workers.url)
    all_runs = settle(workers, app, handles)
    assert_stopped_within_lease(all_runs, cut_at, back_at)
    assert not rerun_after_done(all_runs), "jobs that finished during the outage ran again"
    app.close()


def test_postgres_stopped_mid_run_for_longer_than_six_leases(
    pg_workers: Workers, pg_cluster: PgCluster
) -> None:
    if not isinstance(pg_cluster, LocalCluster):
        pytest.skip("needs the suite's own PostgreSQL, to stop and start it")
    cut_off_for_six_leases(pg_workers, pg_cluster.stop, pg_cluster.start)


def test_the_pooler_killed_mid_run_and_started_again_after_six_leases(
    pooled_workers: Workers, pgbouncer: Bouncer
) -> None:
    """Through a transaction pooler, the pooler is what goes away (SIGKILL: every
    client's connection and every server connection it held end at once) and comes
    back on its port: the same promises as a server stopped."""
    cut_off_for_six_leases(pooled_workers, pgbouncer.kill, pgbouncer.start)


def test_sqlite_write_lock_held_for_five_leases_by_another_process(workers: Workers) -> None:
    app = ferryq.App(workers.url)
    handles = enqueue(app, outage=LOCKED)
    start_workers(workers)
    wait_for_attempts(workers, 20)
    with write_lock(workers.url.removeprefix("sqlite:///")):
        cut_at = time.time()
        time.sleep(LOCKED)  # the lock held
        back_at = time.time()
    all_runs = settle(workers, app, handles)
    assert_stopped_within_lease(all_runs, cut_at, back_at)
    assert not rerun_after_done(all_runs), "jobs that finished during the lock ran again"
    app.close()


def test_postgres_out_of_connections_under_5_workers(pg_workers: Workers) -> None:
    app = ferryq.App(pg_workers.url)
    handles = enqueue(app, outage=NO_CONNECTIONS)
    start_workers(pg_workers, 5)
    wait_for_attempts(pg_workers, 20)
    with _all_connections(pg_workers.url) as held:
        # Their connections end too, so every worker must connect again: refused.
        held[0].execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = 'ferryq' AND pid <> pg_backend_pid()"
        )
        held += _take_all(pg_workers.url)
        time.sleep(NO_CONNECTIONS)  # the connections kept out of reach
    settle(pg_workers, app, handles)
    app.close()


def _take_all(url: str) -> list[psycopg.Connection[tuple[object, ...]]]:
    held = []
    while True:
        try:
            held.append(psycopg.connect(url, autocommit=True))
        except psycopg.OperationalError as exc:
            assert "too many" in str(exc) or "reserved" in str(exc), exc
            return held


@contextlib.contextmanager
def _all_connections(url: str) -> Iterator[list[psycopg.Connection[tuple[object, ...]]]]:
    held = _take_all(url)
    assert held, "not even one connection"
    try:
        yield held
    finally:
        for conn in held:
            conn.close()


def test_a_worker_that_cannot_stop_an_attempt_exits_before_its_lease_passes(
    workers: Workers,
) -> None:
    app = ferryq.App(workers.url)
    app.enqueue(stuck.name, [3600], ttr=2, max_tries=1)
    proc = workers.worker("--defaults")
    wait_until(lambda: any(line.startswith("started ") for line in workers.log_lines()),
               within=START_SECONDS, what="the attempt started")  # fmt: skip
    with write_lock(workers.url.removeprefix("sqlite:///")):
        # Its handler sits in time.sleep(3600), where no interruption reaches it, and
        # the lease cannot be renewed: the worker exits rather than let the lease pass
        # while the handler still runs.
        assert proc.wait() == EXIT_STUCK, proc.describe()
    # Before the lease passed, by the worker's clock, the one leases are kept by (the
    # test's own view of the exit comes a scheduling delay late).
    said = re.search(r"did not stop when asked and its lease passes in (-?[\d.]+) s", proc.stderr())
    assert said is not None and float(said[1]) >= 0, proc.describe()
    app.close()
