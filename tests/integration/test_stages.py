"""Multi-stage jobs through a worker, with a frozen clock: ferryq.Next end to end."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console

import ferryq
from ferryq import _render
from ferryq.testing import drain_async
from tests.conftest import FrozenClock


def rendered(renderable: Any) -> str:
    out = io.StringIO()
    Console(file=out, width=200).print(renderable)
    return out.getvalue()


async def test_stages_carry_their_context_and_keep_a_history(
    app: ferryq.App, clock: FrozenClock
) -> None:
    seen: list[tuple[str | None, Any, int]] = []

    @app.task
    def video(ctx: ferryq.Context, path: str) -> Any:
        seen.append((ctx.stage, ctx.context, ctx.attempt))
        if ctx.stage is None:
            return ferryq.Next("transcode", context={"path": path, "ok": True})
        if ctx.stage == "transcode":
            return ferryq.Next("publish", context={**ctx.context, "mp4": path + ".mp4"})
        return {"published": ctx.context["mp4"]}

    handle = await video.enqueue_async("a.mov")
    await drain_async(app)
    assert await handle.result_async(timeout=1) == {"published": "a.mov.mp4"}
    assert seen == [
        (None, None, 1),
        ("transcode", {"path": "a.mov", "ok": True}, 1),
        ("publish", {"path": "a.mov", "ok": True, "mp4": "a.mov.mp4"}, 1),
    ]
    job = await app.get_job_async(handle.id)
    assert job.stage == "publish" and job.attempts == 1
    assert [(r["stage"], r["outcome"], r["attempts"]) for r in job.stages] == [
        (None, "next", 1), ("transcode", "next", 1), ("publish", "succeeded", 1),
    ]  # fmt: skip
    assert all(r["started_at"] == r["finished_at"] == clock.now for r in job.stages)
    page = rendered(_render.job_page(job, clock.now))
    assert "stages (3)" in page and "transcode" in page and "succeeded" in page
    explained = await app.explain_async(handle.id)
    assert explained.message.startswith(f"job {handle.id} (stage 3, 'publish'): succeeded")
    assert explained.data["stage_number"] == 3 and len(explained.data["stages"]) == 3


async def test_each_stage_gets_its_own_tries(app: ferryq.App) -> None:
    @app.task(max_tries=2, retry=ferryq.backoff.fixed(0))
    async def flaky(ctx: ferryq.Context) -> Any:
        if ctx.attempt == 1:
            raise RuntimeError(f"stage {ctx.stage} fails once")
        return ferryq.Next("second") if ctx.stage is None else "done"

    handle = await flaky.enqueue_async()
    await drain_async(app)
    assert await handle.result_async(timeout=1) == "done"  # two tries each: none ran out
    job = await app.get_job_async(handle.id)
    assert [(r["stage"], r["attempts"]) for r in job.stages] == [(None, 2), ("second", 2)]
    assert [e["stage"] for e in job.errors] == [None, "second"]


async def test_a_delayed_stage_waits_and_explain_says_where_the_job_is(
    app: ferryq.App, clock: FrozenClock
) -> None:
    @app.task
    async def later(ctx: ferryq.Context) -> Any:
        if ctx.stage == "audit":
            return ferryq.Next("publish", context=[1, 2], delay=30)
        return ctx.context

    handle = await later.options(stage="audit").enqueue_async()
    await drain_async(app)
    explained = await app.explain_async(handle.id)
    assert explained.reason == "scheduled" and explained.data["stage"] == "publish"
    assert explained.message.startswith(f"job {handle.id} (stage 2, 'publish'): scheduled")
    assert "audit: next (1 try)" in rendered(_render.explanation_text(explained))
    clock.advance(30)
    await drain_async(app)
    assert await handle.result_async(timeout=1) == [1, 2]


async def test_a_context_that_is_not_json_ends_the_job_dead(app: ferryq.App) -> None:
    @app.task
    async def bad(ctx: ferryq.Context) -> Any:
        return ferryq.Next("b", context=object())

    handle = await bad.options(stage="a").enqueue_async()
    await drain_async(app)
    job = await app.get_job_async(handle.id)
    assert job.state == "dead" and job.stage == "a" and job.error is not None
    assert job.error["type"] == "SerializationError" and job.error["worker"]
    assert [(r["stage"], r["outcome"]) for r in job.stages] == [("a", "dead")]


async def test_a_lane_is_held_until_the_last_stage_ends(
    app: ferryq.App, clock: FrozenClock
) -> None:
    runs: list[tuple[str, str | None]] = []

    @app.task
    async def step(ctx: ferryq.Context, name: str) -> Any:
        runs.append((name, ctx.stage))
        if name == "first" and ctx.stage is None:
            return ferryq.Next("second", delay=60)
        return None

    first = await step.options(lane="post:1").enqueue_async("first")
    behind = await step.options(lane="post:1").enqueue_async("behind")
    await drain_async(app)
    assert runs == [("first", None)]
    assert (await app.explain_async(behind.id)).data["waiting_for"] == first.id
    clock.advance(60)
    await drain_async(app)
    assert runs == [("first", None), ("first", "second"), ("behind", None)]
