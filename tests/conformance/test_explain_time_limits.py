"""Explain of a job with a time limit or a progress report (docs/operations.md,
"Explain reasons"): when the running attempt's limit passes, how far it got, and a
backoff or death after it timed out; the command line shows the same data."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console

from ferryq import _render, insights
from ferryq.insights import when
from ferryq.store import Store
from ferryq.store.base import Finish, WorkerInfo
from tests.conformance.backends import backend_url as backend_url  # not pooled
from tests.conformance.jobs import NS, claim_one, insert
from tests.conftest import FrozenClock

TIMEOUT = 30.0
TIMED_OUT_ERROR = {
    "type": "TimedOut", "traceback": None, "stage": None, "worker": "w1",
    "message": f"timed out: the attempt ran past its time limit of {TIMEOUT:g} s and was stopped",
}  # fmt: skip


def _report(at: float, done: float, total: float | None = None, note: str | None = None) -> str:
    return json.dumps({"done": done, "total": total, "note": note, "at": at})


async def _running(store: Store, clock: FrozenClock, **fields: Any) -> tuple[int, int]:
    """A job claimed by worker w1, which heartbeats; its id and fence."""
    job_id = await insert(store, clock.now, ttr=60.0, **fields)
    claimed = await claim_one(store, clock.now)
    assert claimed.id == job_id
    await store.worker_beat(WorkerInfo("w1", NS, ["default"], "host", 1, 1, clock.now, clock.now))
    return job_id, claimed.fence


def _plain(explanation: insights.Explanation) -> str:
    console = Console(width=200, no_color=True, record=True)
    console.print(_render.explanation_text(explanation))
    return console.export_text()


async def test_a_running_job_says_when_its_time_limit_passes_and_how_far_it_got(
    store: Store, clock: FrozenClock
) -> None:
    job_id, fence = await _running(store, clock, timeout=TIMEOUT)
    started = clock.advance(0.5)  # the handler began after the claim
    clock.advance(4)
    report = _report(clock.now - 3, 4000, 10000, "resizing")
    leases = await store.job_leases([(job_id, fence)], [job_id], clock.now, {job_id: started},
                                    {job_id: report})  # fmt: skip
    assert leases.extended == [job_id]
    explained = await insights.explain(store, job_id, clock.now)
    assert explained.reason == "running"
    assert explained.message == (
        f"job {job_id}: running on worker w1 since {when(started)}, time limit 30 s: stopped "
        f"at {when(started + TIMEOUT)} if still running; leased until {when(clock.now + 60)} "
        f"(attempt 1 of 3, fence {fence}); progress 4,000 / 10,000 (40%) — resizing, "
        "reported 3 s ago"
    )
    assert explained.data["timeout"] == TIMEOUT
    assert explained.data["deadline"] == started + TIMEOUT
    assert explained.data["progress"] == json.loads(report)
    shown = _plain(explained)
    assert "timeout: 30 s" in shown
    assert f"deadline: {when(started + TIMEOUT)}" in shown
    assert f"progress: 4,000 / 10,000 (40%) — resizing, reported at {when(clock.now - 3)}" in shown

    clock.advance(TIMEOUT)  # past the limit, and the handler has not stopped yet
    explained = await insights.explain(store, job_id, clock.now)
    assert (f"time limit 30 s: passed at {when(started + TIMEOUT)}, the worker is stopping it"
            in explained.message)  # fmt: skip


async def test_progress_without_a_total_or_a_time_limit(store: Store, clock: FrozenClock) -> None:
    job_id, fence = await _running(store, clock)
    note = "row \x1b[31m7\nof the sheet"  # an escape sequence and a newline: shown escaped
    await store.job_leases([(job_id, fence)], [job_id], clock.now,
                           progress={job_id: _report(clock.now, 1234.5, None, note)})  # fmt: skip
    explained = await insights.explain(store, job_id, clock.now)
    assert explained.message.startswith(f"job {job_id}: leased by worker w1 until")
    assert explained.message.endswith(
        "; progress 1,234.5 — row \\x1b[31m7\\nof the sheet, reported 0 s ago"
    )
    assert explained.data["timeout"] is None and explained.data["deadline"] is None
    assert explained.data["progress"]["note"] == note

    plain_id, _ = await _running(store, clock)  # no limit, no report
    explained = await insights.explain(store, plain_id, clock.now)
    assert "progress" not in explained.message and "time limit" not in explained.message
    assert explained.data["progress"] is None


async def test_a_backoff_and_a_death_after_a_time_out_say_so(
    store: Store, clock: FrozenClock
) -> None:
    job_id, fence = await _running(store, clock, timeout=TIMEOUT)
    clock.advance(TIMEOUT)
    error = {**TIMED_OUT_ERROR, "attempt": 1, "at": clock.now}
    retry_at = clock.now + 10
    report = await store.job_finish_many([Finish("retry", job_id, fence, clock.now, clock.now - 30,
                                                 error=error, run_at=retry_at,
                                                 order_time=retry_at)])  # fmt: skip
    assert report.accepted == [job_id]
    explained = await insights.explain(store, job_id, clock.now)
    assert explained.reason == "backoff"
    assert explained.message == (
        f"job {job_id}: backing off until {when(retry_at)} after it timed out (limit 30 s): "
        "attempt 1 of 3 failed"
    )
    assert explained.data["timeout"] == TIMEOUT and explained.data["run_at"] == retry_at

    clock.advance(10)
    claimed = await claim_one(store, clock.now)
    error = {**TIMED_OUT_ERROR, "attempt": 2, "at": clock.now}
    await store.job_finish_many([Finish("dead", job_id, claimed.fence, clock.now, clock.now,
                                        error=error)])  # fmt: skip
    explained = await insights.explain(store, job_id, clock.now)
    assert explained.reason == "dead"
    assert explained.message.endswith("after 2 attempt(s): timed out after 30 s")
    assert explained.data["timeout"] == TIMEOUT
