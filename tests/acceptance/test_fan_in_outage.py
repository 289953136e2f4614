"""Dependencies and rates while the database fails under running workers.

Three worker processes run a fan-in (MEMBERS jobs and a callback that gets their
results) beside lanes with a rate (LANES lanes of LANE_JOBS jobs, 5 starts a second
each, limit 3). Mid-run the database goes out of reach for OUTAGE seconds: SQLite's
write lock held by another process, or PostgreSQL stopped.

Proved: the callback runs once, after every member, with every result; every job
succeeds; no lane started more than its rate in any second (the claim times in the
database), across the outage too; no worker died, each stops cleanly, none logged a
traceback.
"""

from __future__ import annotations

import bisect
import time
from collections import defaultdict

import pytest

import ferryq
from tests.acceptance.conftest import Workers, write_lock
from tests.acceptance.fan_in_app import MAX_TRIES, TTR, album, member
from tests.pg import LocalCluster, PgCluster
from tests.processes import wait_until

MEMBERS = 150
LANES = 3
LANE_JOBS = 15
RATE = 5  # starts per second, per lane
OUTAGE = 5.0
PROCESSES = 3


def most_in_any_window(times: list[float], per: float) -> int:
    ordered = sorted(times)
    return max(bisect.bisect_left(ordered, t + per) - i for i, t in enumerate(ordered))


def _enqueue(url: str) -> tuple[list[int], int, list[int]]:
    """The members, the callback and the lanes' jobs: their ids."""
    app = ferryq.App(url)
    try:
        member_task = app.task(name=member.name, ttr=TTR, max_tries=MAX_TRIES)(member.fn)
        callback_task = app.task(name=album.name, ttr=TTR, max_tries=MAX_TRIES)(album.fn)
        app.set_lane_limit("rated:*", 3)
        app.set_lane_rate("rated:*", RATE, per=1)
        group = ferryq.group(member_task, [(n,) for n in range(MEMBERS)])
        callback = group.then(callback_task)
        lane_jobs = [
            handle.id
            for lane in range(LANES)
            for handle in member_task.options(lane=f"rated:{lane}").enqueue_many(
                [(n,) for n in range(LANE_JOBS)]
            )
        ]
        return [m.id for m in group.members], callback.id, lane_jobs
    finally:
        app.close()


def _succeeded(app: ferryq.App) -> int:
    return sum(states.get("succeeded", 0) for states in app.stats().counts.values())


def _all_started(app: ferryq.App, workers: Workers) -> bool:
    """Every worker process has opened the database and registered (its heartbeat)."""
    return {w.pid for w in app.stats().workers} >= {proc.pid for proc in workers.started}


def _outage(workers: Workers, cluster: PgCluster | None) -> None:
    if cluster is None:
        with write_lock(workers.url.removeprefix("sqlite:///")):
            time.sleep(OUTAGE)  # the lock held
        return
    cluster.stop()
    try:
        time.sleep(OUTAGE)  # the server down
    finally:
        cluster.start()


@pytest.mark.slow
def test_a_fan_in_and_rated_lanes_ride_out_the_database_going_away(
    any_workers: Workers, request: pytest.FixtureRequest
) -> None:
    workers = any_workers
    cluster: PgCluster | None = None
    if workers.url.startswith("postgresql"):
        cluster = request.getfixturevalue("pg_cluster")
        if not isinstance(cluster, LocalCluster):
            pytest.skip("needs the suite's own PostgreSQL, to stop and start it")
    members, callback_id, lane_jobs = _enqueue(workers.url)
    for _ in range(PROCESSES):
        workers.worker("--concurrency", "8", module="tests.acceptance.fan_in_app")
    watching = ferryq.App(workers.url)
    try:
        # Every worker must be running before the database goes: one still starting
        # finds the server down and exits, as it should (docs/operations.md, Errors at
        # start). Thirty jobs alone can be one worker's while the others still import.
        wait_until(lambda: _all_started(watching, workers), within=60, what="workers started")
        wait_until(lambda: _succeeded(watching) >= 30, within=60, what="30 jobs run")
    finally:
        watching.close()  # its pooled connections would die with the server
    _outage(workers, cluster)

    app = ferryq.App(workers.url)
    try:
        expected = sum(n * n for n in range(MEMBERS))
        assert app.portal_call(app.result_async(callback_id, timeout=120)) == expected
        for job_id in lane_jobs:
            app.portal_call(app.result_async(job_id, timeout=60))
        jobs = {job_id: app.get_job(job_id) for job_id in [*members, *lane_jobs, callback_id]}
    finally:
        app.close()
    assert all(job.state == "succeeded" for job in jobs.values())
    last_member = max(jobs[m].finished_at or 0.0 for m in members)
    (line,) = workers.log_lines()  # the callback started once...
    _, logged_id, _attempt, _fence, count, summed, started = line.split()
    assert (int(logged_id), int(count), int(summed)) == (callback_id, MEMBERS, expected)
    assert float(started) >= last_member  # ...after every member had ended
    claimed: dict[str, list[float]] = defaultdict(list)
    for job_id in lane_jobs:
        job = jobs[job_id]
        assert job.lane is not None and job.claimed_at is not None
        claimed[job.lane].append(job.claimed_at)
    for lane, times in claimed.items():
        assert most_in_any_window(times, 1.0) <= RATE, (lane, sorted(times))
    for proc in workers.started:
        assert proc.running(), f"a worker died: {proc.describe()}"
    for proc in workers.started:
        assert proc.stop() == 0, proc.describe()
        assert "Traceback" not in proc.stderr(), proc.describe()
