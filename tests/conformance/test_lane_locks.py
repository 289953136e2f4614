"""PostgreSQL's lane locks come before the rows, whatever the caller says of a job's lane.

A transaction that decides about a lane takes the lane's advisory lock before it
touches a job row (ferryq/store/postgres/lanes.py). A batch of finishes finds the
lanes of its jobs from their rows: a finish that names no lane must not write its row
first and wait for the lock after, or a transaction holding the lock and waiting for
the row (a cancel does just that) would deadlock with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import psycopg
import pytest

from ferryq import lanes
from ferryq.errors import InvalidTransition
from ferryq.job import State
from ferryq.lanes import LaneRule
from ferryq.store.base import JobFilter, Store
from tests.conformance.jobs import NS, insert, succeed
from tests.conftest import START as NOW

LOCK_LANE = "SELECT pg_advisory_xact_lock(hashtextextended(%s || '/' || %s, 11))"
WAITING_FOR_IT = (
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND pid <> %s"
)


#: The conftest's ``store``, on PostgreSQL only.
pytestmark = pytest.mark.parametrize("backend_url", ["postgres"], indirect=True)


async def test_a_finish_naming_no_lane_locks_the_lane_before_its_row(
    store: Store, pg_url: str
) -> None:
    a = await insert(store, NOW, lane="L")
    b = await insert(store, NOW, lane="L")
    (job_a,) = await store.job_claim(NS, ["default"], 1, "w", NOW)
    async with await psycopg.AsyncConnection.connect(pg_url) as holder:
        # Hold the lane's lock, as a cancel of the job does before it locks the row.
        await holder.execute(LOCK_LANE, (NS, "L"))
        finishing = asyncio.ensure_future(store.job_finish_many([succeed(job_a, NOW)]))
        deadline = time.monotonic() + 10
        while not (await (await holder.execute(WAITING_FOR_IT, (holder.info.backend_pid,)))
                   .fetchone() or (0,))[0]:  # fmt: skip
            assert not finishing.done(), "the finish did not wait for the lane's lock"
            assert time.monotonic() < deadline, "the finish never waited for the lane's lock"
            await asyncio.sleep(0.01)
        # The finish waits for the lane; it must not hold the job's row meanwhile.
        await holder.execute("SET lock_timeout = '2s'")
        row = await (await holder.execute(
            "SELECT state FROM ferryq_jobs WHERE id = %s FOR UPDATE", (a,))).fetchone()  # fmt: skip
        assert row == ("running",)
        await holder.commit()
    assert (await asyncio.wait_for(finishing, 10)).accepted == [a]
    job = await store.job_get(b)
    assert job is not None and job.state == State.READY


async def test_finishes_naming_no_lane_beside_inserts_rules_and_cancels_settle_every_lane(
    store: Store,
) -> None:
    names = [f"c:{n}" for n in range(4)]
    for lane in names:
        for _ in range(3):
            await insert(store, NOW, lane=lane)
    stop = asyncio.Event()

    async def work() -> None:
        while not stop.is_set():
            claimed = await store.job_claim(NS, ["default"], 4, "w", NOW)
            await store.job_finish_many([succeed(job, NOW) for job in claimed])  # no lane
            await asyncio.sleep(0)

    async def disturb() -> None:
        for round_no in range(30):
            await insert(store, NOW, lane=names[round_no % len(names)])
            await store.lane_rule_set(NS, LaneRule("c:*", 1 + round_no % 2), NOW)
            for job in await store.job_list(JobFilter(namespace=NS, state=State.RUNNING)):
                with contextlib.suppress(InvalidTransition):  # it may have ended since
                    await store.job_cancel(job.id, NOW)  # the lane's lock, then the row
        stop.set()

    await asyncio.wait_for(asyncio.gather(work(), work(), disturb()), 60)
    for lane in names:  # each lane as its rule says: nothing to admit or step back
        view = await store.lane_view(NS, lane)
        assert not lanes.plan(view, NOW), view
