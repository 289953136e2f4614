"""Rates per lane across worker processes: 3 workers, 20 lanes of 200 jobs each, every
lane limited to 5 starts in any second (and to 5 running at once, so several of a
lane's jobs are ready together and the workers compete for them).

Proved: in no window of one second did a lane start more than 5 jobs, exactly, by the
claim times the database recorded (the rule's clock); by the handlers' own timestamps,
which come a little after their claims (a process and a thread away), no more than 5
in any window shortened by the jitter allowed. Each lane starts in id order. And the
rate is used: the jobs start at no less than 90% of the sum of the rates.
"""

from __future__ import annotations

import bisect
import time
from collections import defaultdict

import pytest

import ferryq
from tests.acceptance.conftest import Workers
from tests.acceptance.rate_app import call

PROCESSES = 3
LANES = 20
JOBS = 200  # per lane
RATE = 5  # starts per PER seconds, per lane
PER = 1.0
LIMIT = 5
#: How late a handler's own timestamp may come after its claim, as the bound on the
#: handlers' timestamps allows: the window they are checked in is this much shorter.
JITTER = 0.25
#: A claim's time is taken before it waits for its turn at the database, so a claim
#: made after another, in another process, may carry an earlier time: by this much at
#: most, here (the lanes chaos test allows as much, for the same reason).
SKEW = 0.5
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
    claimed: dict[str, list[float]] = defaultdict(list)
    order: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for job in jobs:
        assert job.lane is not None and job.claimed_at is not None
        claimed[job.lane].append(job.claimed_at)
        order[job.lane].append((job.claimed_at, job.id))
    handled: dict[str, list[float]] = defaultdict(list)
    for line in workers.log_lines():
        _, _job_id, name, at = line.split()
        handled[name].append(float(at))
    assert sum(map(len, handled.values())) == LANES * JOBS
    inverted = 0.0
    for lane in claimed:
        assert most_in_any_window(claimed[lane], PER) <= RATE, lane
        assert most_in_any_window(handled[lane], PER - JITTER) <= RATE, lane
        # Id order, as far as claim times across processes tell (see SKEW).
        latest = 0.0
        for claimed_at, _ in sorted(order[lane], key=lambda claim: claim[1]):
            inverted = max(inverted, latest - claimed_at)
            latest = max(latest, claimed_at)
    assert inverted <= SKEW, f"a lane's job was claimed {inverted:.3f} s before one ahead of it"
    # The rate is used: a lane's starts after its first window's, over the time they
    # took, against the rate (the ideal span is (JOBS - RATE) / RATE * PER seconds).
    achieved = sum((JOBS - RATE) / (max(times) - min(times)) for times in claimed.values())
    print(
        f"\n{LANES} lanes at {RATE}/{PER:g}s: {achieved:.1f} starts/s of "
        f"{LANES * RATE / PER:g}; claim times inverted by {inverted * 1000:.1f} ms at most"
    )
    assert achieved >= 0.9 * LANES * RATE / PER
