"""The producer's cycle when only half of it reaches the database (pure logic)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import pytest

from ferryq.store.base import Claimed, CycleHalfDone, Finish, FinishReport, Store
from ferryq.worker.completer import Completer
from ferryq.worker.executor import Attempt
from ferryq.worker.producer import Producer


def claimed(job_id: int, order_time: float) -> Claimed:
    return Claimed(job_id, "default", "default", "t", "[]", 1, 3, 1, 60.0, "{}", 0.0,
                   order_time, order_time, 160.0, None, "null", 99.0, None, None)  # fmt: skip


class HalfDone:
    """A database that writes the finishes and fails the claim, or the other way round."""

    def __init__(self, report: FinishReport | None, jobs: list[Claimed]) -> None:
        self.report, self.jobs = report, jobs

    async def job_finish_and_claim(
        self, finishes: Sequence[Finish], *args: Any
    ) -> tuple[FinishReport, list[Claimed]]:
        raise CycleHalfDone(self.report, self.jobs) from ConnectionError("lost")


def producer_over(store: HalfDone, completer: Completer, started: list[int]) -> Producer:
    return Producer(
        cast(Store, store), completer, namespace="default", queues=["default"], worker_id="w",
        capacity=10, batch=10, clock=lambda: 100.0,
        start=lambda jobs: started.extend(job.id for job in jobs),
        active=cast(dict[int, Attempt], {}),
    )  # fmt: skip


async def test_finishes_written_by_a_cycle_whose_claim_failed_are_not_sent_again() -> None:
    reports: list[FinishReport] = []
    completer = Completer(lambda batch, report: reports.append(report), lambda exc: False)
    completer.add(Finish("succeeded", 1, 1, 100.0))
    started: list[int] = []
    producer = producer_over(HalfDone(FinishReport([1], []), []), completer, started)
    with pytest.raises(CycleHalfDone):
        await producer.cycle()
    assert reports == [FinishReport([1], [])] and completer.backlog == 0 and not started


async def test_jobs_claimed_by_a_cycle_whose_finishes_failed_still_start_in_order() -> None:
    completer = Completer(lambda batch, report: None, lambda exc: False)
    completer.add(Finish("succeeded", 1, 1, 100.0))
    started: list[int] = []
    jobs = [claimed(3, 50.0), claimed(2, 40.0)]
    producer = producer_over(HalfDone(None, jobs), completer, started)
    with pytest.raises(CycleHalfDone):
        await producer.cycle()
    assert started == [2, 3] and [f.id for f in completer.pending] == [1]
