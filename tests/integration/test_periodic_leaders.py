"""Periodic tasks end to end with a frozen clock: one job per tick, whoever leads."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import pytest

import ferryq
from ferryq.errors import ConfigurationError
from ferryq.store import Store
from ferryq.testing import drain_async
from ferryq.worker.periodic import PeriodicLoop
from tests.conftest import FrozenClock

MINUTE = 60.0
TASK = "tests.report"


def reporting_app(url: str, clock: FrozenClock, catch_up: int = 1, **extra: float) -> ferryq.App:
    """An App with one periodic task every minute, as each process of a deploy has."""
    app = ferryq.App(url, clock=clock)

    @app.periodic(every=MINUTE, catch_up=catch_up, name=TASK)
    async def report(ctx: ferryq.Context) -> float:
        return ctx.job_id

    for name, every in extra.items():
        app.periodic(every=every, name=name)(_noop)
    return app


async def _noop() -> None:
    return None


@pytest.fixture
async def apps(backend_url: str, clock: FrozenClock) -> AsyncIterator[Callable[..., ferryq.App]]:
    """Apps on one database, as processes would be; closed at the end."""
    made: list[ferryq.App] = []

    def make(catch_up: int = 1, **extra: float) -> ferryq.App:
        made.append(reporting_app(backend_url, clock, catch_up, **extra))
        return made[-1]

    yield make
    for app in made:
        await app.aclose()
        app.close()


async def loop_of(app: ferryq.App, holder: str) -> PeriodicLoop:
    # A lease longer than the test: on SQLite leadership lapses as the frozen clock moves.
    return PeriodicLoop(app, await app.store(), holder, app.clock, leader_ttl=86400)


async def ticks_enqueued(app: ferryq.App) -> list[float]:
    jobs = await app.list_jobs_async(task=TASK, limit=1000)
    return sorted(job.meta["periodic"]["tick"] for job in jobs)


def test_registration(backend_url: str, clock: FrozenClock) -> None:
    app = ferryq.App(backend_url, clock=clock)

    @app.periodic(cron="*/5 * * * *", queue="reports", max_tries=1)
    def every_five(ctx: ferryq.Context, scale: int = 1) -> None: ...

    @app.task
    async def existing() -> None: ...

    assert app.periodic(every=30)(existing) is existing
    assert app.schedules[every_five.name].schedule.spec == "cron */5 * * * *"
    assert every_five.queue == "reports" and every_five.defaults.max_tries == 1
    assert app.schedules[existing.name].catch_up == 1
    with pytest.raises(ConfigurationError, match="already has a schedule"):
        app.periodic(every=60)(existing)

    def needs_an_argument(path: str) -> None: ...

    with pytest.raises(ConfigurationError, match="callable without arguments"):
        app.periodic(every=60)(needs_an_argument)
    assert not any("needs_an_argument" in name for name in app.tasks)
    with pytest.raises(ValueError, match="cron= or every="):
        app.periodic()
    with pytest.raises(ValueError, match="not a valid minute"):
        app.periodic(cron="x * * * *")
    with pytest.raises(ValueError, match="catch_up"):
        app.periodic(every=60, catch_up=-1)
    with pytest.raises(ValueError, match="unknown time zone 'Mars/Olympus'"):
        app.periodic(cron="0 9 * * *", timezone="Mars/Olympus")
    with pytest.raises(ValueError, match="timezone= goes with cron="):
        app.periodic(every=60, timezone="Europe/Paris")
    app.close()


async def test_a_cron_in_a_time_zone_runs_once_when_summer_time_skips_its_hour(
    backend_url: str,
) -> None:
    # Paris, 29 March 2026: at 01:00 UTC the clock goes from 02:00 to 03:00.
    clock = FrozenClock(datetime(2026, 3, 28, 23, 0, tzinfo=UTC).timestamp())
    app = ferryq.App(backend_url, clock=clock)
    try:
        app.periodic(cron="30 2 * * *", timezone="Europe/Paris", name=TASK)(_noop)
        loop = await loop_of(app, "w1")
        made: list[int] = []
        for _ in range(6 * 4):  # through the night, a quarter of an hour at a time
            made += await loop.once()
            clock.advance(15 * MINUTE)
        (job,) = [await app.get_job_async(job_id) for job_id in made]
        change = datetime(2026, 3, 29, 1, 0, tzinfo=UTC).timestamp()
        assert job.meta["periodic"] == {
            "tick": change,
            "schedule": "cron 30 2 * * * (Europe/Paris)",
        }
        (state,) = (await app.stats_async()).periodic
        assert state.next_tick == datetime(2026, 3, 30, 0, 30, tzinfo=UTC).timestamp()
    finally:
        await app.aclose()
        app.close()


async def test_one_job_per_tick_as_time_passes(
    apps: Callable[..., ferryq.App], clock: FrozenClock
) -> None:
    app = apps()
    loop = await loop_of(app, "w1")
    start = clock.now
    assert await loop.once() == []  # first seen now: its first tick is the next one
    clock.advance(MINUTE)
    (first,) = await loop.once()
    assert await loop.once() == []  # the same tick again: nothing
    clock.advance(MINUTE / 2)
    assert await loop.once() == []
    clock.advance(MINUTE / 2)
    (second,) = await loop.once()
    job = await app.get_job_async(first)
    assert job.state == "ready" and job.run_at == start + MINUTE and job.args == []
    assert job.unique_key == ferryq.periodic.tick_key(TASK, start + MINUTE)
    assert job.meta["periodic"] == {"tick": start + MINUTE, "schedule": "every 60 s"}
    assert await ticks_enqueued(app) == [start + MINUTE, start + 2 * MINUTE]
    await drain_async(app)
    assert await app.result_async(second, timeout=1) == second
    (state,) = (await app.stats_async()).periodic
    assert state.last_tick == start + 2 * MINUTE and state.last_job == second
    assert state.last_state == "succeeded" and state.next_tick == start + 3 * MINUTE


async def test_only_the_leader_enqueues_and_the_next_leader_goes_on(
    apps: Callable[..., ferryq.App], clock: FrozenClock
) -> None:
    first, second = apps(), apps()
    leader, other = await loop_of(first, "w1"), await loop_of(second, "w2")
    start = clock.now
    await leader.once()
    for _ in range(3):
        clock.advance(MINUTE)
        assert await other.once() == []
        assert len(await leader.once()) == 1
    await leader.leave()
    clock.advance(MINUTE)
    assert len(await other.once()) == 1
    assert await ticks_enqueued(first) == [start + i * MINUTE for i in range(1, 5)]


async def test_a_leader_that_died_before_recording_its_tick_leaves_no_second_job(
    apps: Callable[..., ferryq.App], clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    dying, next_leader = apps(), apps()
    loop = await loop_of(dying, "w1")
    await loop.once()
    clock.advance(MINUTE)

    async def crash(*args: object) -> bool:
        raise ConnectionError("killed before it could record the tick")

    monkeypatch.setattr(loop.store, "periodic_advance", crash)
    with pytest.raises(ConnectionError):
        await loop.once()
    await loop.leave()
    clock.advance(1)
    assert await (await loop_of(next_leader, "w2")).once() == []  # deduplicated
    assert await ticks_enqueued(dying) == [clock.now - 1]


async def test_a_restart_does_not_enqueue_a_tick_twice(
    apps: Callable[..., ferryq.App], clock: FrozenClock
) -> None:
    before = apps()
    loop = await loop_of(before, "w1")
    await loop.once()
    clock.advance(MINUTE)
    await loop.once()
    await loop.leave()
    await before.aclose()
    after = apps()  # the whole deploy restarts, at the same moment
    restarted = await loop_of(after, "w1-again")
    assert await restarted.once() == []
    clock.advance(MINUTE)
    assert len(await restarted.once()) == 1
    start = clock.now - 2 * MINUTE
    assert await ticks_enqueued(after) == [start + MINUTE, start + 2 * MINUTE]


@pytest.mark.parametrize(("catch_up", "runs"), [(0, 0), (1, 1), (3, 3)])
async def test_after_downtime_missed_ticks_are_not_replayed_in_a_storm(
    apps: Callable[..., ferryq.App],
    clock: FrozenClock,
    caplog: pytest.LogCaptureFixture,
    catch_up: int,
    runs: int,
) -> None:
    app = apps(catch_up)
    loop = await loop_of(app, "w1")
    await loop.once()
    await loop.leave()
    clock.advance(10 * 3600 + MINUTE / 2)  # ten hours without any worker
    with caplog.at_level(logging.WARNING, "ferryq.periodic"):
        created = await (await loop_of(apps(catch_up), "w2")).once()
    assert len(created) == runs
    last_tick = clock.now - MINUTE / 2
    assert await ticks_enqueued(app) == [last_tick - i * MINUTE for i in reversed(range(runs))]
    assert "missed tick(s) skipped" in caplog.text


async def test_two_leaders_at_once_still_enqueue_each_tick_once(
    apps: Callable[..., ferryq.App], clock: FrozenClock
) -> None:
    # Different task sets (old and new code in a rolling deploy) lead separately.
    old, new = apps(), apps(extra=MINUTE)
    loops = [await loop_of(old, "old"), await loop_of(new, "new")]
    assert loops[0].name != loops[1].name
    await asyncio.gather(*(loop.once() for loop in loops))
    for _ in range(5):
        clock.advance(MINUTE)
        await asyncio.gather(*(loop.once() for loop in loops))
    ticks = await ticks_enqueued(old)
    assert len(ticks) == len(set(ticks)) == 5


async def test_a_worker_enqueues_and_runs_periodic_jobs(
    apps: Callable[..., ferryq.App], clock: FrozenClock
) -> None:
    app = apps()
    await drain_async(app)  # a burst worker leads for one round, then drains
    clock.advance(MINUTE)
    worker = await drain_async(app)
    assert worker.finished == 1
    (job,) = await app.list_jobs_async(task=TASK)
    assert job.state == "succeeded" and job.result == job.id
    store: Store = await app.store()
    assert [s.task for s in await store.periodic_list(app.namespace)] == [TASK]
    assert (await app.stats_async()).to_dict()["periodic"][0]["last_state"] == "succeeded"


async def test_a_round_without_a_due_tick_writes_nothing(
    apps: Callable[..., ferryq.App], clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop = await loop_of(apps(), "w1")
    writes: list[str] = []
    for name in ("periodic_sync", "periodic_advance"):
        real = getattr(loop.store, name)

        async def counted(*args: object, _real: Any = real, _name: str = name) -> Any:
            writes.append(_name)
            return await _real(*args)

        monkeypatch.setattr(loop.store, name, counted)
    await loop.once()  # declares the task and records its next tick
    assert writes == ["periodic_sync", "periodic_advance"]
    for _ in range(4):
        clock.advance(5)
        assert await loop.once() == []
    assert writes == ["periodic_sync", "periodic_advance"]
    clock.advance(MINUTE)  # a tick passed, and the declaration is due again
    assert len(await loop.once()) == 1
    assert writes[2:] == ["periodic_sync", "periodic_advance"]
