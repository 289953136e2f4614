"""Dependencies (``after``) and fan-in groups, on every backend, with a frozen clock."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import ferryq
from ferryq.job import HELD
from ferryq.store.base import Dependency, Finish
from ferryq.testing import drain_async
from tests.conftest import FrozenClock


async def _state(app: ferryq.App, job_id: int) -> str:
    return str((await app.get_job_async(job_id)).state)


async def test_a_job_is_held_until_its_last_dependency_ends_then_ready_in_that_write(
    app: ferryq.App, clock: FrozenClock
) -> None:
    a, b = await app.enqueue_many_async("step", [[1], [2]])
    c = await app.enqueue_async("step", [3], after=[a, b.id])
    job = await app.get_job_async(c.id)
    assert job.state == "scheduled" and job.run_at == HELD and job.held_by_dependencies
    store = await app.store()
    claimed = await store.job_claim("default", ["default"], 10, "w", clock.now)
    assert sorted(j.id for j in claimed) == [a.id, b.id]  # never the held one
    fences = {j.id: j.fence for j in claimed}
    await store.job_finish_many([Finish("succeeded", a.id, fences[a.id], clock.now)])
    assert await _state(app, c.id) == "scheduled"
    assert (await app.explain_async(c.id)).data["waiting_for"] == [b.id]
    clock.advance(5)
    await store.job_finish_many([Finish("succeeded", b.id, fences[b.id], clock.now)])
    job = await app.get_job_async(c.id)  # no maintenance, no claim: the finish did it
    assert job.state == "ready" and job.run_at == job.order_time == clock.now - 5
    assert await store.job_dependencies(c.id) == ferryq.store.base.Dependencies(
        [Dependency(a.id, "succeeded"), Dependency(b.id, "succeeded")], []
    )
    assert (await store.job_dependencies(a.id)).dependents == [Dependency(c.id, "succeeded")]


async def test_a_failed_dependency_fails_its_dependents_without_running_them(
    app: ferryq.App,
) -> None:
    ran: list[str] = []

    @app.task(max_tries=1)
    async def breaks() -> None:
        ran.append("breaks")
        raise RuntimeError("broken")

    @app.task
    async def step(name: str) -> None:
        ran.append(name)

    first = await breaks.enqueue_async()
    second = await step.options(after=[first]).enqueue_async("second")
    third = await step.options(after=[second]).enqueue_async("third")
    anyway = await step.options(after=[first], after_failed="run").enqueue_async("anyway")
    await drain_async(app)
    assert sorted(ran) == ["anyway", "breaks"]
    second_job, third_job = await app.get_job_async(second.id), await app.get_job_async(third.id)
    assert second_job.state == third_job.state == "dead"
    assert second_job.error is not None and second_job.error["type"] == "DependencyFailed"
    assert f"dependency {first.id} ended dead" in second_job.error["message"]
    assert (
        third_job.error is not None
        and f"dependency {second.id} ended dead" in (third_job.error["message"])
    )
    assert await _state(app, anyway.id) == "succeeded"
    with pytest.raises(ferryq.JobDead, match="does not run"):
        await second.result_async(timeout=0)


async def test_cancelled_and_expired_dependencies_fail_the_dependent(
    app: ferryq.App, clock: FrozenClock
) -> None:
    @app.task(name="step")
    async def step(n: int) -> int:
        return n

    later = await app.enqueue_async("step", [1], delay=100)
    short = await app.enqueue_async("step", [2], delay=10, ttl=10)
    after_cancel = await app.enqueue_async("step", [3], after=[later])
    after_expiry = await app.enqueue_async("step", [4], after=[short])
    await app.cancel_async(later.id)
    assert await _state(app, after_cancel.id) == "ready"  # to be failed by a worker
    clock.advance(11)
    await drain_async(app)  # expires `short`, then fails both dependents
    for handle, cause in ((after_cancel, f"{later.id} ended cancelled"),
                          (after_expiry, f"{short.id} ended expired")):  # fmt: skip
        job = await app.get_job_async(handle.id)
        assert job.state == "dead" and job.error is not None and cause in job.error["message"]


async def test_dependencies_that_have_ended_already_count_at_once(app: ferryq.App) -> None:
    @app.task(max_tries=1)
    async def step(ok: bool) -> bool:
        if not ok:
            raise RuntimeError("no")
        return ok

    done, dead = await step.enqueue_async(True), await step.enqueue_async(False)
    await drain_async(app)
    ready = await step.options(after=[done]).enqueue_async(True)
    assert await _state(app, ready.id) == "ready"
    failing = await step.options(after=[done, dead]).enqueue_async(True)
    running = await step.options(after=[dead], after_failed="run").enqueue_async(True)
    assert await _state(app, failing.id) == "ready"  # not held: its worker fails it
    await drain_async(app)
    assert [await _state(app, h.id) for h in (ready, failing, running)] == [
        "succeeded", "dead", "succeeded"
    ]  # fmt: skip


async def test_bad_dependencies_are_refused_and_nothing_is_written(app: ferryq.App) -> None:
    a = await app.enqueue_async("step", [1])
    elsewhere = await app.enqueue_async("step", [2], namespace="other")
    before = await app.list_jobs_async()
    for after, error in (
        ([a.id, 10**9], f"no job {10**9}"),
        ([elsewhere.id], f"no job {elsewhere.id} in namespace 'default'"),
        ("12", "list of job handles or ids"),
        ([True], "by handle or id"),
        ([0], "by handle or id"),
        ([1.5], "by handle or id"),
    ):
        with pytest.raises(ValueError, match=error):
            await app.enqueue_async("step", [3], after=after)
    with pytest.raises(ValueError, match="after_failed"):
        await app.enqueue_async("step", [3], after=[a], after_failed="maybe")
    assert await app.list_jobs_async() == before


async def test_a_held_job_keeps_its_place_in_its_lane(app: ferryq.App) -> None:
    order: list[str] = []

    @app.task
    async def step(name: str) -> None:
        order.append(name)

    first = await step.options(delay=0).enqueue_async("first")
    held = await step.options(lane="L", after=[first]).enqueue_async("held")
    behind = await step.options(lane="L").enqueue_async("behind")
    explained = await app.explain_async(behind.id)
    assert explained.reason == "lane_order" and explained.data["waiting_for"] == held.id
    explained = await app.explain_async(held.id)
    assert explained.reason == "dependencies" and explained.data["waiting_for"] == [first.id]
    await drain_async(app)
    assert order == ["first", "held", "behind"]


async def test_jobs_behind_a_held_job_in_a_lane_with_room_wait_for_it(app: ferryq.App) -> None:
    """Admitted behind a held job, a job would take its due time (HELD) and never run:
    none is admitted behind one until it ends."""
    order: list[str] = []

    @app.task
    async def step(name: str) -> None:
        order.append(name)

    await app.set_lane_limit_async("L", 3)
    first = await step.enqueue_async("first")
    held = await step.options(lane="L", after=[first]).enqueue_async("held")
    behind = [await step.options(lane="L").enqueue_async(f"behind {i}") for i in (1, 2)]
    assert [await _state(app, h.id) for h in (held, *behind)] == [
        "scheduled", "waiting", "waiting"
    ]  # fmt: skip
    await drain_async(app)
    assert order == ["first", "held", "behind 1", "behind 2"]
    assert [await _state(app, h.id) for h in (held, *behind)] == ["succeeded"] * 3


async def test_a_delayed_job_runs_at_its_own_due_time_once_released(
    app: ferryq.App, clock: FrozenClock
) -> None:
    first = await app.enqueue_async("step", [1])
    later = await app.enqueue_async("step", [2], after=[first], delay=100)

    @app.task(name="step")
    async def step(n: int) -> int:
        return n

    await drain_async(app)
    job = await app.get_job_async(later.id)
    assert job.state == "scheduled" and job.run_at == clock.now + 100
    assert (await app.explain_async(later.id)).reason == "scheduled"
    clock.advance(100)
    await drain_async(app)
    assert await _state(app, later.id) == "succeeded"


async def test_a_multi_stage_dependency_ends_with_its_last_stage(app: ferryq.App) -> None:
    seen: list[str] = []

    @app.task
    async def pipeline(ctx: ferryq.Context) -> ferryq.Next | str:
        seen.append(f"pipeline {ctx.stage}")
        if ctx.stage is None:
            return ferryq.Next("second")
        return "done"

    @app.task
    async def after(ctx: ferryq.Context) -> None:
        seen.append("after")

    first = await pipeline.enqueue_async()
    dependent = await after.options(after=[first]).enqueue_async()
    store = await app.store()
    claimed = await store.job_claim("default", ["default"], 10, "w", app.clock())
    assert [job.id for job in claimed] == [first.id]
    await store.job_finish_many([Finish("next", first.id, claimed[0].fence, app.clock(),
                                        stage="second", context="null")])  # fmt: skip
    assert await _state(app, dependent.id) == "scheduled"  # a stage is not an end
    await drain_async(app)
    assert seen == ["pipeline second", "after"]


async def test_a_duplicate_is_the_job_it_finds_with_that_jobs_dependencies(
    app: ferryq.App,
) -> None:
    a, b = await app.enqueue_many_async("step", [[1], [2]])
    first = await app.enqueue_async("step", [3], after=[a], unique_key="k")
    again = await app.enqueue_async("step", [3], after=[b], unique_key="k")
    assert again.id == first.id and not again.created
    store = await app.store()
    assert (await store.job_dependencies(first.id)).after == [Dependency(a.id, None)]


async def test_cancelling_a_held_job_fails_its_dependents(app: ferryq.App) -> None:
    a = await app.enqueue_async("step", [1], delay=50)
    held = await app.enqueue_async("step", [2], after=[a])
    dependent = await app.enqueue_async("step", [3], after=[held])
    await app.cancel_async(held.id)
    assert await _state(app, held.id) == "cancelled"
    assert await _state(app, dependent.id) == "ready"
    store = await app.store()
    assert (await store.job_dependencies(a.id)).dependents == [Dependency(held.id, None)]


@pytest.mark.parametrize("mode", ["async", "sync"])
async def test_a_group_callback_receives_the_members_results_in_order(
    app: ferryq.App, mode: str
) -> None:
    @app.task
    async def square(n: int) -> int:
        return n * n

    @app.task
    def album(results: list[Any], name: str) -> str:
        return f"{name}: {results}"

    calls = [(n,) for n in (3, 1, 2)]
    if mode == "async":
        group = ferryq.group(square, calls)
        callback = await group.then_async(album, "squares")
    else:
        group = ferryq.group(square.options(queue="default"), calls)
        callback = await asyncio.to_thread(group.then, album, "squares")
    assert [m.id for m in group.members] == sorted(m.id for m in group.members)
    assert await _state(app, callback.id) == "scheduled"
    await drain_async(app)
    assert await callback.result_async(timeout=0) == "squares: [9, 1, 4]"


async def test_a_group_callback_that_runs_anyway_gets_none_for_a_failed_member(
    app: ferryq.App,
) -> None:
    @app.task(max_tries=1)
    async def half(n: int) -> float:
        return 1 / n

    @app.task
    async def total(results: list[float | None]) -> list[float | None]:
        return results

    callback = await ferryq.group(half, [(2,), (0,), (4,)]).then_async(
        total.options(after_failed="run")
    )
    await drain_async(app)
    assert await callback.result_async(timeout=0) == [0.5, None, 0.25]


async def test_the_graph_goes_with_the_history(app: ferryq.App, clock: FrozenClock) -> None:
    @app.task(name="step")
    async def step(n: int) -> int:
        return n

    first = await app.enqueue_async("step", [1])
    second = await app.enqueue_async("step", [2], after=[first])
    await drain_async(app)
    kept = await app.enqueue_async("step", [3], after=[second])  # kept: still hot
    store = await app.store()
    assert await store.history_prune(clock.now + 40 * 86_400, 10_000) == 2
    assert await store.job_dependencies(second.id) == ferryq.store.base.Dependencies(
        [],
        [Dependency(kept.id, "succeeded")],  # its own edge went; its dependent's stays
    )
    assert await store.job_dependencies(first.id) == ferryq.store.base.Dependencies([], [])
