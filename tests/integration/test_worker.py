"""Job semantics end to end: App, Store and Worker together, with a frozen clock."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import sys
import threading
import time
from typing import Any

import pytest

import ferryq
from ferryq import metrics
from ferryq.store.base import Finish
from ferryq.store.postgres.store import PostgresStore
from ferryq.testing import drain_async
from ferryq.worker.maintenance import Maintenance
from tests.conftest import FrozenClock


async def test_async_and_sync_handlers_return_results(app: ferryq.App) -> None:
    @app.task
    async def add(a: int, b: int) -> int:
        return a + b

    @app.task
    def shout(word: str, times: int = 1) -> str:
        assert threading.current_thread() is not threading.main_thread()
        return word.upper() * times

    h1 = await add.enqueue_async(2, 3)
    h2 = await shout.enqueue_async("hi", times=2)
    assert (await drain_async(app)).finished == 2
    assert await h1.result_async(timeout=1) == 5
    assert await h2.result_async(timeout=1) == "HIHI"
    job = await app.get_job_async(h1.id)
    assert job.state == "succeeded" and job.attempts == 1 and job.fence == 1
    assert job.started_at is not None and job.finished_at is not None


def test_sync_api_from_plain_code(app: ferryq.App) -> None:
    @app.task(queue="mail")
    async def send(to: str) -> dict[str, str]:
        return {"sent": to}

    handle = send.enqueue("a@example.com")
    many = send.enqueue_many([("b@example.com",), {"to": "c@example.com"}])
    assert handle.status() == "ready" and len(many) == 2
    assert asyncio.run(send("inline")) == {"sent": "inline"}  # a plain call runs inline
    ferryq.testing.drain(app)
    assert handle.result(timeout=1) == {"sent": "a@example.com"}
    assert [h.result(timeout=1) for h in many] == [{"sent": "b@example.com"},
                                                   {"sent": "c@example.com"}]  # fmt: skip


def test_an_event_loop_per_call_leaves_no_store_behind(backend_url: str) -> None:
    # asyncio.run() per call: each loop's store goes when the next loop asks for one.
    app = ferryq.App(backend_url)

    async def enqueue() -> int:
        return (await app.enqueue_async("t", [1])).id

    asyncio.run(enqueue())
    threads = threading.active_count()
    ids = [asyncio.run(enqueue()) for _ in range(5)]
    assert len(app._stores) == 1 and threading.active_count() <= threads
    assert ids == sorted(ids)
    app.close()


async def test_context_carries_the_attempt(app: ferryq.App) -> None:
    seen: list[tuple[int, int, int]] = []

    @app.task(max_tries=2, retry=ferryq.backoff.fixed(0))
    async def flaky(ctx: ferryq.Context) -> None:
        seen.append((ctx.job_id, ctx.attempt, ctx.fence))
        if ctx.attempt == 1:
            raise RuntimeError("first try fails")

    handle = await flaky.enqueue_async()
    await drain_async(app)
    assert seen == [(handle.id, 1, 1), (handle.id, 2, 2)]
    assert (await app.get_job_async(handle.id)).state == "succeeded"


async def test_context_can_stand_anywhere_in_the_signature(app: ferryq.App) -> None:
    @app.task
    async def first(ctx: ferryq.Context, word: str, times: int = 1) -> str:
        return f"{ctx.attempt}:{word * times}"

    @app.task
    def last(word: str, ctx: ferryq.Context) -> str:
        return f"{ctx.fence}:{word}"

    handles = [
        await first.enqueue_async("a", 2),
        await first.enqueue_async("b", times=3),
        await first.enqueue_async(word="c"),
        await app.enqueue_async(last.name, ["d"]),
    ]
    await drain_async(app)
    assert [await h.result_async(timeout=1) for h in handles] == ["1:aa", "1:bbb", "1:c", "1:d"]
    assert await first("inline", 2) == "1:inlineinline"


async def test_failures_retry_with_backoff_then_die(app: ferryq.App, clock: FrozenClock) -> None:
    @app.task(max_tries=3, retry=ferryq.backoff.exponential(cap=60))
    async def broken() -> None:
        raise ValueError("always broken")

    handle = await broken.enqueue_async()
    await drain_async(app)
    job = await app.get_job_async(handle.id)
    assert job.state == "scheduled" and job.run_at == clock.now + 1
    assert job.error is not None and "always broken" in job.error["traceback"]
    explained = await app.explain_async(handle.id)
    assert explained.reason == "backoff" and "always broken" in explained.message
    clock.advance(1)
    await drain_async(app)
    assert (await app.get_job_async(handle.id)).run_at == clock.now + 2
    clock.advance(2)
    await drain_async(app)
    job = await app.get_job_async(handle.id)
    assert job.state == "dead" and job.attempts == 3 and len(job.errors) == 3
    with pytest.raises(ferryq.JobDead, match="always broken"):
        await handle.result_async(timeout=1)


async def test_a_retry_ignores_the_jobs_priority(app: ferryq.App, clock: FrozenClock) -> None:
    # docs/guarantees.md, "Order": a failing high-priority job cannot monopolise workers.
    @app.task(max_tries=3, retry=ferryq.backoff.fixed(10))
    async def urgent() -> None:
        raise ValueError("down")

    handle = await urgent.options(priority=600).enqueue_async()
    assert (await app.get_job_async(handle.id)).order_time == clock.now - 600
    await drain_async(app)
    job = await app.get_job_async(handle.id)
    assert job.state == "scheduled" and job.priority == 600
    assert job.run_at == job.order_time == clock.now + 10


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no words")


async def test_whatever_a_handler_raises_fails_its_attempt_and_the_worker_goes_on(
    app: ferryq.App,
) -> None:
    # Not a stop of the worker's own, so each try counts and the job ends dead.
    @app.task(max_tries=2, retry=ferryq.backoff.fixed(0))
    async def cancels_itself() -> None:
        raise asyncio.CancelledError

    @app.task(max_tries=1)
    def waits_on_a_cancelled_future() -> None:
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        future.cancel()
        future.result()

    @app.task(max_tries=1)
    async def unprintable() -> None:
        raise _Unprintable

    @app.task(max_tries=1)
    def exits() -> None:
        sys.exit(3)

    @app.task(max_tries=1)
    async def interrupted() -> None:
        raise KeyboardInterrupt

    @app.task
    async def after() -> str:
        return "done"

    handles = [await t.enqueue_async() for t in (cancels_itself, waits_on_a_cancelled_future,
                                                  unprintable, exits, interrupted)]  # fmt: skip
    then = await after.enqueue_async()
    await drain_async(app)
    errors = []
    for handle in handles:
        job = await app.get_job_async(handle.id)
        assert job.state == "dead" and job.attempts == job.max_tries and job.error, job
        errors.append(job.error)
    assert "its message could not be read" in errors[2]["message"]
    assert errors[3]["type"] == "SystemExit"
    assert await then.result_async(timeout=1) == "done"


async def test_retry_and_fail_from_the_handler(app: ferryq.App, clock: FrozenClock) -> None:
    @app.task(max_tries=5)
    async def later() -> None:
        raise ferryq.Retry(after=30)

    @app.task(max_tries=5)
    async def never() -> None:
        raise ferryq.Fail("bad input, do not retry")

    h_later = await later.enqueue_async()
    h_never = await never.enqueue_async()
    await drain_async(app)
    assert (await app.get_job_async(h_later.id)).run_at == clock.now + 30
    dead = await app.get_job_async(h_never.id)
    assert dead.state == "dead" and dead.attempts == 1
    assert dead.error is not None and dead.error["message"] == "bad input, do not retry"


async def test_unknown_task_dies_with_a_clear_error_and_the_worker_goes_on(
    app: ferryq.App,
) -> None:
    @app.task
    async def known() -> str:
        return "fine"

    stray = await app.enqueue_async("nobody.knows", [1], max_tries=1)
    good = await known.enqueue_async()
    await drain_async(app)
    job = await app.get_job_async(stray.id)
    assert job.state == "dead" and "unknown task 'nobody.knows'" in job.error["message"]  # type: ignore[index]
    assert await good.result_async(timeout=1) == "fine"


async def test_a_jobs_options_are_fixed_when_it_is_enqueued(
    app: ferryq.App, backend_url: str, clock: FrozenClock
) -> None:
    @app.task(name="mail.send", queue="mail", ttr=5, max_tries=7)
    async def send(to: str) -> str:
        return to

    sender = ferryq.App(backend_url, clock=clock)  # knows no task: enqueues by name
    try:
        bare = await sender.enqueue_async("mail.send", ["a"], queue="mail")
        given = await sender.enqueue_async("mail.send", ["b"], queue="mail", ttr=5, max_tries=7)
    finally:
        await sender.aclose()
        sender.close()
    registered = await send.enqueue_async("c")
    assert (await drain_async(app)).finished == 3
    options: dict[str, tuple[float, int]] = {}
    for handle in (bare, given, registered):
        job = await app.get_job_async(handle.id)
        assert job.state == "succeeded"
        options[job.args[0]] = (job.ttr, job.max_tries)
    # Each job kept the options it was enqueued with, though the worker knows others.
    assert options == {"a": (60.0, 3), "b": (5.0, 7), "c": (5.0, 7)}


async def test_a_result_that_is_not_json_is_a_permanent_failure(app: ferryq.App) -> None:
    @app.task(max_tries=3)
    async def odd() -> object:
        return object()

    handle = await odd.enqueue_async()
    await drain_async(app)
    job = await app.get_job_async(handle.id)
    assert job.state == "dead" and job.attempts == 1
    assert "cannot be stored as JSON" in job.error["message"]  # type: ignore[index]


async def test_bad_input_at_enqueue_writes_nothing(app: ferryq.App) -> None:
    @app.task
    async def take(value: Any) -> None:
        return None

    with pytest.raises(ferryq.SerializationError, match="arguments of"):
        await take.enqueue_async({1, 2})
    with pytest.raises(ferryq.SerializationError, match="over the limit of 1048576 bytes"):
        await take.enqueue_async("x" * (2 << 20))
    with pytest.raises(ferryq.SerializationError, match=r"arguments of .*: 1200004 bytes"):
        await take.enqueue_async("é" * 600_000)  # fewer characters than the limit
    with pytest.raises(ferryq.SerializationError, match="context"):
        await take.options(context="y" * (2 << 20)).enqueue_async(1)
    with pytest.raises(ValueError, match="ttr"):
        take.options(ttr=0)
    with pytest.raises(ValueError, match="max_tries"):
        take.options(max_tries=0)
    with pytest.raises(ValueError, match="priority"):
        take.options(priority=400 * 86400)
    with pytest.raises(ValueError, match="delay"):
        take.options(delay=-1)
    with pytest.raises(TypeError, match="unexpected keyword"):
        await take.enqueue_async(value=1, other=2)
    # What one backend could store and another could not is refused on both.
    with pytest.raises(ValueError, match="lane must not contain NUL"):
        take.options(lane="post:\x00")
    with pytest.raises(ValueError, match="task must not contain NUL"):
        await app.enqueue_async("take\x00", [1])
    with pytest.raises(ferryq.SerializationError, match=r"meta cannot be stored: .* NUL"):
        await take.options(meta={"note": "a\x00b"}).enqueue_async(1)
    assert await app.list_jobs_async() == []


async def test_an_error_no_database_could_store_is_kept_escaped(app: ferryq.App) -> None:
    @app.task(max_tries=1)
    async def odd(text: str) -> None:
        raise ValueError(text + " and half a pair \ud800")

    @app.task
    async def after() -> str:
        return "done"

    handle = await odd.enqueue_async("nul \x00")
    await drain_async(app)
    job = await app.get_job_async(handle.id)
    assert job.state == "dead"
    assert job.error is not None and job.error["message"] == "nul \\x00 and half a pair \\ud800"
    assert "\\x00" in job.error["traceback"]
    then = await after.enqueue_async()
    await drain_async(app)
    assert await then.result_async(timeout=1) == "done"


async def test_a_call_the_handler_cannot_take_is_refused_at_enqueue(app: ferryq.App) -> None:
    @app.task
    async def one(a: int) -> int:
        return a

    @app.task
    async def positional_only(a: int, /, b: int) -> int:
        return a * 10 + b

    untyped: Any = one  # as from code that no type checker reads
    for args, kwargs in (((), {}), ((1, 2), {}), ((), {"b": 1})):
        with pytest.raises(TypeError, match="one"):
            await untyped.enqueue_async(*args, **kwargs)
    with pytest.raises(TypeError, match="list or tuple of arguments"):
        await untyped.enqueue_many_async(["ab@x"])
    assert await app.list_jobs_async() == []
    mixed = await positional_only.enqueue_async(1, b=2)  # stored as [1, 2]: it can run
    await drain_async(app)
    assert await mixed.result_async(timeout=1) == 12


class _Greeter:
    async def __call__(self, name: str) -> str:
        return f"hello {name}"


async def test_odd_but_fair_uses_of_the_api(app: ferryq.App) -> None:
    @app.task
    async def optional_context(ctx: ferryq.Context | None = None) -> int:
        assert ctx is not None
        return ctx.attempt

    greet = app.task(name="greet")(_Greeter())
    handles = [await optional_context.enqueue_async(), await greet.enqueue_async("you")]
    await drain_async(app)
    assert [await h.result_async(timeout=1) for h in handles] == [1, "hello you"]
    with pytest.raises(ferryq.ConfigurationError, match="name="):
        app.task(functools.partial(_Greeter()))
    with pytest.raises(TypeError, match="a job id is an int"):
        await app.get_job_async(1.5)  # type: ignore[arg-type]
    with pytest.raises(ferryq.JobNotFound):
        await app.get_job_async(2**70)
    assert await app.respawn_async([2**70, -1]) == []
    with pytest.raises(ValueError, match="nan"):
        await handles[0].result_async(timeout=float("nan"))
    with pytest.raises(RuntimeError, match="run_worker_async"):
        app.run_worker(burst=True)


async def test_delays_and_priorities(app: ferryq.App, clock: FrozenClock) -> None:
    order: list[str] = []

    @app.task
    async def mark(name: str) -> None:
        order.append(name)

    await mark.enqueue_async("old")
    clock.advance(10)
    await mark.enqueue_async("young")
    await mark.options(priority=60).enqueue_async("urgent")
    delayed = await mark.options(delay=30).enqueue_async("delayed")
    await drain_async(app, concurrency=1, prefetch=0)
    assert order == ["urgent", "old", "young"]
    assert (await app.explain_async(delayed.id)).reason == "scheduled"
    clock.advance(30)
    await drain_async(app)
    assert order[-1] == "delayed"


async def test_ttl_expires_a_job_that_did_not_run(app: ferryq.App, clock: FrozenClock) -> None:
    @app.task
    async def slow() -> None:
        return None

    handle = await slow.options(ttl=20, delay=10).enqueue_async()
    clock.advance(20)
    assert (await app.explain_async(handle.id)).reason == "expiring"
    await drain_async(app)  # the burst's maintenance round expires it; it never runs
    with pytest.raises(ferryq.JobExpired):
        await handle.result_async(timeout=1)


async def test_a_prefetched_job_whose_ttl_passes_is_never_started(
    app: ferryq.App, clock: FrozenClock
) -> None:
    started: list[str] = []

    @app.task
    async def work(name: str) -> None:
        started.append(name)
        if name == "slow":
            clock.advance(20)  # the job prefetched behind it expires meanwhile

    await work.enqueue_async("slow")
    clock.advance(1)
    short_lived = await work.options(ttl=10).enqueue_async("short-lived")
    await drain_async(app, concurrency=1, prefetch=1)
    assert started == ["slow"]
    delays = metrics.METRICS.snapshot()["ferryq_job_start_delay_seconds"]
    assert any(labels == ["default", "default"] for labels, _ in delays)
    # Handed back unstarted, uncharged; the leader's next round expires it.
    job = await app.get_job_async(short_lived.id)
    assert job.state == "ready" and job.attempts == 0
    assert (await app.explain_async(short_lived.id)).reason == "expiring"
    await drain_async(app)
    assert started == ["slow"]
    assert (await app.get_job_async(short_lived.id)).state == "expired"


async def test_dedup_through_the_api(app: ferryq.App, clock: FrozenClock) -> None:
    @app.task
    async def digest(user: int) -> None:
        return None

    first = await digest.options(unique_key="digest:1", unique_for=600).enqueue_async(1)
    again = await digest.options(unique_key="digest:1", unique_for=600).enqueue_async(1)
    assert first.created and not again.created and again.id == first.id
    await drain_async(app)
    clock.advance(300)
    assert (
        await digest.options(unique_key="digest:1", unique_for=600).enqueue_async(1)
    ).id == first.id
    clock.advance(301)
    assert (await digest.options(unique_key="digest:1", unique_for=600).enqueue_async(1)).created


async def test_result_waits_and_times_out(app: ferryq.App) -> None:
    handle = await app.enqueue_async("never.runs")
    with pytest.raises(ferryq.ResultTimeout, match="still ready"):
        await handle.result_async(timeout=0.05)


async def test_cancel_a_pending_job(app: ferryq.App) -> None:
    handle = await app.enqueue_async("x.y", delay=60)
    assert (await handle.cancel_async()).state == "cancelled"
    with pytest.raises(ferryq.JobCancelled):
        await handle.result_async()
    assert (await handle.explain_async()).reason == "cancelled"


async def _run_worker_until(worker: ferryq.Worker, condition: asyncio.Event) -> None:
    runner = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(condition.wait(), 10)
    finally:
        worker.stop()
        await runner


async def test_cancel_a_running_async_job(app: ferryq.App) -> None:
    started, finished = asyncio.Event(), asyncio.Event()

    @app.task
    async def forever() -> None:
        started.set()
        await asyncio.Event().wait()

    handle = await forever.enqueue_async()
    worker = ferryq.Worker(app, heartbeat_interval=0.01, handle_signals=False)

    async def cancel_when_started() -> None:
        await started.wait()
        assert (await handle.explain_async()).reason == "running"
        await handle.cancel_async()
        assert (await handle.explain_async()).reason == "cancelling"
        with pytest.raises(ferryq.JobCancelled):
            await handle.result_async(timeout=10)
        finished.set()

    canceller = asyncio.create_task(cancel_when_started())
    await _run_worker_until(worker, finished)
    await canceller


async def test_cancel_a_running_sync_job_sets_ctx_cancelled(app: ferryq.App) -> None:
    started = threading.Event()
    finished = asyncio.Event()

    @app.task
    def polite(ctx: ferryq.Context) -> str:
        started.set()
        while not ctx.cancelled:
            time.sleep(0.001)
        return "stopped early"

    handle = await polite.enqueue_async()
    worker = ferryq.Worker(app, heartbeat_interval=0.01, handle_signals=False)

    async def cancel_when_started() -> None:
        await asyncio.get_running_loop().run_in_executor(None, started.wait)
        await handle.cancel_async()
        with pytest.raises(ferryq.JobCancelled):
            await handle.result_async(timeout=10)
        finished.set()

    canceller = asyncio.create_task(cancel_when_started())
    await _run_worker_until(worker, finished)
    await canceller


async def test_the_worker_renews_the_lease_of_a_long_job(
    app: ferryq.App, clock: FrozenClock
) -> None:
    started, go_on = asyncio.Event(), asyncio.Event()

    @app.task(ttr=6)
    async def long() -> str:
        started.set()
        await go_on.wait()
        return "done"

    handle = await long.enqueue_async()
    worker = ferryq.Worker(app, heartbeat_interval=60, handle_signals=False)
    runner = asyncio.create_task(worker.run())
    await started.wait()
    await worker._beat()  # writes when the handler began: now, as the claim was
    clock.advance(1)
    await worker._beat()  # a third of the ttr has not passed: the lease stays
    assert (await app.get_job_async(handle.id)).lease_until == clock.now - 1 + 6
    clock.advance(3)
    await worker._beat()  # (the worker beats every ttr/3 s on its own as well)
    assert (await app.get_job_async(handle.id)).lease_until == clock.now + 6
    go_on.set()
    assert await handle.result_async(timeout=10) == "done"
    worker.stop()
    await runner


async def test_a_lost_lease_stops_the_attempt(app: ferryq.App, clock: FrozenClock) -> None:
    started, stopped = asyncio.Event(), asyncio.Event()

    @app.task(ttr=30, max_tries=5, retry=ferryq.backoff.fixed(100))
    async def stuck() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            stopped.set()
            raise

    handle = await stuck.enqueue_async()
    worker = ferryq.Worker(app, heartbeat_interval=0.01, handle_signals=False)
    runner = asyncio.create_task(worker.run())
    await started.wait()
    # The worker looked dead to the leader, which recovered the job meanwhile.
    job = await app.get_job_async(handle.id)
    store = await app.store()
    error = {"message": "recovered"}
    recovered = Finish("retry", job.id, job.fence, clock.now, run_at=clock.now + 100, error=error)
    assert (await store.job_finish_many([recovered])).accepted == [job.id]
    await stopped.wait()
    worker.stop()
    await runner
    assert worker.stale_completions == 1
    assert (await app.get_job_async(handle.id)).error == {"message": "recovered"}


async def test_a_renewal_answered_after_the_job_was_claimed_again_stops_nothing(
    app: ferryq.App, clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A renewal asks about the first attempt, whose outcome is still unwritten; its
    answer comes once that outcome is written and the job claimed again here, with a
    new fence. The first attempt's lease is gone, but the second attempt is not it."""
    first_started, second_started = asyncio.Event(), asyncio.Event()
    first_go_on, second_go_on = asyncio.Event(), asyncio.Event()

    @app.task(max_tries=2, retry=ferryq.backoff.fixed(0))
    async def again(ctx: ferryq.Context) -> str:
        if ctx.attempt == 1:
            first_started.set()
            await first_go_on.wait()
            raise RuntimeError("the first try fails")
        second_started.set()
        await second_go_on.wait()
        return "done"

    handle = await again.enqueue_async()
    worker = ferryq.Worker(app, heartbeat_interval=60, handle_signals=False)
    runner = asyncio.create_task(worker.run())
    await first_started.wait()
    store = await app.store()
    write_waits, write_on, read_waits, read_on = (asyncio.Event() for _ in range(4))
    finish_and_claim, leases = store.job_finish_and_claim, store.job_leases

    async def finish_later(finishes: list[Finish], *args: Any) -> Any:
        if finishes:
            write_waits.set()
            await write_on.wait()
        return await finish_and_claim(finishes, *args)

    async def read_later(*args: Any) -> Any:
        read_waits.set()
        await read_on.wait()
        return await leases(*args)

    monkeypatch.setattr(store, "job_finish_and_claim", finish_later)
    first_go_on.set()
    await write_waits.wait()  # the first attempt ended; its outcome is not written
    monkeypatch.setattr(store, "job_leases", read_later)
    beat = asyncio.create_task(worker._beat())  # asks about the first attempt's lease
    await read_waits.wait()
    write_on.set()
    await second_started.wait()  # written, claimed again and started
    read_on.set()
    await beat  # answers: the fence asked about is not the job's any more
    second_go_on.set()
    assert await handle.result_async(timeout=10) == "done"
    worker.stop()
    await runner
    job = await app.get_job_async(handle.id)
    assert (job.state, job.attempts) == ("succeeded", 2)


async def test_heartbeat_extends_the_lease(app: ferryq.App, clock: FrozenClock) -> None:
    beat, go_on = asyncio.Event(), asyncio.Event()

    @app.task(ttr=10)
    async def long(ctx: ferryq.Context) -> str:
        clock.advance(8)
        ctx.heartbeat()
        beat.set()
        await go_on.wait()
        return "done"

    handle = await long.enqueue_async()
    worker = ferryq.Worker(app, heartbeat_interval=30, handle_signals=False)
    runner = asyncio.create_task(worker.run())
    await beat.wait()
    for _ in range(1000):  # the worker writes the heartbeat within milliseconds
        if (await app.get_job_async(handle.id)).lease_until == clock.now + 10:
            break
        await asyncio.sleep(0.001)
    assert (await app.get_job_async(handle.id)).lease_until == clock.now + 10
    go_on.set()
    assert await handle.result_async(timeout=10) == "done"
    worker.stop()
    await runner


async def test_graceful_stop_returns_unfinished_jobs_without_charging_a_try(
    app: ferryq.App,
) -> None:
    started = asyncio.Event()

    @app.task
    async def endless() -> None:
        started.set()
        await asyncio.Event().wait()

    handle = await endless.enqueue_async()
    worker = ferryq.Worker(app, grace=0, handle_signals=False)
    runner = asyncio.create_task(worker.run())
    await started.wait()
    worker.stop()
    await runner
    job = await app.get_job_async(handle.id)
    assert job.state == "ready" and job.attempts == 0 and job.fence == 1


async def test_maintenance_recovers_expired_leases(app: ferryq.App, clock: FrozenClock) -> None:
    first = await app.enqueue_async("t", ttr=10, max_tries=2, retry=ferryq.backoff.fixed(0))
    store = await app.store()
    await store.job_claim("default", ["default"], 10, "crashed-worker", clock.now)
    maintenance = Maintenance(store, "leader")
    clock.advance(10)
    assert (await maintenance.tick(clock.now)).recovered == 0
    clock.advance(1)
    assert (await maintenance.tick(clock.now)).recovered == 1
    job = await app.get_job_async(first.id)
    assert job.state == "ready" and "lease expired" in job.error["message"]  # type: ignore[index]
    await store.job_claim("default", ["default"], 10, "crashed-again", clock.now)
    clock.advance(11)
    await maintenance.tick(clock.now)
    assert (await app.get_job_async(first.id)).state == "dead"


async def test_maintenance_folds_the_history_counts(app: ferryq.App, clock: FrozenClock) -> None:
    store = await app.store()
    if isinstance(store, PostgresStore):
        await store.history_ensure_partitions(clock.now)  # the frozen day gets a partition

    @app.task(queue="mail")
    async def send(n: int) -> int:
        return n

    for n in range(3):
        await send.enqueue_async(n)
    assert (await drain_async(app)).finished == 3
    maintenance = Maintenance(store, "leader")
    if isinstance(store, PostgresStore):  # a day's partition, an hour after the day
        assert (await maintenance.tick(clock.now)).folded == 0
        clock.advance(86400 + 3600)
        assert (await maintenance.tick(clock.now)).folded == 3
    else:  # what has finished (the drain's own maintenance may have been first)
        await maintenance.tick(clock.now)
    assert await store.history_fold(clock.now) == 0
    assert await store.job_counts(app.namespace) == {(app.namespace, "mail", "succeeded"): 3}


async def test_explain_says_when_no_worker_consumes_the_queue(app: ferryq.App) -> None:
    handle = await app.enqueue_async("t", queue="orphans")
    explained = await handle.explain_async()
    assert explained.reason == "no_worker" and "'orphans'" in explained.message
    assert explained.to_dict()["state"] == "ready"


async def test_lanes_keep_order_and_limits_under_a_concurrent_worker(app: ferryq.App) -> None:
    running: dict[str, int] = {}
    peak: dict[str, int] = {}
    order: dict[str, list[int]] = {}

    @app.task
    async def step(lane: str, n: int) -> None:
        running[lane] = running.get(lane, 0) + 1
        peak[lane] = max(peak.get(lane, 0), running[lane])
        order.setdefault(lane, []).append(n)
        for _ in range(3):  # let the other slots run meanwhile
            await asyncio.sleep(0)
        running[lane] -= 1

    await app.set_lane_limit_async("tenant:*", 2)
    lanes = ["post:1", "post:2", "tenant:a", "tenant:b"]
    for n in range(10):
        for lane in lanes:
            await step.options(lane=lane).enqueue_async(lane, n)
    await step.enqueue_async("none", 0)  # no lane: runs beside them
    await drain_async(app, concurrency=16)
    assert order["post:1"] == order["post:2"] == list(range(10))
    assert sorted(order["tenant:a"]) == list(range(10))
    assert peak["post:1"] == peak["post:2"] == 1
    assert peak["tenant:a"] <= 2 and peak["tenant:b"] <= 2
    assert await app.lanes_async() == []


async def test_explain_a_job_waiting_in_its_lane(app: ferryq.App) -> None:
    @app.task(max_tries=1)
    async def fails() -> None:
        raise RuntimeError("boom")

    first = await fails.options(lane="post:9").enqueue_async()
    second = await fails.options(lane="post:9").enqueue_async()
    third = await fails.options(lane="post:9").enqueue_async()
    explained = await third.explain_async()
    assert explained.reason == "lane_order"
    assert explained.data["waiting_for"] == first.id and explained.data["position"] == 2
    assert f"behind job {first.id}" in explained.message

    await app.set_lane_limit_async("post:*", 1, on_dead="halt")
    await drain_async(app)
    assert (await first.explain_async()).reason == "dead"
    explained = await second.explain_async()
    assert explained.reason == "lane_halted" and explained.data["halted_by"] == first.id
    [info] = await app.lanes_async()
    assert (info.lane, info.waiting, info.halted_by) == ("post:9", 2, first.id)

    # No longer halting, and still halted:
    await app.set_lane_limit_async("post:*", 3, on_dead="continue")
    assert (await second.explain_async()).reason == "lane_halted"
    assert await app.purge_async([first.id]) == 1
    await drain_async(app)
    assert [(await app.get_job_async(h.id)).state for h in (second, third)] == ["dead", "dead"]
