"""A finish whose values the database refuses is written as a failed attempt that says
so, and the finishes batched with it are written as usual: one value the database will
not take never holds back a worker's completions (docs/guarantees.md, "Delivery":
nothing is lost)."""

from __future__ import annotations

import asyncio
import math

import pytest

from ferryq.errors import StoreError
from ferryq.job import State
from ferryq.store import Store
from ferryq.store.base import Claimed, Finish
from ferryq.worker.completer import REFUSED, Completer
from tests.conformance.jobs import NS, claim_one, insert, succeed
from tests.conftest import START

NOW = START


def refusable(job: Claimed, kind: str) -> Finish:
    """A failed attempt whose error no database takes as JSON: NaN is not JSON, and
    neither SQLite's ``json()`` nor PostgreSQL's ``jsonb`` accepts it."""
    error = {"type": "ValueError", "message": "boom", "traceback": None,
             "attempt": job.attempts, "stage": None, "worker": "w1", "at": math.nan}  # fmt: skip
    if kind == "retry":
        return Finish("retry", job.id, job.fence, NOW + 1, NOW, error=error,
                      run_at=NOW + 30, order_time=NOW + 30)  # fmt: skip
    return Finish("dead", job.id, job.fence, NOW + 1, NOW, error=error)


async def test_the_store_tells_a_refusal_from_a_database_out_of_reach(store: Store) -> None:
    job_id = await insert(store, NOW)
    job = await claim_one(store, NOW)
    with pytest.raises(Exception) as raised:
        await store.job_finish_many([refusable(job, "dead")])
    assert store.refuses(raised.value)
    assert (await store.job_get(job_id)).state == State.RUNNING  # type: ignore[union-attr]
    for unreachable in (StoreError("lost the connection"), ConnectionResetError(), TimeoutError()):
        assert not store.refuses(unreachable)


async def test_a_refused_finish_becomes_a_failed_attempt_and_its_batch_is_written(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    ids = [await insert(store, NOW, args=f"[{n}]") for n in range(9)]
    jobs = await store.job_claim(NS, ["default"], 9, "w1", NOW)
    accepted: list[int] = []
    completer = Completer(lambda _, report: accepted.extend(report.accepted), store.refuses)
    flushes = 0

    async def flush() -> None:  # the producer's cycle, without the claim
        nonlocal flushes
        flushes += 1
        batch = completer.take()
        try:
            report, _ = await store.job_finish_and_claim(batch, NS, ["default"], 0, "w1", NOW)
        except BaseException as exc:
            completer.restore(batch, exc, alone=True)
            raise
        completer.written(batch, report)

    completer.bind(flush)
    for job in jobs:
        if job.id == ids[2]:
            completer.add(refusable(job, "retry"))
        elif job.id == ids[6]:
            completer.add(refusable(job, "dead"))
        else:
            completer.add(succeed(job, NOW + 1, f'"done {job.id}"'))
    running = asyncio.create_task(completer.run())
    await completer.drain(within=60)
    await running

    assert sorted(accepted) == ids and completer.backlog == 0
    # Narrowed down by halving, at once: the database answered, so no write waited.
    assert flushes <= 16
    assert not [r for r in caplog.records if "retrying in" in r.getMessage()]
    for job_id in ids:
        written = await store.job_get(job_id)
        assert written is not None
        if job_id == ids[2]:  # still a retry, due when it was to be, with the reason
            assert written.state == State.SCHEDULED and written.run_at == NOW + 30
            (error,) = written.errors
            assert error["type"] == REFUSED and error["attempt"] == 1
            assert "the database refused this attempt's error" in error["message"]
        elif job_id == ids[6]:
            assert written.state == State.DEAD and written.error is not None
            assert written.error["type"] == REFUSED and written.error["worker"] == "w1"
        else:
            assert written.state == State.SUCCEEDED and written.result == f"done {job_id}"
