"""Rates per lane across worker processes: 3 workers, 20 lanes of 50 jobs each, every
lane limited to 5 starts in any second (and to 5 running at once, so several of a
lane's jobs are ready together and the workers compete for them).

Proved, by the claim times the database recorded (the rule's clock: docs/guarantees.md,
Rates per lane): in no window of one second did a lane start more than 5 jobs, exactly,
and every lane did start 5 in some window (the gate was met, not merely never reached).
Each lane's jobs are claimed in id order (tests/acceptance/lane_order.py: from the
claims the database records and the starts the handlers log, no clock slack).

How fast the rate is used (starts a second against the sum of the rates) is a figure,
not a promise: bench/rates.py measures it. 50 jobs a lane are ten windows of a lane
filled by three competing processes; 200 made forty of the same, for four times the
wall clock.
"""

from __future__ import annotations

import bisect
import time
from collections import defaultdict

import pytest

import ferryq
from tests.acceptance.conftest import Workers
from tests.acceptance.lane_order import assert_claimed_in_id_order
from tests.acceptance.rate_app import call

PROCESSES = 3
LANES = 20
JOBS = 50  # per lane
RATE = 5  # starts per PER seconds, per lane
PER = 1.0
LIMIT = 5
DRAIN_TIMEOUT = 120.0


def most_in_any_window(times: list[float], per: float) -> int:
    """The most of ``times`` in any half-open window of ``per`` seconds."""
    ordered = sorted(times)
    return max(bisect.bisect_left(ordered, t + per) - i for i, t in enumerate(ordered))


@pytest.mark.slow
async def test_lanes_start_no_more_than_their_rate_across_worker_processes(
    any_workers: Workers,
) -> None:
    workers = any_workers
    app = ferryq.App(workers.url)
    try:
        await app.set_lane_limit_async("api:*", LIMIT)
        await app.set_lane_rate_async("api:*", RATE, per=PER)
        task = app.task(name=call.name, max_tries=1)(call.fn)
        for number in range(LANES):
            await task.options(lane=f"api:{number}").enqueue_many_async([()] * JOBS)
        for _ in range(PROCESSES):
            workers.worker("--concurrency", "8", module="tests.acceptance.rate_app")
        store = await app.store()
        deadline = time.monotonic() + DRAIN_TIMEOUT
        while True:
            counts = await store.job_counts(app.namespace)
            done = sum(n for (_, _, state), n in counts.items() if state == "succeeded")
            if done == LANES * JOBS:
                break
            assert time.monotonic() < deadline, f"{done} of {LANES * JOBS} jobs ran in time"
            await store.wait_for_finish(0.5, 0.1)
        jobs = await app.list_jobs_async(state="succeeded", limit=LANES * JOBS)
    finally:
        await app.aclose()
    assert len(jobs) == LANES * JOBS and all(job.attempts == 1 for job in jobs)
    started = {int(job_id): float(at) for _, job_id, _, at in map(str.split, workers.log_lines())}
    assert len(started) == LANES * JOBS
    lanes: dict[str, list[ferryq.Job]] = defaultdict(list)
    for job in jobs:
        assert job.lane is not None and job.claimed_at is not None
        lanes[job.lane].append(job)
    for lane, members in lanes.items():
        claimed = [job.claimed_at for job in members if job.claimed_at is not None]
        assert most_in_any_window(claimed, PER) == RATE, (lane, sorted(claimed))
        assert_claimed_in_id_order(lane, members, started)
