"""Tasks for the log tests: the worker subprocess imports this module by name."""

from __future__ import annotations

import os

import ferryq
from ferryq.store.base import Finish

app = ferryq.App(os.environ["FERRYQ_URL"])


@app.task(name="echo")
def echo(value: object) -> object:
    return value


@app.task(name="recovered_meanwhile")
def recovered_meanwhile(ctx: ferryq.Context) -> str:
    """Runs while the job is recovered behind the worker's back, as a leader that took
    this worker for dead would: the worker's own outcome then comes too late (stale).
    The recovered job is due in an hour, so a burst does not run it again."""
    job_id, fence = ctx.job_id, ctx.fence

    async def recover() -> list[int]:
        now = app.clock()
        recovered = Finish("retry", job_id, fence, now, run_at=now + 3600,
                           order_time=now + 3600, error={"message": "recovered"})  # fmt: skip
        return (await (await app.store()).job_finish_many([recovered])).accepted

    assert app.portal_call(recover()) == [job_id]
    return "too late"
