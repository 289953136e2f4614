"""Production controls in one process, on both backends, with time injected: time
limits, selective retries, progress and hooks (docs/guarantees.md, "Time limits" to
"Hooks")."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from typing import Any

import pytest

import ferryq
from ferryq import backoff
from ferryq.context import AttemptSignals, attempt_context
from ferryq.store.base import Finish
from ferryq.testing import drain_async
from ferryq.worker.executor import Attempt, Interrupted, Stop, _Thread
from tests.conftest import FrozenClock


async def _until(condition: Any, what: str, within: float = 10.0) -> None:
    """Poll an async condition until it holds (the database offers no event for it)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not await condition():
        assert loop.time() < deadline, f"not true within {within} s: {what}"
        await asyncio.sleep(0.01)


async def _past_the_limit(worker: ferryq.Worker, clock: FrozenClock, seconds: float) -> None:
    """Move time past a running attempt's limit and let the worker's watch see it."""
    clock.advance(seconds)
    worker.leases.look_now()


# -- time limits -----------------------------------------------------------------------


async def test_an_async_handler_past_its_limit_times_out_and_retries(
    app: ferryq.App, clock: FrozenClock
) -> None:
    started = asyncio.Event()

    @app.task(timeout=5, max_tries=2, retry=backoff.fixed(0))
    async def hang() -> None:
        started.set()
        await asyncio.Event().wait()

    handle = await hang.enqueue_async()
    worker = ferryq.Worker(app, burst=True, handle_signals=False)
    runner = asyncio.create_task(worker.run())
    for _ in range(2):  # both tries time out
        await started.wait()
        started.clear()
        await _past_the_limit(worker, clock, 5)
    await runner
    job = await app.get_job_async(handle.id)
    assert job.state == "dead" and job.attempts == 2 and job.timeout == 5
    assert [e["type"] for e in job.errors] == ["TimedOut", "TimedOut"]
    assert job.error is not None and "time limit of 5 s" in job.error["message"]


async def test_a_sync_handler_in_a_busy_loop_is_interrupted_at_its_limit(
    app: ferryq.App, clock: FrozenClock
) -> None:
    started = threading.Event()

    @app.task(max_tries=2, retry=backoff.fixed(0))
    def spin() -> None:
        started.set()
        while True:
            pass

    handle = await spin.options(timeout=2).enqueue_async()
    worker = ferryq.Worker(app, burst=True, handle_signals=False, concurrency=1)
    runner = asyncio.create_task(worker.run())
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, started.wait)
    started.clear()
    await _past_the_limit(worker, clock, 2)
    await loop.run_in_executor(None, started.wait)  # retried, and timed out again
    await _past_the_limit(worker, clock, 2)
    await runner
    job = await app.get_job_async(handle.id)
    assert job.state == "dead" and [e["type"] for e in job.errors] == ["TimedOut"] * 2


async def test_a_late_result_after_the_limit_is_dropped(
    app: ferryq.App, clock: FrozenClock
) -> None:
    started = asyncio.Event()

    @app.task(timeout=1, max_tries=1)
    async def stubborn() -> str:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            return "late"  # swallows the stop and answers anyway
        return "never"

    handle = await stubborn.enqueue_async()
    worker = ferryq.Worker(app, burst=True, handle_signals=False)
    runner = asyncio.create_task(worker.run())
    await started.wait()
    await _past_the_limit(worker, clock, 1)
    await runner
    job = await app.get_job_async(handle.id)
    assert job.state == "dead" and job.result is None
    assert job.error is not None and job.error["type"] == "TimedOut"


async def test_the_fence_refuses_a_timed_out_attempts_completion(
    app: ferryq.App, clock: FrozenClock
) -> None:
    started = asyncio.Event()

    @app.task(timeout=1, max_tries=3, retry=backoff.fixed(60))
    async def hang() -> None:
        started.set()
        await asyncio.Event().wait()

    handle = await hang.enqueue_async()
    worker = ferryq.Worker(app, burst=True, handle_signals=False)
    runner = asyncio.create_task(worker.run())
    await started.wait()
    await _past_the_limit(worker, clock, 1)
    await runner
    store = await app.store()
    job = await app.get_job_async(handle.id)
    assert job.state == "scheduled" and job.errors[-1]["type"] == "TimedOut"
    clock.advance(60)  # due again: the next claim takes a new fence
    (claimed,) = await store.job_claim(app.namespace, [job.queue], 1, "other", clock())
    assert claimed.fence == job.fence + 1
    late = Finish("succeeded", handle.id, job.fence, clock(), result='"late"')
    report = await store.job_finish_many([late])
    assert report.stale == [handle.id] and report.accepted == []


async def test_cancel_interrupts_a_running_sync_handler_that_never_looks(
    app: ferryq.App,
) -> None:
    started = threading.Event()

    @app.task
    def deaf() -> None:
        started.set()
        while True:  # never reads ctx.cancelled
            pass

    handle = await deaf.enqueue_async()
    worker = ferryq.Worker(app, heartbeat_interval=0.01, handle_signals=False, concurrency=1)
    runner = asyncio.create_task(worker.run())
    await asyncio.get_running_loop().run_in_executor(None, started.wait)
    await handle.cancel_async()
    with pytest.raises(ferryq.JobCancelled):
        await handle.result_async(timeout=10)
    worker.stop()
    await runner
    assert not worker.active


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_an_attempt_stopped_before_its_handler_began_ends_without_running_it(
    app: ferryq.App, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancel seen by a renewal answering in the same step as the claim's start:
    the attempt's runner has not taken its first step yet."""
    ran: list[int] = []
    if kind == "async":

        @app.task(name="job")
        async def job_async() -> None:
            ran.append(1)

    else:

        @app.task(name="job")
        def job_sync() -> None:
            ran.append(1)

    handle = await app.enqueue_async("job")
    worker = ferryq.Worker(app, burst=True, handle_signals=False)
    launch = worker._launch

    def launch_then_cancel(attempt: Attempt) -> None:
        launch(attempt)
        attempt.interrupt(Stop.CANCEL)

    monkeypatch.setattr(worker, "_launch", launch_then_cancel)
    async with asyncio.timeout(20):  # before, the attempt stayed "running" for ever
        await worker.run()
    assert ran == [] and not worker.active and worker._running == 0
    with pytest.raises(ferryq.JobCancelled):
        await handle.result_async(timeout=0)


def test_a_sync_handler_interrupted_while_it_waits_for_a_thread_never_runs() -> None:
    ran: list[int] = []
    thread = _Thread()
    thread.interrupt()
    with pytest.raises(Interrupted):
        thread.call(ran.append, [1], {})
    assert ran == []


def test_a_time_limit_must_be_positive(app: ferryq.App) -> None:
    with pytest.raises(ValueError, match="timeout"):

        @app.task(timeout=0)
        def never() -> None: ...

    @app.task
    def task() -> None: ...

    with pytest.raises(ValueError, match="timeout"):
        task.options(timeout=-1)


# -- selective retries -----------------------------------------------------------------


class BadInput(Exception):
    pass


class Flaky(Exception):
    pass


@pytest.mark.parametrize(
    ("raised", "retry_on", "fail_on", "attempts"),
    [
        (BadInput, None, BadInput, 1),  # fail_on: dead at once
        (BadInput, Flaky, None, 1),  # not in retry_on: dead at once
        (Flaky, (Flaky, ConnectionError), None, 3),  # in retry_on: every try
        (Flaky, None, (BadInput,), 3),  # neither: the usual tries
    ],
)
async def test_retry_on_and_fail_on_choose_what_retries(
    app: ferryq.App,
    clock: FrozenClock,
    raised: type[Exception],
    retry_on: Any,
    fail_on: Any,
    attempts: int,
) -> None:
    @app.task(max_tries=3, retry=backoff.fixed(0), retry_on=retry_on, fail_on=fail_on)
    async def work() -> None:
        raise raised("no")

    handle = await work.enqueue_async()
    await drain_async(app)
    job = await app.get_job_async(handle.id)
    assert job.state == "dead" and job.attempts == attempts
    assert job.error is not None and job.error["type"] == raised.__name__
    assert "raise raised" in job.error["traceback"]


async def test_retry_and_fail_keep_working_beside_retry_on(
    app: ferryq.App, clock: FrozenClock
) -> None:
    @app.task(max_tries=3, retry=backoff.fixed(0), retry_on=Flaky)
    async def asks(what: str) -> None:
        raise ferryq.Retry(after=0) if what == "retry" else ferryq.Fail("stop")

    again = await asks.enqueue_async("retry")
    stop = await asks.enqueue_async("fail")
    await drain_async(app)
    assert (await app.get_job_async(again.id)).attempts == 3
    assert (await app.get_job_async(stop.id)).attempts == 1


def test_retry_on_takes_exception_classes_only(app: ferryq.App) -> None:
    with pytest.raises(ValueError, match="retry_on"):

        @app.task(retry_on="ValueError")  # type: ignore[call-overload, untyped-decorator]
        def wrong() -> None: ...

    assert not app.tasks

    @app.task(fail_on=ValueError)
    def right() -> None: ...

    with pytest.raises(TypeError, match="fail_on"):  # per task, not per enqueue
        right.options(fail_on=ValueError)


# -- progress --------------------------------------------------------------------------


async def test_progress_is_stored_while_running_and_cleared_by_the_next_claim(
    app: ferryq.App, clock: FrozenClock
) -> None:
    reported, go_on = asyncio.Event(), asyncio.Event()

    @app.task(max_tries=2, retry=backoff.fixed(0))
    async def long(ctx: ferryq.Context) -> None:
        if ctx.attempt == 1:
            for done in range(1, 1001):  # a tight loop costs nothing: the last one counts
                ctx.progress(done, 1000, note="rows <b>")
            reported.set()
            await go_on.wait()
            raise Flaky("first try fails")
        reported.set()
        await go_on.wait()

    handle = await long.enqueue_async()
    worker = ferryq.Worker(app, heartbeat_interval=0.01, handle_signals=False)
    runner = asyncio.create_task(worker.run())
    await reported.wait()

    async def stored() -> bool:
        return (await app.get_job_async(handle.id)).progress is not None

    await _until(stored, "the progress stored")
    progress = (await app.get_job_async(handle.id)).progress
    assert progress is not None
    assert (progress["done"], progress["total"], progress["note"]) == (1000, 1000, "rows <b>")
    reported.clear()
    go_on.set()
    await reported.wait()  # the second attempt runs: it has reported nothing
    job = await app.get_job_async(handle.id)
    assert job.attempts == 2 and job.progress is None
    worker.stop()
    await runner


def test_progress_refuses_what_is_not_an_amount() -> None:
    signals = AttemptSignals()
    ctx = attempt_context(signals, lambda: 1234.5, job_id=1, task="t", queue="q", attempt=1,
                          fence=1, stage=None, context=None)  # fmt: skip
    for bad in (-1, float("nan"), float("inf"), "3", True):
        with pytest.raises(ValueError, match="done"):
            ctx.progress(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="total"):
        ctx.progress(1, -2)
    with pytest.raises(ValueError, match="note"):
        ctx.progress(1, note=3)  # type: ignore[arg-type]
    ctx.progress(2.5, note="x" * 1000)
    report = json.loads(signals.take_progress() or "{}")
    assert len(report["note"]) == 255 and report["at"] == 1234.5  # the App's clock


# -- hooks -----------------------------------------------------------------------------


async def test_attempt_hooks_wrap_in_order_sync_and_async(
    app: ferryq.App, clock: FrozenClock
) -> None:
    seen: list[str] = []

    class Outer:
        def before_attempt(self, ctx: ferryq.Context) -> None:
            seen.append(f"outer before {ctx.attempt}")

        async def after_attempt(self, ctx: ferryq.Context, outcome: ferryq.Outcome) -> None:
            await asyncio.sleep(0)
            seen.append(f"outer after {outcome.kind} {outcome.error}")

    app.use(Outer())

    @app.hooks.before_attempt
    async def inner_before(ctx: ferryq.Context) -> None:
        seen.append("inner before")

    @app.hooks.after_attempt
    def inner_after(ctx: ferryq.Context, outcome: ferryq.Outcome) -> None:
        seen.append(f"inner after {outcome.kind} {outcome.result}")

    @app.task(max_tries=2, retry=backoff.fixed(0))
    def work(ctx: ferryq.Context) -> int:
        seen.append("handler")
        if ctx.attempt == 1:
            raise Flaky("once")
        return 7

    await work.enqueue_async()
    await drain_async(app, concurrency=1)
    assert seen == [
        "outer before 1", "inner before", "handler", "inner after retry None",
        "outer after retry Flaky: once",
        "outer before 2", "inner before", "handler", "inner after succeeded 7",
        "outer after succeeded None",
    ]  # fmt: skip


async def test_a_hook_that_raises_loses_no_job(
    app: ferryq.App, clock: FrozenClock, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: object) -> None:
        raise RuntimeError("hook bug")

    for event in ("before_enqueue", "after_enqueue", "before_attempt", "after_attempt"):
        getattr(app.hooks, event)(broken)

    @app.task
    async def fine() -> str:
        return "ok"

    with caplog.at_level(logging.ERROR, logger="ferryq.hooks"):
        handles = [await fine.enqueue_async() for _ in range(3)]
        await drain_async(app)
    for handle in handles:
        assert await handle.result_async(timeout=1) == "ok"
    complaints = [r for r in caplog.records if r.name == "ferryq.hooks"]
    assert len(complaints) == 1 and "hook bug" in complaints[0].exc_text  # type: ignore[operator]


async def test_enqueue_hooks_add_metadata_and_see_ids(app: ferryq.App) -> None:
    seen: list[tuple[str, int, list[int]]] = []

    @app.hooks.before_enqueue
    async def tag(enqueue: ferryq.Enqueue) -> None:
        enqueue.meta["origin"] = {"request": "r-1"}

    @app.hooks.after_enqueue
    def note(enqueue: ferryq.Enqueue) -> None:
        seen.append((enqueue.task, enqueue.count, enqueue.ids))

    @app.task
    def job(n: int) -> None: ...

    handles = await job.enqueue_many_async([(1,), (2,)])
    one = job.enqueue(3)  # the sync path runs them too
    assert seen == [(job.name, 2, [h.id for h in handles]), (job.name, 1, [one.id])]
    assert (await app.get_job_async(one.id)).meta == {"origin": {"request": "r-1"}}


async def test_an_enqueue_that_fails_tells_its_hooks_and_writes_nothing(
    app: ferryq.App,
) -> None:
    failures: list[BaseException | None] = []

    @app.hooks.before_enqueue
    def unstorable(enqueue: ferryq.Enqueue) -> None:
        enqueue.meta["bad"] = object()

    @app.hooks.after_enqueue
    def note(enqueue: ferryq.Enqueue) -> None:
        failures.append(enqueue.exception)

    @app.task
    def job() -> None: ...

    with pytest.raises(ferryq.SerializationError, match="meta"):
        await job.enqueue_async()
    assert isinstance(failures[0], ferryq.SerializationError)
    assert await app.list_jobs_async() == []


def test_use_refuses_an_object_without_hooks(app: ferryq.App) -> None:
    with pytest.raises(TypeError, match="hook methods"):
        app.use(object())
