"""PostgreSQL as the cluster: worker processes on two "machines" sharing one database,
killed, restarted, and the database itself restarted under them.

The events make the test, not the count of jobs: three kills and a restart of the
server, each at a point of progress (16%, 36%, 56% and 76% of the jobs done, as
before), each finding the four workers' 50 slots full and more claimed behind them,
however long the backlog. So JOBS is 10,000, not 50,000: a longer backlog only
repeated the drain between the events, for five times the wall clock.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter, defaultdict

import pytest

import ferryq
from tests.acceptance.conftest import Workers
from tests.acceptance.tasks import record
from tests.pg import PgCluster
from tests.processes import Process

JOBS = 10_000
BATCH = 1_000


async def _until_done(app: ferryq.App, total: int, timeout: float = 240.0) -> dict[str, int]:
    """Wait on finish notifications until every job is terminal; the counts by state."""
    store = await app.store()
    loop_time = asyncio.get_running_loop().time
    deadline = loop_time() + timeout
    while True:
        counts: Counter[str] = Counter()
        for (_ns, _queue, state), n in (await store.job_counts(app.namespace)).items():
            counts[state] += n
        finished = sum(counts[s] for s in ("succeeded", "dead", "cancelled", "expired"))
        if finished == total or loop_time() > deadline:
            return dict(counts)
        await store.wait_for_finish(1.0, 0.2)


async def _until_live(app: ferryq.App, name: str, after: float) -> None:
    """Until the worker ``name`` has sent a heartbeat since ``after``."""
    store = await app.store()
    for _ in range(600):
        if any(w.id == name for w in await store.worker_list(alive_since=after)):
            return
        await store.wait_for_finish(0.1, 0.1)
    raise TimeoutError(f"worker {name} did not start")


async def _wait_for(handle: ferryq.JobHandle) -> None:
    await handle.result_async(timeout=120)


def _start(pg_workers: Workers, machine: str, index: int) -> Process:
    return pg_workers.worker("--concurrency", "50", "--name", f"{machine}-{index}")


@pytest.mark.slow
async def test_two_machines_survive_kills_and_a_database_restart(
    pg_workers: Workers, pg_cluster: PgCluster
) -> None:
    if not pg_cluster.can_restart:
        pytest.skip("the PostgreSQL server is not the tests' own to restart")
    app = ferryq.App(pg_workers.url)
    try:
        await _survive(app, pg_workers, pg_cluster)
    finally:
        await app.aclose()
        app.close()


async def _survive(app: ferryq.App, pg_workers: Workers, pg_cluster: PgCluster) -> None:
    handles: list[ferryq.JobHandle] = []
    for first in range(0, JOBS, BATCH):
        batch = [(n,) for n in range(first, first + BATCH)]
        handles += await app.enqueue_many_async(record.name, batch, ttr=3)
    procs = {(m, i): _start(pg_workers, m, i) for m in ("machine-a", "machine-b") for i in (1, 2)}
    killed: set[int] = set()

    async def kill_and_restart(key: tuple[str, int]) -> None:
        victim = procs[key]
        victim.kill()
        killed.add(victim.pid)
        procs[key] = _start(pg_workers, *key)
        await _until_live(app, f"{key[0]}-{key[1]}", after=time.time())

    await _wait_for(handles[JOBS * 16 // 100])
    await kill_and_restart(("machine-a", 1))
    await _wait_for(handles[JOBS * 36 // 100])
    pg_cluster.restart()
    await _wait_for(handles[JOBS * 56 // 100])
    await kill_and_restart(("machine-b", 2))
    await _wait_for(handles[JOBS * 76 // 100])
    await kill_and_restart(("machine-a", 2))

    counts = await _until_done(app, JOBS)
    assert counts == {"succeeded": JOBS}, counts
    for proc in procs.values():
        assert proc.running(), f"a worker died on its own: {proc.describe()}"
        proc.send_signal(signal.SIGTERM)
    for proc in procs.values():
        assert proc.wait() == 0, proc.describe()
    logs = [proc.stderr() for proc in procs.values()]
    crashed = [log for log in logs if "Traceback (most recent call last)" in log]
    assert not crashed, crashed[0][-4000:]

    runs: defaultdict[int, list[tuple[int, int]]] = defaultdict(list)
    for line in pg_workers.log_lines():
        job_id, _n, fence, pid = map(int, line.split())
        runs[job_id].append((fence, pid))
    assert set(runs) == {h.id for h in handles}, "a job never ran"
    again = {job_id: attempts for job_id, attempts in runs.items() if len(attempts) > 1}
    for job_id, attempts in again.items():
        # Every earlier run was cut short: its worker was killed before it could finish.
        last = max(attempts)
        assert all(pid in killed for fence, pid in attempts if (fence, pid) != last), job_id
    print(f"\n{len(again)} of {JOBS} jobs ran twice, all behind {len(killed)} killed workers")


async def test_when_the_leader_dies_another_worker_recovers_leases(pg_workers: Workers) -> None:
    app = ferryq.App(pg_workers.url)
    leader = pg_workers.worker("--name", "first")
    await _wait_for((await app.enqueue_many_async(record.name, [(0,)]))[0])  # leader is up
    leader.kill()
    # A job claimed by a worker that vanished at once: only maintenance can recover it.
    # Claimed once the first worker is dead, so that only the second can, however long
    # a busy machine takes between the claim and the kill.
    store = await app.store()
    orphan = (await app.enqueue_many_async(record.name, [(1,)], ttr=1, queue="orphans",
                                           max_tries=1))[0]  # fmt: skip
    await store.job_claim("default", ["orphans"], 1, "vanished-worker", app.clock())
    pg_workers.worker("--name", "second")
    # Its lease runs out; the new leader recovers it, and with no tries left it is dead.
    with pytest.raises(ferryq.JobDead, match="lease expired"):
        await orphan.result_async(timeout=30)
    job = await app.get_job_async(orphan.id)
    assert job.errors[0]["worker"] == "second"
    await app.aclose()
    app.close()
