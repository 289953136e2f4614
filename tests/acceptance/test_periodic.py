"""Periodic jobs across real worker processes: one job per tick, restarts included.

Inherently real time: three workers with a one-second schedule run for 30 seconds,
during which the whole deploy restarts once and one worker is SIGKILLed.
"""

from __future__ import annotations

import math
import signal
import time
from collections import Counter

import pytest

import ferryq
from tests.acceptance.conftest import Workers

MODULE = "tests.acceptance.periodic_app"
TASK = "every_second"
WINDOW = 30  # seconds, and so ticks


def ticks_of(app: ferryq.App) -> list[float]:
    jobs = app.list_jobs(task=TASK, limit=1000)
    return sorted(job.meta["periodic"]["tick"] for job in jobs)


def sleep_until(moment: float) -> None:
    time.sleep(max(0.0, moment - time.time()))


@pytest.mark.slow
def test_three_workers_enqueue_one_job_per_tick_across_restarts(any_workers: Workers) -> None:
    app = ferryq.App(any_workers.url)
    procs = [any_workers.worker(module=MODULE) for _ in range(3)]
    deadline = time.time() + 60
    while not ticks_of(app):  # the first leader's first tick
        assert time.time() < deadline, "no periodic job within a minute"
        time.sleep(0.2)
    start = math.floor(ticks_of(app)[0]) + 1
    end = start + WINDOW
    sleep_until(start + 10)
    for proc in procs:  # a deploy: every worker stops, new ones start
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        assert proc.wait(timeout=30) == 0
    procs = [any_workers.worker(module=MODULE) for _ in range(3)]
    sleep_until(start + 20)
    procs[0].send_signal(signal.SIGKILL)  # the leader, perhaps
    sleep_until(end + 4)  # the last tick's job enqueued and run, a recovered one too
    ticks = ticks_of(app)
    in_window = [t for t in ticks if start <= t < end]
    twice = [t for t, n in Counter(ticks).items() if n > 1]
    print(f"\n{len(in_window)} jobs for the {WINDOW} ticks in {WINDOW} s, {len(twice)} twice")
    assert twice == []
    assert abs(len(in_window) - WINDOW) <= 1
    states = Counter(job.state for job in app.list_jobs(task=TASK, limit=1000)
                     if start <= job.meta["periodic"]["tick"] < end)  # fmt: skip
    assert states == {"succeeded": len(in_window)}
    app.close()
