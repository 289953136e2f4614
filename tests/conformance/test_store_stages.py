"""Multi-stage jobs in the store: context, tries per stage, the stage history, lanes."""

from __future__ import annotations

from typing import Any

import pytest

from ferryq.job import State
from ferryq.store import Store
from ferryq.store.base import Finish, FinishKind
from ferryq.worker.maintenance import Maintenance
from tests.conformance.jobs import claim_one, insert
from tests.conftest import START

NOW = START


def next_stage(job_id: int, fence: int, at: float, stage: str, context: str, **kw: Any) -> Finish:
    due = kw.pop("run_at", at)
    order = kw.pop("order_time", due)
    return Finish("next", job_id, fence, at, at - 1, run_at=due, order_time=order, stage=stage,
                  context=context, **kw)  # fmt: skip


async def job_of(store: Store, job_id: int) -> Any:
    job = await store.job_get(job_id)
    assert job is not None
    return job


async def test_next_stage_saves_context_resets_tries_and_records_the_stage(store: Store) -> None:
    job_id = await insert(store, NOW, stage="audit", max_tries=3)
    first = await claim_one(store, NOW)
    retry = Finish("retry", job_id, first.fence, NOW + 1, NOW, error={"message": "x"},
                   run_at=NOW + 1, order_time=NOW + 1)  # fmt: skip
    assert (await store.job_finish_many([retry])).accepted == [job_id]
    second = await claim_one(store, NOW + 2)
    finish = next_stage(job_id, second.fence, NOW + 3, "transcode", '{"k": [1, "a"]}')
    assert (await store.job_finish_many([finish])).accepted == [job_id]
    moved = await job_of(store, job_id)
    assert moved.state == State.READY and moved.stage == "transcode"
    assert moved.context == {"k": [1, "a"]} and moved.attempts == 0 and moved.error is None
    assert moved.stages == [{"stage": "audit", "outcome": "next", "attempts": 2,
                             "started_at": NOW + 2, "finished_at": NOW + 3}]  # fmt: skip
    claimed = await claim_one(store, NOW + 3)
    assert (claimed.stage, claimed.context, claimed.attempts) == ("transcode", '{"k": [1, "a"]}', 1)


async def test_each_stage_has_its_own_tries(store: Store) -> None:
    job_id = await insert(store, NOW, stage="a", max_tries=2)
    job = await claim_one(store, NOW)
    await store.job_finish_many([next_stage(job_id, job.fence, NOW, "b", "null")])
    for at in (NOW + 1, NOW + 2):  # stage b may fail up to max_tries - 1 times and go on
        job = await claim_one(store, at)
        assert job.stage == "b" and job.attempts == at - NOW
        kind: FinishKind = "retry" if job.attempts < job.max_tries else "dead"
        error = {"message": f"b failed on try {job.attempts}", "stage": "b"}
        await store.job_finish_many([Finish(kind, job_id, job.fence, at, at, error=error,
                                            run_at=at, order_time=at)])  # fmt: skip
    dead = await job_of(store, job_id)
    assert dead.state == State.DEAD and dead.attempts == 2
    assert [e["stage"] for e in dead.errors] == ["b", "b"]
    assert [(r["stage"], r["outcome"], r["attempts"]) for r in dead.stages] == [
        ("a", "next", 1), ("b", "dead", 2),
    ]  # fmt: skip


@pytest.mark.parametrize("kind", ["succeeded", "dead"])
async def test_the_last_stage_outcome_is_recorded(store: Store, kind: FinishKind) -> None:
    job_id = await insert(store, NOW)  # the first stage has no name
    job = await claim_one(store, NOW)
    await store.job_finish_many([next_stage(job_id, job.fence, NOW + 1, "publish", "{}")])
    job = await claim_one(store, NOW + 1)
    error = {"message": "x"} if kind == "dead" else None
    end = Finish(kind, job_id, job.fence, NOW + 5, NOW + 2, '"done"', error=error)
    assert (await store.job_finish_many([end])).accepted == [job_id]
    ended = await job_of(store, job_id)
    assert ended.state == kind and ended.stage == "publish"
    assert ended.stages == [
        {"stage": None, "outcome": "next", "attempts": 1, "started_at": NOW,
         "finished_at": NOW + 1},
        {"stage": "publish", "outcome": kind, "attempts": 1, "started_at": NOW + 2,
         "finished_at": NOW + 5},
    ]  # fmt: skip


async def test_a_stage_ended_by_cancel_or_expiry_is_recorded(store: Store) -> None:
    cancelled = await insert(store, NOW, stage="a")
    expiring = await insert(store, NOW, stage="a", expires_at=NOW + 10)
    await store.job_cancel(cancelled, NOW + 1)
    assert await store.job_expire(NOW + 11, 10) == [expiring]
    for job_id, outcome, at in ((cancelled, "cancelled", NOW + 1), (expiring, "expired", NOW + 11)):
        (record,) = (await job_of(store, job_id)).stages
        assert (record["stage"], record["outcome"], record["finished_at"]) == ("a", outcome, at)


async def test_a_plain_job_keeps_no_stage_history(store: Store) -> None:
    job_id = await insert(store, NOW)
    job = await claim_one(store, NOW)
    await store.job_finish_many([Finish("succeeded", job_id, job.fence, NOW, NOW)])
    assert (await job_of(store, job_id)).stages == []


async def test_a_new_stage_queues_again_with_now_minus_priority(store: Store) -> None:
    job_id = await insert(store, NOW, priority=600.0)
    later = await insert(store, NOW + 50)  # enqueued after the first stage started
    job = await claim_one(store, NOW)
    finish = next_stage(job_id, job.fence, NOW + 100, "b", "null", order_time=NOW + 100 - 600)
    await store.job_finish_many([finish])
    assert (await job_of(store, job_id)).order_time == NOW + 100 - 600
    assert (await claim_one(store, NOW + 100)).id == job_id  # its head start holds
    assert (await claim_one(store, NOW + 100)).id == later


async def test_a_delayed_stage_is_scheduled(store: Store) -> None:
    job_id = await insert(store, NOW)
    job = await claim_one(store, NOW)
    finish = next_stage(job_id, job.fence, NOW, "b", "null", run_at=NOW + 30)
    await store.job_finish_many([finish])
    assert (await job_of(store, job_id)).state == State.SCHEDULED
    assert await store.job_claim("default", ["default"], 1, "w", NOW + 29) == []
    assert (await claim_one(store, NOW + 30)).stage == "b"


async def test_a_lost_lease_retries_the_current_stage_only(store: Store) -> None:
    job_id = await insert(store, NOW, stage="audit", ttr=5.0)
    job = await claim_one(store, NOW)
    await store.job_finish_many([next_stage(job_id, job.fence, NOW + 1, "transcode", '"ctx"')])
    await claim_one(store, NOW + 1)  # stage 2 starts, and its worker dies
    assert await Maintenance(store, "leader").recover_leases(NOW + 10) == 1
    again = await job_of(store, job_id)
    assert again.stage == "transcode" and again.context == "ctx" and again.attempts == 1
    assert again.errors[-1]["stage"] == "transcode"
    assert [r["stage"] for r in again.stages] == ["audit"]


async def test_a_lane_is_held_across_the_stages_of_a_job(store: Store) -> None:
    first = await insert(store, NOW, lane="L")
    second = await insert(store, NOW, lane="L")
    job = await claim_one(store, NOW)
    assert job.id == first
    await store.job_finish_many([next_stage(first, job.fence, NOW + 1, "b", "null", lane="L")])
    assert (await job_of(store, second)).state == State.WAITING
    job = await claim_one(store, NOW + 1)
    assert job.id == first and job.stage == "b"
    assert (await job_of(store, second)).state == State.WAITING
    await store.job_finish_many([Finish("succeeded", first, job.fence, NOW + 2, NOW + 1, lane="L")])
    assert (await job_of(store, second)).state == State.READY
