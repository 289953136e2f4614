"""Hosts whose clocks disagree: two worker processes whose clocks are 30 s off the
database server's, one ahead and one behind (injected into their Apps; the machine's
clock is not touched), beside one whose clock is right, on PostgreSQL, each taking the
jobs of a queue of its own (so each runs some, however fast the others start; the
leader recovers lapsed leases of every queue). Every App keeps
the server's time there (ferryq/clock.py), so the one ahead, which leads and recovers
lapsed leases, recovers none early, and the one behind writes leases that last as long
as anyone's: every job runs exactly once, no two attempts overlap.

Without it (``worker_main --host-clock``), the leader ahead takes every lease of the
others for lapsed at once, and the worker behind writes leases lapsed as they are
written: jobs run twice, at the same time.
"""

from __future__ import annotations

from collections import Counter

import ferryq
from tests.acceptance.conftest import Workers
from tests.acceptance.tasks import work
from tests.acceptance.test_outages import assert_no_overlap, runs
from tests.processes import wait_until

SKEW = 30.0
JOBS = 60
TTR = 2.0
QUEUES = ("ahead", "behind", "right")


def test_workers_whose_clocks_are_30_s_off_never_run_a_job_twice(pg_workers: Workers) -> None:
    app = ferryq.App(pg_workers.url)
    handles = [app.enqueue(work.name, [0.2 + (n % 4) / 10], ttr=TTR, max_tries=5,
                           queue=QUEUES[n % 3])
               for n in range(JOBS)]  # fmt: skip
    ahead = pg_workers.worker("--concurrency", "4", "--queues", "ahead",
                              "--clock-skew", str(SKEW))  # fmt: skip
    wait_until(lambda: "is now the maintenance leader" in ahead.stderr(), within=60,
               what="the worker ahead leading")  # fmt: skip
    behind = pg_workers.worker("--concurrency", "4", "--queues", "behind",
                               "--clock-skew", str(-SKEW))  # fmt: skip
    right = pg_workers.worker("--concurrency", "4", "--queues", "right")
    for handle in handles:
        assert handle.result(timeout=120) == "done"
    for proc in (ahead, behind, right):
        assert proc.running(), proc.describe()
        assert proc.stop() == 0, proc.describe()
    all_runs = runs(pg_workers)
    assert_no_overlap(all_runs)
    attempts = Counter(run.job for run in all_runs)
    assert sorted(attempts.values()) == [1] * JOBS, "jobs recovered early and run again"
    assert len({run.pid for run in all_runs}) == 3  # each worker ran its queue's
    assert "30.0 s ahead of the database server's" in ahead.stderr()
    assert "30.0 s behind the database server's" in behind.stderr()
    assert "the database server's" not in right.stderr()
    app.close()
