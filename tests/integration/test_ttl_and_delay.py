"""A ttl that ends before the job is due is refused at enqueue, as lmstfy refuses it."""

from __future__ import annotations

import pytest

import ferryq
from tests.conftest import FrozenClock

SHORT = "ttl must be at least delay"


async def test_a_ttl_shorter_than_the_delay_is_refused(app: ferryq.App) -> None:
    @app.task()
    async def send() -> None:
        pass

    @app.task(ttl=10)
    async def brief() -> None:
        pass

    with pytest.raises(ValueError, match=SHORT):
        await send.options(delay=30, ttl=10).enqueue_async()
    with pytest.raises(ValueError, match=SHORT):
        brief.options(delay=30)  # the task's ttl against this call's delay
    with pytest.raises(ValueError, match=SHORT):
        await app.enqueue_async("send", [], delay=30, ttl=10)
    with pytest.raises(ValueError, match=SHORT):
        await app.enqueue_many_async("send", [[], []], delay=30, ttl=29.5)
    assert await app.list_jobs_async() == []


async def test_a_ttl_ending_before_run_at_is_refused(app: ferryq.App, clock: FrozenClock) -> None:
    with pytest.raises(ValueError, match="ttl must last until run_at"):
        await app.enqueue_async("send", [], run_at=clock() + 30, ttl=10)
    assert await app.list_jobs_async() == []
    # A run_at already past leaves the whole ttl to run in.
    await app.enqueue_async("send", [], run_at=clock() - 30, ttl=10)


async def test_a_ttl_as_long_as_the_delay_is_accepted(app: ferryq.App, clock: FrozenClock) -> None:
    # As in lmstfy, which refuses only ttl < delay; such a job has no time to spare.
    equal = await app.enqueue_async("send", [], delay=30, ttl=30)
    until = await app.enqueue_async("send", [], run_at=clock() + 30, ttl=30)
    longer = await app.enqueue_async("send", [], delay=30, ttl=31)
    assert [(await app.get_job_async(h.id)).expires_at for h in (equal, until, longer)] == [
        clock() + 30, clock() + 30, clock() + 31,
    ]  # fmt: skip
