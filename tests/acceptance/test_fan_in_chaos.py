"""A fan-in under chaos: worker processes SIGKILLed and restarted while 1,000 members run.

Three worker processes (8 slots each) run a group of MEMBERS jobs (``member(n)`` returns
n², after a sleep of 20 to 80 ms) and its callback (``album``), which receives the
members' results in order. While members remain, workers are SIGKILLed at random
points of progress (a seeded RNG; set FERRYQ_CHAOS_SEED to replay a run) and restarted
at once; the tasks' ttr is 1.5 s, so a killed attempt is recovered by lease expiry and
retried. No worker is killed once every member has ended.

Proved, from the database and the callback's own log line: every member succeeded;
the callback started once, after the last member ended (its logged start is later
than every member's ``finished_at``), with MEMBERS results whose sum is that of the
squares; it succeeded with that sum.
"""

from __future__ import annotations

import os
import random
import time

import pytest

import ferryq
from tests.acceptance.conftest import Workers
from tests.acceptance.fan_in_app import MAX_TRIES, TTR, album, member

MEMBERS = 1_000
PROCESSES = 3
SLOTS = 8
KILLS = 4
DRAIN_TIMEOUT = 120.0
TERMINAL = ("succeeded", "dead", "cancelled", "expired")


def _start(workers: Workers) -> None:
    workers.worker("--concurrency", str(SLOTS), module="tests.acceptance.fan_in_app")


def _kill_one(workers: Workers, rng: random.Random) -> None:
    """SIGKILL a live worker at random, and start another in its place."""
    rng.choice(workers.live()).kill()
    _start(workers)


@pytest.mark.slow
async def test_a_fan_in_callback_runs_once_with_every_result_while_workers_die(
    any_workers: Workers,
) -> None:
    workers = any_workers
    seed = int(os.environ.get("FERRYQ_CHAOS_SEED", random.randrange(1 << 32)))
    print(f"\nFERRYQ_CHAOS_SEED={seed}")
    rng = random.Random(seed)
    app = ferryq.App(workers.url)
    try:
        for _ in range(PROCESSES):
            _start(workers)
        # The tasks of the workers' module, registered on this App (of the test's
        # database) under the same names and options.
        member_task = app.task(name=member.name, ttr=TTR, max_tries=MAX_TRIES)(member.fn)
        callback_task = app.task(name=album.name, ttr=TTR, max_tries=MAX_TRIES)(album.fn)
        group = ferryq.group(member_task, [(n,) for n in range(MEMBERS)])
        callback = await group.then_async(callback_task)
        kill_at = sorted(rng.uniform(0.05, 0.8) for _ in range(KILLS))
        await _drain_members(app, workers, rng, kill_at)
        total = await callback.result_async(timeout=DRAIN_TIMEOUT)
    finally:
        await app.aclose()
    expected = sum(n * n for n in range(MEMBERS))
    assert total == expected, f"seed {seed}"
    assert len(workers.started) == PROCESSES + KILLS  # a new worker for each one killed
    members = [await app.get_job_async(m.id) for m in group.members]
    assert all(job.state == "succeeded" for job in members), f"seed {seed}"
    last_member = max(job.finished_at or 0.0 for job in members)
    runs = [line.split() for line in workers.log_lines()]
    assert len(runs) == 1, f"seed {seed}: the callback started {len(runs)} times: {runs}"
    (_, job_id, _attempt, _fence, count, summed, started) = runs[0]
    assert (int(job_id), int(count), int(summed)) == (callback.id, MEMBERS, expected)
    assert float(started) >= last_member, f"seed {seed}: the callback started too early"
    job = await app.get_job_async(callback.id)
    assert job.state == "succeeded" and job.attempts == 1
    print(f"seed {seed}: {MEMBERS} members, {KILLS} kills, "
          f"{sum(j.attempts for j in members) - MEMBERS} extra member attempts")  # fmt: skip


async def _drain_members(
    app: ferryq.App, workers: Workers, rng: random.Random, kill_at: list[float]
) -> None:
    """Until every member has ended, killing and restarting a worker at each point of
    progress in ``kill_at`` (the callback waits: it is not counted)."""
    store = await app.store()
    deadline = time.monotonic() + DRAIN_TIMEOUT
    pending = list(kill_at)
    while True:
        counts = await store.job_counts(app.namespace)
        done = sum(n for (_, _, state), n in counts.items() if state in TERMINAL)
        if done >= MEMBERS:  # the callback may have ended too, between two looks
            return
        assert time.monotonic() < deadline, f"{done} of {MEMBERS} members ended in time"
        while pending and done >= pending[0] * MEMBERS:
            pending.pop(0)
            _kill_one(workers, rng)
        await store.wait_for_finish(0.1, 0.05)
