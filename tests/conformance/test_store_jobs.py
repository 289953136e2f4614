"""The behavioural suite every Store backend passes: the job hot path."""

from __future__ import annotations

import json

from ferryq.job import State
from ferryq.store import Store, open_store
from ferryq.store.base import Finish, FinishKind
from tests.conformance.jobs import NS, claim_one, insert, new_job, succeed, wakes_only_on_writes
from tests.conftest import START

NOW = START


async def test_migrations_apply_once(store: Store, backend_url: str) -> None:
    assert await store.schema_version() >= 1
    assert await store.migrate() == []
    again = open_store(backend_url)
    await again.open()
    assert await again.migrate() == []
    await again.close()


async def test_ids_increase_in_enqueue_order(store: Store) -> None:
    rows = await store.job_insert_many(new_job(NOW), ["[]"] * 5)
    ids = [row.id for row in rows]
    assert ids == sorted(ids) and len(set(ids)) == 5
    assert all(row.created for row in rows)
    later = await insert(store, NOW)
    assert later > ids[-1]


async def test_ids_are_never_reused_after_jobs_leave_the_hot_table(store: Store) -> None:
    first = await insert(store, NOW)
    job = await claim_one(store, NOW)
    await store.job_finish_many([succeed(job, NOW)])
    assert await insert(store, NOW) > first


async def test_claim_order_is_order_time_then_id(store: Store) -> None:
    old = await insert(store, NOW - 100)
    young = await insert(store, NOW)
    head_start = await insert(store, NOW, priority=600.0)
    claimed = await store.job_claim(NS, ["default"], 10, "w1", NOW)
    assert [c.id for c in claimed] == [head_start, old, young]


async def test_priority_is_relative_and_does_not_starve_old_jobs(store: Store) -> None:
    ancient = await insert(store, NOW - 3600)
    urgent = await insert(store, NOW, priority=600.0)
    claimed = await store.job_claim(NS, ["default"], 10, "w1", NOW)
    assert [c.id for c in claimed] == [ancient, urgent]


async def test_claim_takes_only_what_is_asked_and_leases_it(store: Store) -> None:
    for _ in range(5):
        await insert(store, NOW, ttr=42.0)
    claimed = await store.job_claim(NS, ["default"], 2, "w7", NOW)
    assert len(claimed) == 2
    job = await store.job_get(claimed[0].id)
    assert job is not None
    assert job.state == State.RUNNING and job.worker == "w7"
    assert job.attempts == 1 and job.fence == 1
    assert job.claimed_at == NOW and job.lease_until == NOW + 42.0
    assert len(await store.job_claim(NS, ["default"], 10, "w7", NOW)) == 3


async def test_the_times_of_a_running_attempt_are_its_own(store: Store) -> None:
    # While an attempt runs, started_at is its claim; when it ends, the handler's
    # start. The previous attempt's end is not shown as this one's.
    job_id = await insert(store, NOW, max_tries=3)
    first = await claim_one(store, NOW)
    retry = Finish("retry", job_id, first.fence, NOW + 3, NOW + 1, error={"message": "x"},
                   run_at=NOW + 5, order_time=NOW + 5)  # fmt: skip
    await store.job_finish_many([retry])
    job = await store.job_get(job_id)
    assert job is not None and (job.started_at, job.finished_at) == (NOW + 1, NOW + 3)
    await claim_one(store, NOW + 5)
    job = await store.job_get(job_id)
    assert job is not None and job.state == State.RUNNING
    assert (job.claimed_at, job.started_at, job.finished_at) == (NOW + 5, NOW + 5, None)


async def test_claim_respects_queue_and_namespace(store: Store) -> None:
    mail = await insert(store, NOW, queue="mail")
    await insert(store, NOW, queue="other")
    await insert(store, NOW, queue="mail", namespace="elsewhere")
    claimed = await store.job_claim(NS, ["mail"], 10, "w1", NOW)
    assert [c.id for c in claimed] == [mail]


async def test_claim_across_queues_merges_in_order(store: Store) -> None:
    b_old = await insert(store, NOW - 10, queue="b")
    a_new = await insert(store, NOW, queue="a")
    a_old = await insert(store, NOW - 20, queue="a")
    claimed = await store.job_claim(NS, ["a", "b"], 10, "w1", NOW)
    assert [c.id for c in claimed] == [a_old, b_old, a_new]


async def test_delayed_job_is_not_claimed_before_it_is_due(store: Store) -> None:
    job_id = await insert(store, NOW, delay=30.0)
    assert (await store.job_get(job_id)).state == State.SCHEDULED  # type: ignore[union-attr]
    assert await store.job_claim(NS, ["default"], 10, "w1", NOW + 29.9) == []
    assert await store.job_next_due(NS, ["default"]) == NOW + 30.0
    (claimed,) = await store.job_claim(NS, ["default"], 10, "w1", NOW + 30.0)
    assert claimed.id == job_id


async def test_next_due_looks_only_at_the_queues_asked_for(store: Store) -> None:
    await insert(store, NOW, delay=10.0, queue="other")
    await insert(store, NOW, delay=20.0, queue="mail", namespace="elsewhere")
    await insert(store, NOW, delay=40.0, queue="mail")
    await insert(store, NOW, delay=30.0, queue="news")
    assert await store.job_next_due(NS, ["mail"]) == NOW + 40.0
    assert await store.job_next_due(NS, ["mail", "news"]) == NOW + 30.0
    assert await store.job_next_due(NS, ["empty"]) is None
    assert await store.job_next_due("elsewhere", ["mail", "other"]) == NOW + 20.0


async def test_a_claim_promotes_the_due_jobs_of_its_own_queues_only(store: Store) -> None:
    # Maintenance promotes the rest: a claim stays within its namespace and queues.
    mine = await insert(store, NOW, delay=5.0, queue="mail")
    other_queue = await insert(store, NOW, delay=5.0, queue="other")
    other_namespace = await insert(store, NOW, delay=5.0, queue="mail", namespace="elsewhere")
    (claimed,) = await store.job_claim(NS, ["mail"], 10, "w1", NOW + 5)
    assert claimed.id == mine
    for job_id in (other_queue, other_namespace):
        assert (await store.job_get(job_id)).state == State.SCHEDULED  # type: ignore[union-attr]
    assert await store.job_promote_due(NOW + 5, 100) == 2


async def test_promote_due_makes_scheduled_jobs_ready(store: Store) -> None:
    job_id = await insert(store, NOW, delay=5.0)
    assert await store.job_promote_due(NOW + 4, 100) == 0
    assert await store.job_promote_due(NOW + 5, 100) == 1
    assert (await store.job_get(job_id)).state == State.READY  # type: ignore[union-attr]


async def test_success_moves_the_job_to_history_with_its_result(store: Store) -> None:
    job_id = await insert(store, NOW, args='["x"]')
    job = await claim_one(store, NOW)
    report = await store.job_finish_many([succeed(job, NOW + 1, '{"ok":true}')])
    assert report.accepted == [job_id] and report.stale == []
    done = await store.job_get(job_id)
    assert done is not None
    assert done.state == State.SUCCEEDED and done.result == {"ok": True}
    assert done.args == ["x"] and done.finished_at == NOW + 1 and done.lease_until is None
    assert await store.job_claim(NS, ["default"], 10, "w1", NOW + 2) == []


async def test_stale_fence_is_rejected_and_the_newer_attempt_wins(store: Store) -> None:
    job_id = await insert(store, NOW, ttr=10.0)
    first = await claim_one(store, NOW)
    # The lease runs out and the job is retried at once by someone else.
    retry = Finish("retry", job_id, first.fence, NOW + 11, run_at=NOW + 11, order_time=NOW + 11,
                   error={"message": "lease expired"})  # fmt: skip
    assert (await store.job_finish_many([retry])).accepted == [job_id]
    second = await claim_one(store, NOW + 11)
    assert second.fence == first.fence + 1
    late = await store.job_finish_many([succeed(first, NOW + 12, '"late"')])
    assert late.accepted == [] and late.stale == [job_id]
    assert (await store.job_get(job_id)).state == State.RUNNING  # type: ignore[union-attr]
    fresh = await store.job_finish_many([succeed(second, NOW + 13, '"fresh"')])
    assert fresh.accepted == [job_id]
    assert (await store.job_get(job_id)).result == "fresh"  # type: ignore[union-attr]


async def test_a_stale_finish_in_a_batch_does_not_block_the_others(store: Store) -> None:
    ids = [await insert(store, NOW) for _ in range(3)]
    jobs = await store.job_claim(NS, ["default"], 3, "w1", NOW)
    batch = [succeed(j, NOW) for j in jobs]
    batch[1] = Finish("succeeded", jobs[1].id, jobs[1].fence + 5, NOW)
    report = await store.job_finish_many(batch)
    assert sorted(report.accepted) == [ids[0], ids[2]] and report.stale == [ids[1]]
    assert (await store.job_get(ids[1])).state == State.RUNNING  # type: ignore[union-attr]


async def test_retry_requeues_with_backoff_and_keeps_the_error(store: Store) -> None:
    job_id = await insert(store, NOW)
    job = await claim_one(store, NOW)
    error = {"type": "RuntimeError", "message": "boom", "attempt": 1}
    finish = Finish("retry", job_id, job.fence, NOW + 1, NOW, error=error,
                    run_at=NOW + 61, order_time=NOW + 61)  # fmt: skip
    assert (await store.job_finish_many([finish])).accepted == [job_id]
    waiting = await store.job_get(job_id)
    assert waiting is not None
    assert waiting.state == State.SCHEDULED and waiting.run_at == NOW + 61
    assert waiting.error == error and waiting.errors == [error] and waiting.attempts == 1
    assert await store.job_claim(NS, ["default"], 1, "w1", NOW + 60) == []
    again = await claim_one(store, NOW + 61)
    assert again.attempts == 2 and again.fence == 2


async def test_retry_without_backoff_is_ready_at_once(store: Store) -> None:
    job_id = await insert(store, NOW)
    job = await claim_one(store, NOW)
    finish = Finish("retry", job_id, job.fence, NOW, error={"message": "x"}, run_at=NOW)
    await store.job_finish_many([finish])
    assert (await store.job_get(job_id)).state == State.READY  # type: ignore[union-attr]


async def test_dead_keeps_every_error(store: Store) -> None:
    job_id = await insert(store, NOW, max_tries=2)
    for attempt in (1, 2):
        job = await claim_one(store, NOW + attempt)
        kind: FinishKind = "retry" if attempt == 1 else "dead"
        error = {"message": f"fail {attempt}"}
        finish = Finish(kind, job_id, job.fence, NOW + attempt, error=error, run_at=NOW + attempt)
        await store.job_finish_many([finish])
    dead = await store.job_get(job_id)
    assert dead is not None and dead.state == State.DEAD
    assert [e["message"] for e in dead.errors] == ["fail 1", "fail 2"]
    assert dead.error == {"message": "fail 2"}


async def test_returned_job_is_ready_again_without_a_charged_try(store: Store) -> None:
    job_id = await insert(store, NOW)
    job = await claim_one(store, NOW)
    await store.job_finish_many([Finish("returned", job_id, job.fence, NOW)])
    back = await store.job_get(job_id)
    assert back is not None and back.state == State.READY and back.attempts == 0
    assert (await claim_one(store, NOW)).fence == 2


async def test_leases_extend_only_with_the_current_fence(store: Store) -> None:
    job_id = await insert(store, NOW, ttr=10.0)
    job = await claim_one(store, NOW)
    leases = await store.job_leases([(job_id, job.fence)], [job_id], NOW + 5)
    assert leases.extended == [job_id] and leases.lost == []
    assert (await store.job_get(job_id)).lease_until == NOW + 15  # type: ignore[union-attr]
    leases = await store.job_leases([(job_id, job.fence + 1)], [job_id], NOW + 6)
    assert leases.lost == [job_id]


async def test_expired_leases_are_listed(store: Store) -> None:
    job_id = await insert(store, NOW, ttr=10.0)
    await claim_one(store, NOW)
    assert await store.job_expired_leases(NOW + 10, 10) == []
    (expired,) = await store.job_expired_leases(NOW + 10.5, 10)
    assert expired.id == job_id and expired.fence == 1


async def test_ttl_expires_jobs_that_are_not_running(store: Store) -> None:
    waiting = await insert(store, NOW, expires_at=NOW + 60)
    delayed = await insert(store, NOW, delay=120.0, expires_at=NOW + 60)
    running = await insert(store, NOW, expires_at=NOW + 60, queue="busy")
    await claim_one(store, NOW, queue="busy")
    # A job past its ttl is never started, even before maintenance expires it.
    assert await store.job_claim(NS, ["default"], 10, "w1", NOW + 60) == []
    assert sorted(await store.job_expire(NOW + 60, 100)) == [waiting, delayed]
    for job_id in (waiting, delayed):
        job = await store.job_get(job_id)
        assert job is not None and job.state == State.EXPIRED and job.finished_at == NOW + 60
    assert (await store.job_get(running)).state == State.RUNNING  # type: ignore[union-attr]


async def test_next_due_is_the_earliest_scheduled_job(store: Store) -> None:
    assert await store.job_next_due(NS, ["default"]) is None
    await insert(store, NOW, delay=50.0)
    await insert(store, NOW, delay=20.0)
    assert await store.job_next_due(NS, ["default"]) == NOW + 20.0


async def test_wait_for_change_sees_another_connections_write(
    store: Store, backend_url: str
) -> None:
    await store.job_claim(NS, ["default"], 1, "w1", NOW)  # marks "seen"
    if wakes_only_on_writes(backend_url):
        assert await store.wait_for_change(0.01) is False
    other = open_store(backend_url)
    await other.open()
    await insert(other, NOW)
    assert await store.wait_for_change(5.0) is True
    await other.close()


async def test_args_and_meta_round_trip_as_json(store: Store) -> None:
    args = json.dumps({"name": "ü", "n": [1, 2.5, None]})
    job_id = await insert(store, NOW, args=args, meta='{"attr":"x"}')
    job = await store.job_get(job_id)
    assert job is not None and job.args == {"name": "ü", "n": [1, 2.5, None]}
    assert job.meta == {"attr": "x"}
