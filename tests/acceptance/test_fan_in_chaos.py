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
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import ferryq
from tests.acceptance.fan_in_app import MAX_TRIES, TTR, album, member

ROOT = Path(__file__).resolve().parents[2]
MEMBERS = 1_000
PROCESSES = 3
SLOTS = 8
KILLS = 4
DRAIN_TIMEOUT = 120.0
TERMINAL = ("succeeded", "dead", "cancelled", "expired")


@dataclass
class Fleet:
    url: str
    log_dir: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    killed: int = 0

    def start(self) -> None:
        env = {**os.environ, "FERRYQ_URL": self.url, "FERRYQ_TEST_LOG_DIR": str(self.log_dir),
               "PYTHONPATH": str(ROOT)}  # fmt: skip
        with open(self.log_dir / f"worker-{len(self.procs)}.stderr", "wb") as stderr:
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", "tests.acceptance.fan_in_app", "--concurrency", str(SLOTS)],
                cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=stderr,
            ))  # fmt: skip

    def kill_one(self, rng: random.Random) -> None:
        victim = rng.choice([proc for proc in self.procs if proc.poll() is None])
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        self.killed += 1
        self.start()

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


@pytest.fixture
def fleet(backend_url: str, tmp_path: Path) -> Iterator[Fleet]:
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    group = Fleet(backend_url, log_dir)
    yield group
    group.close()


@pytest.mark.slow
async def test_a_fan_in_callback_runs_once_with_every_result_while_workers_die(
    fleet: Fleet,
) -> None:
    seed = int(os.environ.get("FERRYQ_CHAOS_SEED", random.randrange(1 << 32)))
    print(f"\nFERRYQ_CHAOS_SEED={seed}")
    rng = random.Random(seed)
    app = ferryq.App(fleet.url)
    try:
        for _ in range(PROCESSES):
            fleet.start()
        # The tasks of the workers' module, registered on this App (of the test's
        # database) under the same names and options.
        member_task = app.task(name=member.name, ttr=TTR, max_tries=MAX_TRIES)(member.fn)
        callback_task = app.task(name=album.name, ttr=TTR, max_tries=MAX_TRIES)(album.fn)
        group = ferryq.group(member_task, [(n,) for n in range(MEMBERS)])
        callback = await group.then_async(callback_task)
        kill_at = sorted(rng.uniform(0.05, 0.8) for _ in range(KILLS))
        await _drain_members(app, fleet, rng, kill_at)
        total = await callback.result_async(timeout=DRAIN_TIMEOUT)
    finally:
        await app.aclose()
    expected = sum(n * n for n in range(MEMBERS))
    assert total == expected, f"seed {seed}"
    assert fleet.killed == KILLS
    members = [await app.get_job_async(m.id) for m in group.members]
    assert all(job.state == "succeeded" for job in members), f"seed {seed}"
    last_member = max(job.finished_at or 0.0 for job in members)
    runs = [
        line.split() for log in fleet.log_dir.glob("*.log") for line in log.read_text().splitlines()
    ]
    assert len(runs) == 1, f"seed {seed}: the callback started {len(runs)} times: {runs}"
    (_, job_id, _attempt, _fence, count, summed, started) = runs[0]
    assert (int(job_id), int(count), int(summed)) == (callback.id, MEMBERS, expected)
    assert float(started) >= last_member, f"seed {seed}: the callback started too early"
    job = await app.get_job_async(callback.id)
    assert job.state == "succeeded" and job.attempts == 1
    print(f"seed {seed}: {MEMBERS} members, {fleet.killed} kills, "
          f"{sum(j.attempts for j in members) - MEMBERS} extra member attempts")  # fmt: skip


async def _drain_members(
    app: ferryq.App, fleet: Fleet, rng: random.Random, kill_at: list[float]
) -> None:
    """Until every member has ended, killing and restarting a worker at each point of
    progress in ``kill_at`` (the callback waits: it is not counted)."""
    store = await app.store()
    deadline = time.monotonic() + DRAIN_TIMEOUT
    pending = list(kill_at)
    while True:
        counts = await store.job_counts(app.namespace)
        done = sum(n for (_, _, state), n in counts.items() if state in TERMINAL)
        if done == MEMBERS:
            return
        assert time.monotonic() < deadline, f"{done} of {MEMBERS} members ended in time"
        while pending and done >= pending[0] * MEMBERS:
            pending.pop(0)
            fleet.kill_one(rng)
        await store.wait_for_finish(0.1, 0.05)
