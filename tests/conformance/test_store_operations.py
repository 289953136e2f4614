"""The behavioural suite every Store backend passes: dedup, operator actions, reads,
maintenance, leadership and workers."""

from __future__ import annotations

import asyncio
import time

import pytest

from ferryq.errors import InvalidTransition, JobNotFound
from ferryq.job import State
from ferryq.store import Store, open_store
from ferryq.store.base import Finish, FinishKind, JobFilter, WorkerInfo
from ferryq.store.postgres.store import PostgresStore
from tests.conformance.jobs import NS, claim_one, insert, new_job, succeed
from tests.conftest import START

NOW = START


async def _finish_dead(store: Store, job_id: int, now: float) -> None:
    job = await claim_one(store, now)
    assert job.id == job_id
    await store.job_finish_many([Finish("dead", job_id, job.fence, now, error={"message": "x"})])


async def test_dedup_returns_the_unfinished_job(store: Store) -> None:
    first = await store.job_insert_many(new_job(NOW, unique_key="k"), ["[]"])
    second = await store.job_insert_many(new_job(NOW + 1, unique_key="k"), ["[]"])
    assert first[0].created and not second[0].created
    assert second[0].id == first[0].id
    other_ns = await store.job_insert_many(new_job(NOW, unique_key="k", namespace="b"), ["[]"])
    assert other_ns[0].created


async def test_dedup_without_window_ends_when_the_job_finishes(store: Store) -> None:
    (first,) = await store.job_insert_many(new_job(NOW, unique_key="k"), ["[]"])
    await store.job_finish_many([succeed(await claim_one(store, NOW), NOW)])
    (second,) = await store.job_insert_many(new_job(NOW + 1, unique_key="k"), ["[]"])
    assert second.created and second.id != first.id


async def test_dedup_window_covers_finished_jobs(store: Store) -> None:
    (first,) = await store.job_insert_many(new_job(NOW, unique_key="k", unique_for=60.0), ["[]"])
    await store.job_finish_many([succeed(await claim_one(store, NOW), NOW)])
    (inside,) = await store.job_insert_many(
        new_job(NOW + 59, unique_key="k", unique_for=60.0), ["[]"]
    )
    assert not inside.created and inside.id == first.id
    (after,) = await store.job_insert_many(
        new_job(NOW + 61, unique_key="k", unique_for=60.0), ["[]"]
    )
    assert after.created


async def test_dedup_of_many_jobs_in_one_call_creates_the_first_only(store: Store) -> None:
    rows = await store.job_insert_many(new_job(NOW, unique_key="k"), ["[1]", "[2]", "[3]"])
    assert [row.created for row in rows] == [True, False, False]
    assert {row.id for row in rows} == {rows[0].id}
    job = await store.job_get(rows[0].id)
    assert job is not None and job.args == [1]
    again = await store.job_insert_many(new_job(NOW + 1, unique_key="k"), ["[4]", "[5]"])
    assert [(row.id, row.created) for row in again] == [(rows[0].id, False)] * 2


async def test_dedup_is_atomic_under_concurrent_enqueues(backend_url: str) -> None:
    stores = [open_store(backend_url) for _ in range(4)]
    for s in stores:
        await s.open()
    results = await asyncio.gather(
        *(
            s.job_insert_many(new_job(NOW, unique_key="once"), ["[]"])
            for s in stores
            for _ in range(5)
        )
    )
    created = [row for rows in results for row in rows if row.created]
    assert len(created) == 1
    assert {row.id for rows in results for row in rows} == {created[0].id}
    for s in stores:
        await s.close()


async def test_cancel_a_job_that_is_not_running(store: Store) -> None:
    ready = await insert(store, NOW)
    delayed = await insert(store, NOW, delay=60.0)
    for job_id in (ready, delayed):
        job = await store.job_cancel(job_id, NOW + 1)
        assert job.state == State.CANCELLED and job.finished_at == NOW + 1
    assert await store.job_claim(NS, ["default"], 10, "w1", NOW + 100) == []


async def test_cancel_a_running_job_flags_it_for_its_worker(store: Store) -> None:
    job_id = await insert(store, NOW)
    job = await claim_one(store, NOW)
    flagged = await store.job_cancel(job_id, NOW)
    assert flagged.state == State.RUNNING and flagged.cancel_requested
    leases = await store.job_leases([(job_id, job.fence)], [], NOW)
    assert leases.cancel_requested == [job_id]
    finish = Finish("cancelled", job_id, job.fence, NOW + 1)
    assert (await store.job_finish_many([finish])).accepted == [job_id]
    assert (await store.job_get(job_id)).state == State.CANCELLED  # type: ignore[union-attr]


@pytest.mark.parametrize("kind", ["retry", "next", "returned"])
async def test_a_requested_cancel_wins_over_a_retry(store: Store, kind: FinishKind) -> None:
    job_id = await insert(store, NOW)
    job = await claim_one(store, NOW)
    await store.job_cancel(job_id, NOW)
    finish = Finish(kind, job_id, job.fence, NOW + 1, error={"message": "x"}, run_at=NOW + 1,
                    stage="b", context="{}")  # fmt: skip
    assert (await store.job_finish_many([finish])).accepted == [job_id]
    ended = await store.job_get(job_id)
    assert ended is not None and ended.state == State.CANCELLED and ended.finished_at == NOW + 1


async def test_cancel_refuses_finished_jobs_and_unknown_ids(store: Store) -> None:
    job_id = await insert(store, NOW)
    await store.job_finish_many([succeed(await claim_one(store, NOW), NOW)])
    with pytest.raises(InvalidTransition, match="already succeeded"):
        await store.job_cancel(job_id, NOW)
    with pytest.raises(JobNotFound):
        await store.job_cancel(999_999, NOW)


async def test_cancel_refuses_dead_and_expired_jobs(store: Store) -> None:
    dead = await insert(store, NOW, max_tries=1)
    await _finish_dead(store, dead, NOW)
    expired = await insert(store, NOW, expires_at=NOW + 10)
    assert await store.job_expire(NOW + 20, 10) == [expired]
    for job_id, state in ((dead, "dead"), (expired, "expired")):
        with pytest.raises(InvalidTransition, match=f"already {state}"):
            await store.job_cancel(job_id, NOW + 30)
        job = await store.job_get(job_id)
        assert job is not None and job.state == state


async def test_cancel_is_idempotent(store: Store) -> None:
    job_id = await insert(store, NOW)
    await store.job_cancel(job_id, NOW)
    assert (await store.job_cancel(job_id, NOW + 5)).finished_at == NOW


async def test_respawn_queues_a_dead_job_again_with_fresh_tries(store: Store) -> None:
    job_id = await insert(store, NOW, max_tries=1)
    await _finish_dead(store, job_id, NOW)
    assert await store.job_respawn([job_id, 424242], NOW + 10) == [job_id]
    job = await store.job_get(job_id)
    assert job is not None and job.state == State.READY
    assert job.attempts == 0 and job.run_at == NOW + 10 and len(job.errors) == 1
    assert (await claim_one(store, NOW + 10)).id == job_id


async def test_respawn_ignores_jobs_that_are_not_terminal_failures(store: Store) -> None:
    ready = await insert(store, NOW)
    assert await store.job_respawn([ready], NOW) == []
    done = await insert(store, NOW)
    await store.job_finish_many(
        [succeed(j, NOW) for j in await store.job_claim(NS, ["default"], 10, "w", NOW)]
    )
    assert await store.job_respawn([done], NOW) == []


async def test_respawn_can_set_a_new_expiry(store: Store) -> None:
    job_id = await insert(store, NOW, expires_at=NOW + 1)
    await store.job_expire(NOW + 2, 10)
    await store.job_respawn([job_id], NOW + 3, expires_at=NOW + 100)
    assert (await store.job_get(job_id)).expires_at == NOW + 100  # type: ignore[union-attr]


async def test_purge_deletes_only_dead_jobs(store: Store) -> None:
    dead = await insert(store, NOW, max_tries=1)
    await _finish_dead(store, dead, NOW)
    alive = await insert(store, NOW)
    assert await store.job_purge([dead, alive], NOW) == 1
    assert await store.job_get(dead) is None and await store.job_get(alive) is not None


async def test_counts_cover_hot_and_history(store: Store) -> None:
    await insert(store, NOW)
    await insert(store, NOW, queue="mail", delay=10.0)
    done = await insert(store, NOW, queue="mail")
    job = (await store.job_claim(NS, ["mail"], 1, "w", NOW))[0]
    assert job.id == done
    await store.job_finish_many([succeed(job, NOW)])
    counts = await store.job_counts(NS)
    assert counts == {
        (NS, "default", "ready"): 1,
        (NS, "mail", "scheduled"): 1,
        (NS, "mail", "succeeded"): 1,
    }
    assert await store.job_counts("nobody") == {}


async def test_counts_stay_exact_as_the_history_is_folded(store: Store) -> None:
    """job_counts reads folded history from stored counts (migration 0008): they follow
    late finishes, respawns, purges and pruning of folded rows."""
    day = 86400.0
    if isinstance(store, PostgresStore):
        await store.history_ensure_partitions(NOW)  # days around NOW get partitions

    async def finish(kind: FinishKind, now: float, queue: str = "default") -> int:
        job_id = await insert(store, now, queue=queue)
        job = await claim_one(store, now, queue)
        error = None if kind == "succeeded" else {"message": "x"}
        outcome = Finish(kind, job.id, job.fence, now, now, "null", error)
        assert (await store.job_finish_many([outcome])).accepted == [job_id]
        return job_id

    async def counts_are(expected: dict[tuple[str, str], int]) -> None:
        want = {(NS, queue, state): n for (queue, state), n in expected.items() if n}
        assert await store.job_counts(NS) == want
        assert await store.job_counts(None) == want
        assert await store.job_counts("nobody") == {}

    await finish("succeeded", NOW)
    await finish("succeeded", NOW, queue="mail")
    respawned = await finish("dead", NOW)
    purged = await finish("dead", NOW)  # the last row of the history, for now
    await insert(store, NOW, queue="idle")
    counts = {("default", "succeeded"): 1, ("mail", "succeeded"): 1, ("default", "dead"): 2,
              ("idle", "ready"): 1}  # fmt: skip
    await counts_are(counts)

    later = NOW + 3 * day
    assert await store.history_fold(later) == 4
    assert await store.history_fold(later) == 0
    await counts_are(counts)

    assert await store.job_respawn([respawned], later) == [respawned]
    assert await store.job_purge([purged], later) == 1
    counts[("default", "dead")] -= 2
    counts[("default", "ready")] = 1
    await counts_are(counts)

    await finish("succeeded", NOW, queue="mail")  # late: a folded day (a clock far behind)
    await finish("succeeded", later, queue="mail")
    counts[("mail", "succeeded")] += 2
    await counts_are(counts)

    await store.history_fold(later + day)
    await counts_are(counts)

    assert await store.history_prune(NOW + day, 1000) == 3  # the three left of day NOW
    counts[("default", "succeeded")] -= 1
    counts[("mail", "succeeded")] -= 2
    await counts_are(counts)


async def test_list_filters_and_pages_newest_first(store: Store) -> None:
    ids = [await insert(store, NOW, args=f'["item {i}"]') for i in range(7)]
    await insert(store, NOW, queue="mail", task="send", args='["50% off_sale"]')
    job = await claim_one(store, NOW)
    await store.job_finish_many([succeed(job, NOW)])  # ids[0] goes to history

    page1 = await store.job_list(JobFilter(namespace=NS, queue="default", limit=3))
    assert [j.id for j in page1] == ids[6:3:-1]
    page2 = await store.job_list(JobFilter(namespace=NS, queue="default", limit=3,
                                           after_id=page1[-1].id))  # fmt: skip
    page3 = await store.job_list(JobFilter(namespace=NS, queue="default", limit=3,
                                           after_id=page2[-1].id))  # fmt: skip
    assert [j.id for j in page2 + page3] == ids[3::-1]
    assert [j.id for j in await store.job_list(JobFilter(state=State.SUCCEEDED))] == [ids[0]]
    assert len(await store.job_list(JobFilter(task="send"))) == 1
    assert len(await store.job_list(JobFilter(text="50%"))) == 1
    assert len(await store.job_list(JobFilter(text="5_%"))) == 0
    assert len(await store.job_list(JobFilter(text="item 3"))) == 1


async def test_history_prune_removes_old_finished_jobs(store: Store) -> None:
    old = await insert(store, NOW)
    await store.job_finish_many([succeed(await claim_one(store, NOW), NOW)])
    recent = await insert(store, NOW)
    await store.job_finish_many([succeed(await claim_one(store, NOW + 100), NOW + 100)])
    assert await store.history_prune(NOW + 50, 1000) == 1
    assert await store.job_get(old) is None and await store.job_get(recent) is not None


async def _two_stores(backend_url: str) -> tuple[Store, Store]:
    a, b = open_store(backend_url), open_store(backend_url)
    await a.open()
    await b.open()
    return a, b


async def test_leadership_is_exclusive(backend_url: str) -> None:
    a, b = await _two_stores(backend_url)
    assert await a.leader_acquire("m", "a", 5.0, NOW)
    assert await a.leader_acquire("m", "a", 5.0, NOW + 1)  # renew
    assert not await b.leader_acquire("m", "b", 5.0, NOW + 2)
    await b.leader_release("m", "b")  # not the holder: nothing happens
    assert not await b.leader_acquire("m", "b", 5.0, NOW + 3)
    await a.leader_release("m", "a")
    assert await b.leader_acquire("m", "b", 5.0, NOW + 4)
    assert not await a.leader_acquire("m", "a", 5.0, NOW + 5)
    await a.close()
    await b.close()


async def test_one_store_leads_several_things_at_once(backend_url: str) -> None:
    # A worker's maintenance and periodic loops ask at the same moment.
    a, b = await _two_stores(backend_url)
    for now in (NOW, NOW + 1, NOW + 2):  # taken, then renewed while held
        asked = [a.leader_acquire(name, "a", 5.0, now) for name in ("m", "p", "m", "p")]
        assert await asyncio.gather(*asked) == [True] * 4
    assert not await b.leader_acquire("m", "b", 5.0, NOW + 3)
    assert not await b.leader_acquire("p", "b", 5.0, NOW + 3)
    await asyncio.gather(a.leader_release("m", "a"), a.leader_release("p", "a"))
    assert await b.leader_acquire("p", "b", 5.0, NOW + 4)
    await a.close()
    await b.close()


async def test_leadership_passes_on_when_the_leader_goes_away(backend_url: str) -> None:
    a, b = await _two_stores(backend_url)
    assert await a.leader_acquire("m", "a", 5.0, NOW)
    await a.close()  # the leader's process is gone, without a word
    assert await b.leader_acquire("m", "b", 5.0, NOW + 6)
    await b.close()


async def test_workers_beat_list_and_prune(store: Store) -> None:
    info = WorkerInfo("w1", NS, ["default", "mail"], "host", 123, 10, NOW, NOW, [1, 2])
    await store.worker_beat(info)
    await store.worker_beat(WorkerInfo("w2", NS, ["x"], "host", 124, 1, NOW, NOW - 100))
    (alive,) = await store.worker_list(alive_since=NOW - 10)
    assert alive.id == "w1" and alive.queues == ["default", "mail"] and alive.running == [1, 2]
    info.heartbeat_at, info.running = NOW + 5, []
    await store.worker_beat(info)
    assert (await store.worker_list(alive_since=NOW))[0].running == []
    assert await store.worker_prune(NOW - 50) == 1
    await store.worker_remove("w1")
    assert await store.worker_list() == []


async def test_a_second_store_sees_the_same_jobs(store: Store, backend_url: str) -> None:
    job_id = await insert(store, NOW)
    other = open_store(backend_url)
    await other.open()
    assert (await claim_one(other, NOW)).id == job_id
    assert (await store.job_get(job_id)).state == State.RUNNING  # type: ignore[union-attr]
    await other.close()


async def test_the_server_time_is_the_database_servers_clock(
    store: Store, backend_url: str
) -> None:
    """PostgreSQL's clock (ferryq.clock keeps it); None for a file on this host."""
    server = await store.server_time()
    if backend_url.startswith("sqlite"):
        assert server is None
    else:
        assert server is not None and abs(server - time.time()) < 60  # same machine
