"""The lease keeper (ferryq/worker/leases.py) as pure logic: its clock injected, its
database a fake that answers a renewal as told, its process exit recorded."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Sequence
from typing import Any, cast

import pytest

from ferryq.context import AttemptSignals, Context, attempt_context
from ferryq.metrics import QueueMetrics
from ferryq.store.base import Claimed, Finish, Leases, Store
from ferryq.worker.executor import Attempt, Executor, Stop
from ferryq.worker.leases import LEASE_MARGIN, MAX_LOOK, LeaseKeeper
from tests.conftest import FrozenClock

COUNTS = QueueMetrics("test", "test")


def claimed(job_id: int, now: float, ttr: float = 60.0, timeout: float | None = None) -> Claimed:
    return Claimed(job_id, "default", "default", "t", "[]", 1, 3, 7, ttr, "{}", 0.0, now, now,
                   now + ttr, None, "null", now, None, None, timeout=timeout)  # fmt: skip


class Keeper:
    """A keeper over its own map of attempts, with what it dropped and exits recorded."""

    def __init__(self, clock: FrozenClock) -> None:
        self.clock = clock
        self.active: dict[int, Attempt] = {}
        self.dropped: list[int] = []
        self.exits = 0
        self.keeper = LeaseKeeper(clock, self.active, self._drop, self._exit)

    def _drop(self, attempt: Attempt) -> None:
        self.dropped.append(attempt.job.id)
        del self.active[attempt.job.id]

    def _exit(self) -> None:
        self.exits += 1

    def claim(self, job_id: int, ttr: float = 60.0, timeout: float | None = None) -> Attempt:
        job = claimed(job_id, self.clock.now, ttr, timeout)
        attempt = self.active[job_id] = Attempt(job, None, job.lease_until, COUNTS)
        return attempt

    def run(self, attempt: Attempt) -> None:
        """Start ``attempt`` with a handler that waits until it is cancelled."""
        assert self.keeper.start(attempt, self.clock.now)
        attempt.runner = asyncio.create_task(forever())
        attempt.begun = True


async def forever() -> None:
    """A handler that runs until it is cancelled."""
    await asyncio.Event().wait()


@pytest.fixture
def keeper() -> Iterator[Keeper]:
    yield Keeper(FrozenClock())


class Answers:
    """A database whose renewal answers as told, and which records what it was asked."""

    def __init__(self, lost: Sequence[int] = (), cancel: Sequence[int] = ()) -> None:
        self.lost, self.cancel = list(lost), list(cancel)
        self.asked: list[dict[str, Any]] = []
        self.fail = False

    async def job_leases(
        self,
        held: list[tuple[int, int]],
        extend: list[int],
        now: float,
        started: dict[int, float],
        progress: dict[int, str],
    ) -> Leases:
        self.asked.append({"held": held, "extend": extend, "started": started,
                           "progress": progress})  # fmt: skip
        if self.fail:
            raise ConnectionError("the database is away")
        return Leases([i for i in extend if i not in self.lost], self.lost, self.cancel)


def store(answers: Answers) -> Store:
    return cast(Store, answers)


# -- starting ---------------------------------------------------------------------


def test_an_attempt_whose_lease_is_within_the_margin_does_not_start(keeper: Keeper) -> None:
    attempt = keeper.claim(1, ttr=60)
    keeper.clock.advance(60 - LEASE_MARGIN)
    assert not keeper.keeper.start(attempt, keeper.clock.now)
    assert attempt.started_at is None


async def test_a_start_sets_the_time_limit_and_wakes_the_watch_only_when_needed(
    keeper: Keeper,
) -> None:
    keeper.keeper.check(keeper.clock.now)
    keeper.keeper._next_look = keeper.clock.now + MAX_LOOK  # as the watch plans it
    plain = keeper.claim(1)
    keeper.run(plain)
    assert plain.started_at == keeper.clock.now and plain.deadline is None
    assert not keeper.keeper._look_now.is_set()  # its lease passes long after the next look
    limited = keeper.claim(2, timeout=0.5)
    keeper.run(limited)
    assert limited.deadline == keeper.clock.now + 0.5
    assert keeper.keeper._look_now.is_set()  # its limit passes before the next look
    for attempt in (plain, limited):
        assert attempt.runner is not None
        attempt.runner.cancel()


# -- the watch --------------------------------------------------------------------


async def test_the_watch_stops_an_attempt_past_its_time_limit(keeper: Keeper) -> None:
    attempt = keeper.claim(1, timeout=5)
    keeper.run(attempt)
    assert keeper.keeper.check(keeper.clock.now) == MAX_LOOK
    assert keeper.keeper.check(keeper.clock.advance(4)) == pytest.approx(1)
    keeper.keeper.check(keeper.clock.advance(1))
    assert attempt.stop is Stop.TIMEOUT
    await asyncio.gather(attempt.runner or asyncio.sleep(0), return_exceptions=True)
    assert keeper.exits == 0


async def test_an_unrenewed_lease_stops_its_attempt_then_exits_the_process(
    keeper: Keeper, caplog: pytest.LogCaptureFixture
) -> None:
    attempt = keeper.claim(1, ttr=8)  # margin: min(1 s, ttr/4) = 1 s
    keeper.run(attempt)
    assert keeper.keeper.check(keeper.clock.now) == pytest.approx(MAX_LOOK)
    assert keeper.keeper.check(keeper.clock.advance(6.5)) == pytest.approx(0.5)
    assert attempt.stop is None
    wake = keeper.keeper.check(keeper.clock.advance(0.5))  # 1 s before the lease passes
    assert attempt.stop is Stop.LEASE and wake == pytest.approx(0.5) and keeper.exits == 0
    assert "could not be renewed" in caplog.text
    # The handler ignores the stop (a sync call blocked in C, say): the runner still runs.
    stopped, attempt.runner = attempt.runner, asyncio.create_task(forever())
    keeper.keeper.check(keeper.clock.advance(0.5))  # half the margin left
    assert keeper.exits == 1 and "exiting now" in caplog.text
    attempt.runner.cancel()
    await asyncio.gather(attempt.runner, stopped or asyncio.sleep(0), return_exceptions=True)


def test_attempts_that_do_not_run_are_not_watched(keeper: Keeper) -> None:
    keeper.claim(1, ttr=4)  # prefetched: waits for a slot, not started
    assert keeper.keeper.check(keeper.clock.advance(10)) == MAX_LOOK
    assert keeper.exits == 0


# -- renewal ----------------------------------------------------------------------


async def test_a_renewal_extends_the_leases_due_and_those_asked_for(keeper: Keeper) -> None:
    due, asked, fresh = keeper.claim(1, ttr=30), keeper.claim(2, ttr=30), keeper.claim(3, ttr=30)
    for attempt in (due, asked, fresh):
        keeper.run(attempt)
        attempt.start_written = True
    signals = asked.signals = AttemptSignals()
    ctx = attempt_context(signals, keeper.clock, job_id=2, task="t", queue="default",
                          attempt=1, fence=7, stage=None, context=None)  # fmt: skip
    keeper.clock.advance(5)
    due.lease_until -= 10  # renewed less recently: a third of its ttr has passed
    ctx.heartbeat()
    answers = Answers()
    await keeper.keeper.renew(store(answers))
    assert answers.asked[0]["held"] == [(1, 7), (2, 7), (3, 7)]
    assert answers.asked[0]["extend"] == [1, 2]
    assert due.lease_until == asked.lease_until == keeper.clock.now + 30
    assert fresh.lease_until == keeper.clock.now - 5 + 30
    await keeper.keeper.renew(store(answers))  # the heartbeat asked once, not twice
    assert answers.asked[1]["extend"] == []
    for attempt in (due, asked, fresh):
        assert attempt.runner is not None
        attempt.runner.cancel()


async def test_a_renewal_writes_the_start_and_the_progress_and_keeps_a_report_it_lost(
    keeper: Keeper,
) -> None:
    attempt = keeper.claim(1)
    keeper.run(attempt)
    signals = attempt.signals = AttemptSignals()
    ctx = attempt_context(signals, keeper.clock, job_id=1, task="t", queue="default",
                          attempt=1, fence=7, stage=None, context=None)  # fmt: skip
    ctx.progress(3, 10)
    answers = Answers()
    answers.fail = True
    with pytest.raises(ConnectionError):
        await keeper.keeper.renew(store(answers))
    answers.fail = False
    await keeper.keeper.renew(store(answers))  # the report comes again
    sent = answers.asked[1]
    assert sent["started"] == {1: keeper.clock.now} and sent["extend"] == [1]
    assert json.loads(sent["progress"][1])["done"] == 3
    assert attempt.start_written
    await keeper.keeper.renew(store(answers))
    assert answers.asked[2]["started"] == {} and answers.asked[2]["progress"] == {}
    assert attempt.runner is not None
    attempt.runner.cancel()


async def test_a_lost_lease_and_a_cancel_stop_their_attempts(keeper: Keeper) -> None:
    lost, cancelled, waiting = keeper.claim(1), keeper.claim(2), keeper.claim(3)
    keeper.run(lost)
    keeper.run(cancelled)
    await asyncio.sleep(0)  # the handlers begin
    await keeper.keeper.renew(store(Answers(lost=[1], cancel=[2, 3])))
    assert lost.stop is Stop.LEASE and cancelled.stop is Stop.CANCEL
    assert keeper.dropped == [3] and waiting.stop is None  # unstarted: dropped, cancelled
    results = await asyncio.gather(*(a.runner for a in (lost, cancelled) if a.runner),
                                   return_exceptions=True)  # fmt: skip
    assert all(isinstance(r, asyncio.CancelledError) for r in results)


async def test_an_ended_attempt_keeps_its_lease_until_its_outcome_is_written(
    keeper: Keeper,
) -> None:
    attempt = keeper.claim(1, ttr=30)
    keeper.run(attempt)
    attempt.start_written = True
    assert attempt.runner is not None
    attempt.runner.cancel()
    del keeper.active[1]
    finish = Finish("succeeded", 1, 7, keeper.clock.now)
    keeper.keeper.ended(attempt, finish)
    keeper.clock.advance(15)
    answers = Answers()
    await keeper.keeper.renew(store(answers))
    assert answers.asked[0]["held"] == [(1, 7)] and answers.asked[0]["extend"] == [1]
    keeper.keeper.written([finish])
    await keeper.keeper.renew(store(answers))
    assert len(answers.asked) == 1  # nothing held: nothing asked


def test_the_heartbeat_comes_often_enough_for_the_shortest_ttr(keeper: Keeper) -> None:
    assert keeper.keeper.renew_within(1.0) == 1.0
    keeper.claim(1, ttr=1.5)
    assert keeper.keeper.renew_within(1.0) == pytest.approx(0.5)


# -- the signals a Context shares with the keeper ---------------------------------


def test_a_context_made_by_hand_still_calls_its_own_heartbeat() -> None:
    called: list[int] = []
    ctx = Context(job_id=1, task="t", queue="q", attempt=1, fence=1, stage=None, context=None,
                  request_heartbeat=lambda: called.append(1))  # fmt: skip
    ctx.heartbeat()
    assert called == [1] and not ctx.cancelled


def test_a_stop_reaches_the_context_made_after_it() -> None:
    attempt = Attempt(claimed(1, 100.0), None, 160.0, COUNTS)
    attempt.interrupt(Stop.SHUTDOWN)  # before its handler began
    executor = Executor(worker="w", clock=FrozenClock(), threads=None, hooks=None,
                        results_of=no_results, wake=lambda: None)  # fmt: skip
    assert executor.context(attempt).cancelled
    assert attempt.signals is not None and attempt.signals.cancelled


async def no_results(job_id: int) -> list[str | None]:
    return []
