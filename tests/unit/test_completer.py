"""The completer's narrowing down of a refused write, on a fake database (pure logic)."""

from __future__ import annotations

import asyncio
import math

import pytest

from ferryq.store.base import Finish, FinishKind, FinishReport
from ferryq.worker.completer import REFUSED, Completer, refused


class Refused(Exception):
    pass


def finish(job_id: int, kind: FinishKind = "succeeded", **values: object) -> Finish:
    return Finish(kind, job_id, 1, 100.0, 99.0, **values)  # type: ignore[arg-type]


class FakeDatabase:
    """Refuses, as a whole, every write holding the finish of a job in ``refusing``
    (unless it is the failed attempt written in its place)."""

    def __init__(self, completer: Completer, refusing: set[int]) -> None:
        self.completer, self.refusing = completer, refusing
        self.stored: dict[int, Finish] = {}
        self.writes = 0
        self.wrote = asyncio.Event()

    async def flush(self) -> None:
        self.writes += 1
        batch = self.completer.take()
        if any(f.id in self.refusing and not _replaced(f) for f in batch):
            self.completer.restore(batch, Refused("no"), alone=True)
            raise Refused("no")
        self.stored.update((f.id, f) for f in batch)
        self.completer.written(batch, FinishReport([f.id for f in batch], []))
        self.wrote.set()


def _replaced(f: Finish) -> bool:
    return f.error is not None and f.error.get("type") == REFUSED


def completer_over(refusing: set[int]) -> tuple[Completer, FakeDatabase]:
    completer = Completer(lambda batch, report: None, lambda exc: isinstance(exc, Refused))
    database = FakeDatabase(completer, refusing)
    completer.bind(database.flush)
    return completer, database


async def drain(completer: Completer) -> None:
    running = asyncio.create_task(completer.run())
    await completer.drain(within=60)
    await running


@pytest.mark.parametrize("poison_at", [0, 999, 1999])
async def test_one_refused_finish_in_a_full_batch_is_found_in_few_writes(poison_at: int) -> None:
    completer, database = completer_over({poison_at})
    for job_id in range(2000):
        completer.add(finish(job_id))
    await drain(completer)
    assert sorted(database.stored) == list(range(2000))
    assert database.stored[poison_at].kind == "dead"
    assert database.stored[poison_at].error["type"] == REFUSED  # type: ignore[index]
    assert all(f.kind == "succeeded" for i, f in database.stored.items() if i != poison_at)
    assert database.writes <= math.ceil(math.log2(2000)) + 3  # halving, one write a step


async def test_writes_are_full_again_once_past_the_finishes_in_doubt() -> None:
    completer, _ = completer_over(set())
    for job_id in range(30):
        completer.add(finish(job_id))
    completer.restore(completer.take(), ConnectionResetError(), alone=True)  # halved all the same
    assert completer.in_doubt
    sizes = []
    while completer.pending:
        batch = completer.take()
        sizes.append(len(batch))
        completer.written(batch, FinishReport([f.id for f in batch], []))
    assert sizes == [15, 8, 4, 2, 1] and not completer.in_doubt
    for job_id in range(30, 40):
        completer.add(finish(job_id))
    assert len(completer.take()) == 10


async def test_a_write_cut_off_by_the_stop_is_put_back_whole() -> None:
    completer, _ = completer_over({1})
    for job_id in range(4):
        completer.add(finish(job_id))
    batch = completer.take()
    completer.restore(batch, asyncio.CancelledError(), alone=True)
    assert completer.pending == batch and not completer.in_doubt
    assert len(completer.take()) == 4
    (lone,) = batch[1:2]
    completer.restore([lone], asyncio.CancelledError(), alone=True)
    assert completer.pending[0] is lone  # a cut-off lone finish is not replaced either


async def test_finishes_a_claiming_cycle_failed_to_write_are_written_by_the_completer() -> None:
    """The producer's cycle writes finishes too: when its write fails it puts them back,
    and the completer, idle meanwhile, must write them (the producer claims nothing
    while they are in doubt), though no new finish comes to wake it."""
    completer, database = completer_over(set())
    running = asyncio.create_task(completer.run())
    for job_id in range(3):
        completer.add(finish(job_id))
    batch = completer.take()  # the claiming cycle, before run() got to them
    await asyncio.sleep(0)  # run() finds nothing pending and waits
    completer.restore(batch, ConnectionResetError(), alone=False)
    assert completer.in_doubt
    await asyncio.wait_for(database.wrote.wait(), 30)  # a bound on a hang
    assert sorted(database.stored) == [0, 1, 2] and not completer.in_doubt
    await completer.drain(within=60)
    await running


async def test_a_refusal_is_blamed_on_a_finish_only_when_it_was_written_alone() -> None:
    completer, _ = completer_over({1})
    completer.add(finish(1))
    (lone,) = completer.take()
    completer.restore([lone], Refused("no"), alone=False)  # a claim shared that write
    assert completer.pending == [lone] and completer.in_doubt
    (again,) = completer.take()
    completer.restore([again], Refused("no"), alone=True)
    (written,) = completer.pending
    assert written.kind == "dead" and written.error["type"] == REFUSED  # type: ignore[index]
    assert not completer.in_doubt


@pytest.mark.parametrize(
    ("kind", "becomes"),
    [("succeeded", "dead"), ("next", "dead"), ("dead", "dead"), ("retry", "retry")],
)
def test_what_is_written_in_place_of_a_refused_finish(kind: FinishKind, becomes: str) -> None:
    error = {"type": "E", "message": "\x00", "attempt": 2, "stage": "b\x00", "worker": "w9",
             "at": 1.0}  # fmt: skip
    original = finish(7, kind, result='"x"', error=error, stage="s", context="{}",
                      run_at=130.0, order_time=129.0)  # fmt: skip
    replacement = refused(original, ValueError("bad \x00 value"))
    assert (replacement.kind, replacement.id, replacement.fence) == (becomes, 7, 1)
    assert (replacement.finished_at, replacement.started_at) == (100.0, 99.0)
    assert replacement.result == "null" and replacement.stage is replacement.context is None
    assert replacement.error == {
        "type": REFUSED,
        "message": "the database refused this attempt's "
        f"{ {'succeeded': 'result', 'next': 'next stage'}.get(kind, 'error') }: "
        "ValueError: bad \\x00 value",
        "traceback": None, "attempt": 2, "stage": "b\\x00", "worker": "w9", "at": 100.0,
    }  # fmt: skip
    expected_times = (130.0, 129.0) if becomes == "retry" else (None, None)
    assert (replacement.run_at, replacement.order_time) == expected_times


@pytest.mark.parametrize("kind", ["cancelled", "returned"])
def test_finishes_without_values_of_their_own_are_kept(kind: FinishKind) -> None:
    original = finish(7, kind)
    assert refused(original, ValueError("no")) is original


async def test_finishes_sent_again_after_a_lost_answer_are_not_counted_stale() -> None:
    reports: list[FinishReport] = []
    completer = Completer(lambda batch, report: reports.append(report), lambda exc: False)
    lost_once = True

    async def flush() -> None:
        nonlocal lost_once
        batch = completer.take()
        if lost_once:  # the write landed, but its answer was lost on the way back
            lost_once = False
            completer.restore(batch, ConnectionError("connection lost"), alone=True)
            raise ConnectionError("connection lost")
        # Written already: the database now refuses them as stale, all but job 3, whose
        # first write really failed.
        accepted = [f.id for f in batch if f.id == 3]
        completer.written(batch, FinishReport(accepted, [f.id for f in batch if f.id != 3]))

    completer.bind(flush)
    for job_id in (1, 2, 3):
        completer.add(finish(job_id))
    await drain(completer)
    assert [i for r in reports for i in r.accepted] == [3]
    assert not [i for r in reports for i in r.stale]


async def test_a_late_worker_is_still_stale() -> None:
    reports: list[FinishReport] = []
    completer = Completer(lambda batch, report: reports.append(report), lambda exc: False)

    async def flush() -> None:
        batch = completer.take()
        completer.written(batch, FinishReport([], [f.id for f in batch]))

    completer.bind(flush)
    completer.add(finish(1))
    await drain(completer)
    assert reports == [FinishReport([], [1])]
