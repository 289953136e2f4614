"""Lanes under chaos: real worker processes SIGKILLed and restarted while 300 lanes drain.

Three worker processes (8 slots each) run JOBS short jobs spread over 300 lanes: lanes
``l1:<n>`` follow the default limit 1 (also set as the rule ``l1:*``), lanes ``l3:<n>``
the rule ``l3:*`` with limit 3. Jobs sleep 0 to 5 ms; one in ten fails its first attempt
on purpose and is retried 50 ms later. While they run, workers are SIGKILLed at random
moments (random points of progress, from a seeded RNG; set FERRYQ_CHAOS_SEED to replay
a run) and restarted at once; the task's ttr is 1.5 s, so a killed attempt is recovered
by lease expiry within about two seconds. Every attempt logs a start line and an end
line (tests/acceptance/lanes_app.py), ``stopped`` if its worker cancelled it (a lease it
could not renew in time on a busy machine); an attempt whose worker was killed has no
end.

When every job is terminal the test proves, from the logs and the database (read,
and checked lane by lane for 2 to 4, by tests/acceptance/lane_checks.py):

1. Nothing lost: all JOBS ids are stored and terminal (succeeded, or dead when kills and
   the planned failure used up its tries), every succeeded job has an ``ok`` end logged
   under the fence the database kept, and every attempt without an end belongs to a
   killed worker.
2. Limit 1: no job of an ``l1`` lane first started before its predecessor (by id) was
   terminal; the predecessor's ``finished_at`` from the database is the bound, which is
   later than anything its handler logged.
3. Limits: at no moment more than the lane's limit of attempts running. A killed attempt
   has no end line. Its handler stopped when the process died, but for the queue it was
   running until its lease expired, and after that the job waited for its retry, still
   holding its place in the lane (docs/guarantees.md, Lanes: a job waiting for its
   retry keeps its place). So it is counted as running until the job's next logged
   start (a later claim; if that claim was killed before logging too, the next one
   after it, which only lengthens the interval), or the job's ``finished_at`` when it
   has no later attempt (dead after lease expiry). Those bounds are never too early:
   the interval we use contains the true one. Then the stricter form is checked too: a
   job holds a place in its lane from its first logged start until its
   ``finished_at``, retries included, and no more than ``limit`` such spans overlap.
4. Claim order is id order, whatever the limit: what the lane promises is the order of
   claims, not of handler starts, which a kill between a claim and its start puts off.
   Read from the claims the database records and the logged starts, with no clock
   slack: see tests/acceptance/lane_order.py, whose check is tried below on made-up
   runs (a kill between claim and start passes, an inversion fails). The claim order
   is also checked exactly, path by path, by tests/conformance/test_lanes_model.py.

The kills make the chaos, not the count of jobs: each kill finds the victim's slots
full and its prefetched claims pending, however long the backlog, and a longer backlog
only repeats the drain between kills. So JOBS is 6,000 (20 a lane, each lane still
enqueued in ROUNDS batches while the workers claim); 30,000 took 85 s on SQLite and
115 s on PostgreSQL on a 2-core machine, 6,000 about 30 s and 40 s with a core busy
beside. The test prints its seed and timings (pytest -s).
"""

from __future__ import annotations

import os
import random
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

import ferryq
from ferryq.job import Job, State
from tests.acceptance.conftest import Workers
from tests.acceptance.lane_checks import (
    Attempt,
    all_jobs,
    assert_lane_kept,
    attempts_by_job,
    read_attempts,
)
from tests.acceptance.lane_order import assert_claimed_in_id_order
from tests.acceptance.lanes_app import MAX_TRIES, TTR, lane_step
from tests.processes import WORKER_STARTED, Process

LANES_1 = [f"l1:{n}" for n in range(150)]
LANES_3 = [f"l3:{n}" for n in range(150)]
LIMITS = {"l1:": 1, "l3:": 3}
JOBS = 6_000
PER_LANE = JOBS // (len(LANES_1) + len(LANES_3))
ROUNDS = 4  # each lane's jobs are enqueued in this many batches, lanes interleaved
PROCESSES = 3
SLOTS = 8
KILLS = 4
FAIL_FIRST = 0.1
MAX_SLEEP = 0.005
DRAIN_TIMEOUT = 240.0
TERMINAL = ("succeeded", "dead", "cancelled", "expired")


class Fleet(Workers):
    """Worker processes of lanes_app on one database, with their kills recorded."""

    def __init__(self, url: str, log_dir: Path) -> None:
        super().__init__(url, log_dir)
        self.killed: dict[int, float] = {}  # pid -> time it was dead

    def add(self) -> Process:
        return self.worker("--concurrency", str(SLOTS), module="tests.acceptance.lanes_app")

    def kill(self, victim: Process) -> None:
        victim.kill()
        self.killed[victim.pid] = time.time()


@pytest.fixture
def fleet(backend_url: str, tmp_path: Path) -> Iterator[Fleet]:
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    group = Fleet(backend_url, log_dir)
    yield group
    group.close()


def _limit(lane: str) -> int:
    return LIMITS[lane[:3]]


@pytest.mark.slow
async def test_lanes_keep_order_and_limits_while_workers_are_killed(fleet: Fleet) -> None:
    seed = int(os.environ.get("FERRYQ_CHAOS_SEED", random.randrange(1 << 32)))
    print(f"\nFERRYQ_CHAOS_SEED={seed}")
    rng = random.Random(seed)
    app = ferryq.App(fleet.url)
    try:
        await _run(app, fleet, rng, seed)
    finally:
        await app.aclose()
        app.close()


async def _run(app: ferryq.App, fleet: Fleet, rng: random.Random, seed: int) -> None:
    began = time.monotonic()
    await app.set_lane_limit_async("l1:*", 1)
    await app.set_lane_limit_async("l3:*", 3)
    for _ in range(PROCESSES):
        fleet.add()
    # Enqueue while the workers are already claiming: lanes interleaved, in ROUNDS.
    ids: set[int] = set()
    step = PER_LANE // ROUNDS
    for first in range(0, PER_LANE, step):
        for lane in LANES_1 + LANES_3:
            batch = [
                (lane, seq, round(rng.uniform(0, MAX_SLEEP), 4), rng.random() < FAIL_FIRST)
                for seq in range(first, first + step)
            ]
            # By name, from an App that does not know the task: its options go along.
            handles = await app.enqueue_many_async(
                lane_step.name, batch, lane=lane, ttr=TTR, max_tries=MAX_TRIES
            )
            ids.update(h.id for h in handles)
    assert len(ids) == JOBS
    enqueued = time.monotonic()

    kill_at = sorted(rng.uniform(0.05, 0.85) for _ in range(KILLS))
    counts = await _drain(app, fleet, rng, kill_at)
    drained = time.monotonic()
    assert sum(counts[s] for s in TERMINAL) == JOBS, f"seed {seed}: not all terminal: {counts}"
    survivors = [proc for proc in fleet.started if proc.pid not in fleet.killed]
    for proc in survivors:  # a worker started at the last kill may still be starting:
        proc.wait_for(WORKER_STARTED)  # a SIGTERM before its handlers would kill it
        assert proc.stop() == 0, proc.describe()
    assert len(fleet.killed) == KILLS

    jobs = await all_jobs(app, lane_step.name)
    attempts = read_attempts(fleet.log_dir)
    report = _check(seed, ids, jobs, attempts, fleet.killed)
    print(
        f"seed {seed}: {JOBS} jobs, enqueue {enqueued - began:.1f} s, drain "
        f"{drained - enqueued:.1f} s; {report}"
    )


async def _drain(
    app: ferryq.App, fleet: Fleet, rng: random.Random, kill_at: list[float]
) -> Counter[str]:
    """Wait until every job is terminal, killing and restarting a worker at each point
    of progress in ``kill_at``; the final counts by state."""
    store = await app.store()
    deadline = time.monotonic() + DRAIN_TIMEOUT
    pending = list(kill_at)
    while True:
        counts: Counter[str] = Counter()
        for (_ns, _queue, state), n in (await store.job_counts(app.namespace)).items():
            counts[state] += n
        done = sum(counts[s] for s in TERMINAL)
        if done == JOBS or time.monotonic() > deadline:
            return counts
        while pending and done >= pending[0] * JOBS:
            pending.pop(0)
            fleet.kill(rng.choice(fleet.live()))
            fleet.add()
        await store.wait_for_finish(0.1, 0.05)


def _check(
    seed: int,
    ids: set[int],
    jobs: dict[int, Job],
    attempts: dict[tuple[int, int], Attempt],
    killed: dict[int, float],
) -> str:
    """Assert the lane guarantees; a one-line summary of what happened."""
    where = f"seed {seed}"
    by_job = attempts_by_job(attempts)

    states = _check_nothing_lost(where, ids, jobs, by_job)
    cut = [a for a in attempts.values() if a.end is None]
    alive = [a for a in cut if a.pid not in killed]
    assert not alive, f"{where}: attempts without an end on a worker never killed: {alive[:5]}"

    lanes: defaultdict[str, list[Job]] = defaultdict(list)
    for job in jobs.values():
        assert job.lane is not None
        lanes[job.lane].append(job)
    for lane, members in lanes.items():
        members.sort(key=lambda job: job.id)
        assert [j.args[1] for j in members] == list(range(PER_LANE)), f"{where}: {lane} order"
        assert_lane_kept(where, lane, _limit(lane), members, jobs, by_job)

    failed = sum(1 for a in attempts.values() if a.outcome == "fail")
    stopped = sum(1 for a in attempts.values() if a.outcome == "stopped")
    # A killed worker held leases (claimed jobs, running or about to run or to be
    # finished); their recovery shows the kills bit, whether or not a handler was mid-way.
    recovered = sum(
        1 for j in jobs.values() if any("lease expired" in str(e.get("message")) for e in j.errors)
    )
    assert recovered, f"{where}: no lease was recovered after {len(killed)} kills"
    return (
        f"states {dict(states)}, {len(attempts)} attempts logged, {failed} failed on purpose, "
        f"{recovered} jobs recovered by lease expiry after {len(killed)} kills, "
        f"{len(cut)} of their attempts cut short mid-handler; {stopped} attempts stopped by "
        f"their workers"
    )


def _check_nothing_lost(
    where: str, ids: set[int], jobs: dict[int, Job], by_job: dict[int, list[Attempt]]
) -> Counter[str]:
    """1. Every job stored and terminal; each success logged under the kept fence."""
    missing = sorted(ids - set(jobs))
    assert not missing, f"{where}: jobs missing from the database: {missing[:20]}"
    states = Counter(str(job.state) for job in jobs.values())
    assert set(states) <= {"succeeded", "dead"}, f"{where}: {states}"
    for job in jobs.values():
        runs = by_job.get(job.id, [])
        if job.state == "succeeded":
            ok = [a for a in runs if a.outcome == "ok" and a.fence == job.fence]
            assert ok, f"{where}: job {job.id} succeeded with fence {job.fence}, logged: {runs}"
        else:
            assert runs or job.attempts, f"{where}: job {job.id} dead without an attempt"
    return states


# -- the order check on made-up runs ---------------------------------------------------


def _job(job_id: int, fence: int, claimed_at: float) -> Job:
    """A succeeded job of lane l3:0 as the database keeps it: its last claim only."""
    return Job(job_id, "default", "default", lane_step.name, ["l3:0", job_id, 0.0, False],
               State.SUCCEEDED, lane="l3:0", attempts=1, fence=fence, claimed_at=claimed_at,
               finished_at=claimed_at + 0.01)  # fmt: skip


def test_the_order_check_passes_a_kill_between_a_claim_and_its_start() -> None:
    # Job 1 was claimed first, at 10.000, by a worker killed before the handler began:
    # the claim was given up and job 1 claimed again (fence 2) at 11.500. Job 2, claimed
    # at 10.001, started long before job 1's first logged start: the order was kept.
    jobs = [_job(1, 2, 11.5), _job(2, 1, 10.001)]
    assert_claimed_in_id_order("l3:0", jobs, {1: 11.51, 2: 10.01})


def test_the_order_check_fails_a_job_claimed_after_a_later_one_started() -> None:
    jobs = [_job(1, 1, 10.5), _job(2, 1, 10.0)]
    with pytest.raises(
        AssertionError, match=r"job 1 was claimed at 10\.500000, after the later job 2"
    ):
        assert_claimed_in_id_order("l3:0", jobs, {1: 10.51, 2: 10.01})
