"""Several worker processes on one SQLite file.

Exactly once is decided claim by claim, under SQLite's write lock, between the
processes claiming at the same moment: what makes the test is four processes of 50
slots each competing (two claiming while the jobs are enqueued, two joining late), not
the count. 5,000 jobs are 25 full claims of each process; 20,000 were four times as
many of the same, for four times the wall clock.
"""

from __future__ import annotations

from collections import Counter

import ferryq
from tests.acceptance.conftest import Workers
from tests.acceptance.tasks import record

JOBS = 5_000


def test_four_processes_run_every_job_exactly_once(workers: Workers) -> None:
    app = ferryq.App(workers.url)
    # Enqueue while the first workers are already claiming, then let all drain.
    early = [workers.worker("--burst", "--concurrency", "50") for _ in range(2)]
    handles = []
    for start in range(0, JOBS, 1000):
        batch = [(n,) for n in range(start, start + 1000)]
        handles += app.enqueue_many(record.name, batch)
    late = [workers.worker("--burst", "--concurrency", "50") for _ in range(2)]
    for proc in early + late:
        assert proc.wait() == 0, proc.describe()
    # An early burst worker may have found the queue empty and left; finish the rest.
    leftover = workers.worker("--burst")
    assert leftover.wait() == 0, leftover.describe()
    for proc in workers.started:
        assert "locked" not in proc.stderr() and "Traceback" not in proc.stderr(), proc.describe()

    runs = Counter(int(line.split()[0]) for line in workers.log_lines())
    ids = {h.id for h in handles}
    assert set(runs) == ids
    assert max(runs.values()) == 1
    stats = app.stats().counts["default"]
    assert stats["succeeded"] == JOBS and sum(stats.values()) == JOBS
    app.close()
