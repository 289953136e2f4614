"""Periodic jobs across real worker processes: one job per tick, restarts included.

Inherently real time: three workers on a one-second schedule, through a restart of the
whole deploy (every worker stopped, three new ones started) and a SIGKILL of the
periodic leader. Each step waits for what the last one did (ticks enqueued, a leader's
log line), not for a guessed while: the window runs from the first whole tick to
TICKS_AFTER ticks past the kill, about a dozen ticks, and every tick in it must have
exactly one job that ran (docs/guarantees.md, Periodic jobs), but for ticks a leader
logged as missed and skipped: a tick more than 10 s old when a leader reaches it is
not run, by design, and a machine busy enough can take that long to start the new
deploy. The dozen ticks hold what thirty did: the restart's gap and the kill's
hand-over (a leader that may have enqueued a tick it did not record, which the next
one enqueues again and the key catches) each happen once, whatever the length of the
window around them.
"""

from __future__ import annotations

import math
import re
import signal
import time
from collections import Counter

import pytest

import ferryq
from tests.acceptance.conftest import Workers
from tests.conftest import BACKENDS, POOLED
from tests.processes import START_SECONDS, Process, wait_until

MODULE = "tests.acceptance.periodic_app"
TASK = "every_second"
TICKS_BEFORE = 3  # whole ticks run by the first workers before the deploy restarts
TICKS_AFTER = 3  # whole ticks past the kill, run by the next leader
SKIPPED = re.compile(rf"periodic task \S*{TASK}: (\d+) missed tick\(s\) skipped")


def ticks_of(app: ferryq.App) -> list[float]:
    jobs = app.list_jobs(task=TASK, limit=1000)
    return sorted(job.meta["periodic"]["tick"] for job in jobs)


def until_tick(app: ferryq.App, tick: float) -> None:
    """Until the job of ``tick`` (or a later one) is enqueued."""
    wait_until(lambda: (ticks_of(app) or [0.0])[-1] >= tick, within=START_SECONDS,
               what=f"the job of tick {tick}")  # fmt: skip


def leading(worker: Process) -> bool:
    """Whether the worker's last word on its periodic leadership is that it leads."""
    said = [line for line in worker.stderr().splitlines() if " the periodic:" in line]
    return bool(said) and " is now the periodic:" in said[-1]


def leader(workers: list[Process]) -> Process:
    """The one of ``workers`` that leads the periodic enqueues, once one does."""
    wait_until(lambda: any(map(leading, workers)), within=START_SECONDS, what="a periodic leader")
    (found,) = [worker for worker in workers if leading(worker)]
    return found


@pytest.mark.slow
@pytest.mark.parametrize("any_workers", [*BACKENDS, POOLED], indirect=True)
def test_three_workers_enqueue_one_job_per_tick_across_restarts(any_workers: Workers) -> None:
    app = ferryq.App(any_workers.url)
    procs = [any_workers.worker(module=MODULE) for _ in range(3)]
    wait_until(lambda: bool(ticks_of(app)), within=START_SECONDS, what="the first tick's job")
    start = math.floor(ticks_of(app)[0]) + 1
    until_tick(app, start + TICKS_BEFORE)
    for proc in procs:  # a deploy: every worker stops, new ones start
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        assert proc.wait() == 0, proc.describe()
    procs = [any_workers.worker(module=MODULE) for _ in range(3)]
    killed = leader(procs)
    until_tick(app, math.floor(time.time()))  # the new leader has enqueued
    killed.kill()
    end = math.floor(time.time()) + TICKS_AFTER
    until_tick(app, end)  # every tick before it walked, by the next leader
    in_window = [job for job in app.list_jobs(task=TASK, limit=1000)
                 if start <= job.meta["periodic"]["tick"] < end]  # fmt: skip
    ticks = Counter(job.meta["periodic"]["tick"] for job in in_window)
    assert [t for t, n in ticks.items() if n > 1] == [], "ticks enqueued twice"
    missing = sorted(set(range(start, end)) - set(ticks))
    skipped = sum(int(n) for w in any_workers.started for n in SKIPPED.findall(w.stderr()))
    assert len(missing) <= skipped, f"ticks without a job, none logged as skipped: {missing}"
    wait_until(lambda: all(app.get_job(job.id).state == "succeeded" for job in in_window),
               within=START_SECONDS, what="every tick's job run")  # fmt: skip
    app.close()
