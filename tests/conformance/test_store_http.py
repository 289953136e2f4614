"""The Store as the HTTP API uses it, on every backend: take and ack by queue, peek,
sizes, clear, dead letters oldest first, respawn with new tries, and API tokens."""

from __future__ import annotations

import pytest

from ferryq.job import State
from ferryq.lanes import LaneRule
from ferryq.store import Store, open_store
from ferryq.store.base import Finish, Token
from tests.conformance.jobs import NS, claim_one, insert, succeed, wakes_only_on_writes
from tests.conftest import START

NOW = START


async def _state(store: Store, job_id: int) -> State | None:
    job = await store.job_get(job_id)
    return None if job is None else job.state


async def _take(store: Store, now: float = NOW, limit: int = 10, queue: str = "default",
                ttr: float = 120.0) -> list[int]:  # fmt: skip
    return [job.id for job in await store.job_take(NS, queue, limit, "http", ttr, now)]


async def _kill(store: Store, job_id: int, now: float) -> None:
    """Take the job (the next of its queue) and let its only try fail."""
    (job,) = await store.job_claim(NS, ["default"], 1, "w1", now)
    assert job.id == job_id
    finish = Finish("dead", job_id, job.fence, now, now, error={"message": "x"})
    assert (await store.job_finish_many([finish])).accepted == [job_id]


# -- take --------------------------------------------------------------------------


async def test_take_follows_claim_order_and_limit(store: Store) -> None:
    old = await insert(store, NOW - 100)
    young = await insert(store, NOW)
    urgent = await insert(store, NOW, priority=600.0)
    await insert(store, NOW, queue="other")
    await insert(store, NOW, namespace="elsewhere")
    assert await _take(store, limit=2) == [urgent, old]
    assert await _take(store) == [young]
    assert await _take(store) == []
    assert await store.job_take(NS, "default", 0, "http", 60.0, NOW) == []


async def test_take_leases_for_the_ttr_given_and_keeps_it_as_the_jobs_ttr(
    store: Store,
) -> None:
    job_id = await insert(store, NOW, ttr=30.0, args='{"body": "aGk="}', meta='{"a": "b"}')
    (job,) = await store.job_take(NS, "default", 1, "consumer-1", 45.0, NOW + 1)
    assert job.id == job_id and job.state == State.RUNNING
    assert job.ttr == 45.0 and job.lease_until == NOW + 1 + 45.0
    assert job.attempts == 1 and job.fence == 1 and job.worker == "consumer-1"
    assert job.claimed_at == NOW + 1 and job.started_at == NOW + 1
    assert job.args == {"body": "aGk="} and job.meta == {"a": "b"}
    assert await store.job_get(job_id) == job
    # A renewal of the lease uses the ttr the consumer asked for.
    assert (await store.job_leases([(job_id, 1)], [job_id], NOW + 10)).extended == [job_id]
    renewed = await store.job_get(job_id)
    assert renewed is not None and renewed.lease_until == NOW + 10 + 45.0


async def test_take_counts_attempts_and_fences_like_a_claim(store: Store) -> None:
    job_id = await insert(store, NOW, max_tries=3)
    (first,) = await store.job_take(NS, "default", 1, "http", 5.0, NOW)
    retry = Finish("retry", job_id, first.fence, NOW + 1, NOW, error={"message": "x"},
                   run_at=NOW + 1)  # fmt: skip
    assert (await store.job_finish_many([retry])).accepted == [job_id]
    (second,) = await store.job_take(NS, "default", 1, "http", 5.0, NOW + 1)
    assert (second.attempts, second.fence) == (2, 2)
    late = Finish("succeeded", job_id, first.fence, NOW + 2, NOW)
    assert (await store.job_finish_many([late])).stale == [job_id]


async def test_take_promotes_due_jobs_first(store: Store) -> None:
    delayed = await insert(store, NOW, delay=10.0)
    ready = await insert(store, NOW + 5)
    assert await _take(store, NOW + 9) == [ready]
    assert await _take(store, NOW + 9) == []
    assert await _take(store, NOW + 10) == [delayed]


async def test_take_leaves_expired_jobs(store: Store) -> None:
    expired = await insert(store, NOW, expires_at=NOW + 5)
    fresh = await insert(store, NOW)
    assert await _take(store, NOW + 5) == [fresh]
    assert await _state(store, expired) == State.READY


async def test_a_consumer_that_found_nothing_is_woken_by_the_next_enqueue(
    store: Store, backend_url: str
) -> None:
    other = open_store(backend_url)
    await other.open()
    try:
        assert await _take(store) == []
        if wakes_only_on_writes(backend_url):
            assert not await store.wait_for_change(0.05)
        await insert(other, NOW)
        assert await store.wait_for_change(5.0)
        assert len(await _take(store)) == 1
    finally:
        await other.close()


# -- ack ---------------------------------------------------------------------------


async def test_ack_ends_a_taken_job_as_succeeded(store: Store) -> None:
    job_id = await insert(store, NOW)
    (taken,) = await store.job_take(NS, "default", 1, "http", 60.0, NOW)
    assert await store.job_ack(NS, "default", [job_id], NOW + 3) == [job_id]
    job = await store.job_get(job_id)
    assert job is not None and job.state == State.SUCCEEDED
    assert job.finished_at == NOW + 3 and job.lease_until is None
    assert job.started_at == taken.started_at == NOW and job.claimed_at == NOW
    assert job.attempts == 1 and job.worker == "http"
    assert (await store.job_leases([(job_id, taken.fence)], [], NOW + 4)).lost == [job_id]


@pytest.mark.parametrize("how", ["ready", "scheduled", "waiting"])
async def test_ack_ends_a_job_that_has_not_started(store: Store, how: str) -> None:
    if how == "waiting":
        await insert(store, NOW, lane="L")
        job_id = await insert(store, NOW, lane="L")
    else:
        job_id = await insert(store, NOW, delay=60.0 if how == "scheduled" else 0.0)
    assert await _state(store, job_id) == how
    assert await store.job_ack(NS, "default", [job_id], NOW + 1) == [job_id]
    job = await store.job_get(job_id)
    assert job is not None and job.state == State.SUCCEEDED and job.finished_at == NOW + 1
    assert job.started_at is None and job.attempts == 0


async def test_ack_ignores_unknown_ids_other_queues_and_finished_jobs(store: Store) -> None:
    elsewhere = await insert(store, NOW, queue="other")
    other_ns = await insert(store, NOW, namespace="elsewhere")
    done = await insert(store, NOW)
    await store.job_finish_many([succeed(await claim_one(store, NOW), NOW)])
    dead = await insert(store, NOW, max_tries=1)
    await _kill(store, dead, NOW)
    mine = await insert(store, NOW)
    acked = await store.job_ack(NS, "default", [424242, elsewhere, other_ns, done, dead, mine,
                                                mine], NOW + 1)  # fmt: skip
    assert acked == [mine]
    assert await _state(store, elsewhere) == State.READY
    other = await store.job_get(other_ns)
    assert other is not None and other.state == State.READY
    assert await _state(store, dead) == State.DEAD
    finished = await store.job_get(done)
    assert finished is not None and finished.finished_at == NOW
    assert await store.job_ack(NS, "default", [], NOW) == []


async def test_ack_frees_the_lane_like_a_success(store: Store) -> None:
    first = await insert(store, NOW, lane="L")
    second = await insert(store, NOW, lane="L")
    assert await _state(store, second) == State.WAITING
    assert await _take(store) == [first]
    assert await _take(store) == []
    assert await store.job_ack(NS, "default", [first], NOW + 1) == [first]
    assert await _state(store, second) == State.READY
    assert await _take(store, NOW + 1) == [second]


async def test_ack_of_an_admitted_job_admits_the_next(store: Store) -> None:
    await store.lane_rule_set(NS, LaneRule("L", 1), NOW)
    first, second, third = [await insert(store, NOW, lane="L") for _ in range(3)]
    assert await store.job_ack(NS, "default", [first, third], NOW + 1) == [first, third]
    assert await _state(store, second) == State.READY
    assert (await store.lane_view(NS, "L")).waiting == []


# -- peek, size, clear -------------------------------------------------------------


async def test_peek_shows_the_next_job_to_take_and_changes_nothing(store: Store) -> None:
    assert await store.queue_peek(NS, "default", NOW) is None
    expired = await insert(store, NOW - 10, expires_at=NOW)
    later = await insert(store, NOW)
    first = await insert(store, NOW - 5, args='["x"]')
    await insert(store, NOW - 100, queue="other")
    peeked = await store.queue_peek(NS, "default", NOW)
    assert peeked is not None and peeked.id == first and peeked.args == ["x"]
    assert peeked.state == State.READY and peeked.attempts == 0
    assert await store.queue_peek(NS, "default", NOW) == peeked
    assert await store.job_get(first) == peeked
    assert await _take(store, NOW, limit=1) == [first]
    assert (await store.queue_peek(NS, "default", NOW)).id == later  # type: ignore[union-attr]
    assert await _state(store, expired) == State.READY


async def test_size_counts_each_state_hot_and_historical(store: Store) -> None:
    for _ in range(3):
        await insert(store, NOW)
    await insert(store, NOW, delay=60.0)
    await insert(store, NOW, lane="L")
    await insert(store, NOW, lane="L")  # waiting behind the lane's first
    await insert(store, NOW, queue="other")
    await insert(store, NOW, namespace="elsewhere")
    dead = await insert(store, NOW - 10, max_tries=1)
    await _kill(store, dead, NOW)
    done = await _take(store, limit=1)
    await store.job_ack(NS, "default", done, NOW)
    await _take(store, limit=1)
    cancelled = await insert(store, NOW, delay=5.0)
    await store.job_cancel(cancelled, NOW)
    expected = {
        State.READY: 2, State.SCHEDULED: 1, State.WAITING: 1, State.RUNNING: 1,
        State.SUCCEEDED: 1, State.DEAD: 1, State.CANCELLED: 1, State.EXPIRED: 0,
    }  # fmt: skip
    sizes = {state: await store.queue_size(NS, "default", state) for state in State}
    assert sizes == expected
    assert await store.queue_size(NS, "other", State.READY) == 1
    assert await store.queue_size("elsewhere", "default", State.READY) == 1
    assert await store.queue_size(NS, "nothing", State.DEAD) == 0


async def test_clear_cancels_the_ready_jobs_of_the_queue_only(store: Store) -> None:
    ready = [await insert(store, NOW) for _ in range(3)]
    delayed = await insert(store, NOW, delay=60.0)
    running = await insert(store, NOW - 1)
    assert await _take(store, limit=1) == [running]
    other = await insert(store, NOW, queue="other")
    other_ns = await insert(store, NOW, namespace="elsewhere")
    assert await store.queue_clear(NS, "default", NOW + 1) == 3
    for job_id in ready:
        job = await store.job_get(job_id)
        assert job is not None and job.state == State.CANCELLED and job.finished_at == NOW + 1
    assert await _state(store, delayed) == State.SCHEDULED
    assert await _state(store, running) == State.RUNNING
    assert await _state(store, other) == State.READY
    assert await _state(store, other_ns) == State.READY
    assert await store.queue_size(NS, "default", State.CANCELLED) == 3
    assert await store.queue_clear(NS, "default", NOW + 2) == 0


async def test_clear_lets_the_lanes_admit_their_next_jobs(store: Store) -> None:
    first = await insert(store, NOW, lane="L")
    second = await insert(store, NOW, lane="L")
    third = await insert(store, NOW, lane="L", queue="other")
    assert await store.queue_clear(NS, "default", NOW) == 1
    assert await _state(store, first) == State.CANCELLED
    assert await _state(store, second) == State.READY
    assert await _state(store, third) == State.WAITING
    assert await store.queue_clear(NS, "default", NOW) == 1
    assert await _state(store, third) == State.READY


# -- dead letters ------------------------------------------------------------------


async def test_dead_oldest_lists_the_longest_dead_first(store: Store) -> None:
    ids = [await insert(store, NOW, max_tries=1) for _ in range(3)]
    taken = {job.id: job for job in await store.job_take(NS, "default", 3, "http", 60.0, NOW)}
    # The last dies first; then the second and the first, at one moment.
    for job_id, died in ((ids[2], NOW + 10), (ids[1], NOW + 20), (ids[0], NOW + 20)):
        finish = Finish("dead", job_id, taken[job_id].fence, died, NOW, error={"message": "x"})
        assert (await store.job_finish_many([finish])).accepted == [job_id]
    assert await store.dead_oldest(NS, "default", 10) == [ids[2], ids[0], ids[1]]
    assert await store.dead_oldest(NS, "default", 2) == [ids[2], ids[0]]
    assert await store.dead_oldest(NS, "other", 10) == []
    assert await store.dead_oldest("elsewhere", "default", 10) == []
    assert await store.queue_size(NS, "default", State.DEAD) == 3


async def test_respawn_can_give_new_tries(store: Store) -> None:
    dead = await insert(store, NOW, max_tries=3)
    (job,) = await store.job_take(NS, "default", 1, "http", 60.0, NOW)
    await store.job_finish_many([Finish("dead", dead, job.fence, NOW, NOW, error={"m": 1})])
    assert await store.dead_oldest(NS, "default", 1) == [dead]
    assert await store.job_respawn([dead], NOW + 1, NOW + 100, max_tries=1) == [dead]
    respawned = await store.job_get(dead)
    assert respawned is not None and respawned.state == State.READY
    assert respawned.max_tries == 1 and respawned.attempts == 0
    assert respawned.expires_at == NOW + 100
    assert await store.dead_oldest(NS, "default", 1) == []
    (again,) = await store.job_take(NS, "default", 1, "http", 60.0, NOW + 1)
    await store.job_finish_many([Finish("dead", dead, again.fence, NOW + 2, NOW + 2)])
    assert await store.job_respawn([dead], NOW + 3) == [dead]
    kept = await store.job_get(dead)
    assert kept is not None and kept.max_tries == 1 and kept.expires_at is None


# -- tokens ------------------------------------------------------------------------


def _token(
    digest: str,
    namespace: str = NS,
    created_at: float = NOW,
    limit_read: int | None = None,
    limit_write: int | None = None,
    limit_interval: float | None = None,
) -> Token:
    return Token(namespace, digest, f"token {digest}", digest[:4], created_at, limit_read,
                 limit_write, limit_interval)  # fmt: skip


async def test_tokens_are_created_once_read_and_listed_oldest_first(store: Store) -> None:
    assert await store.token_create(_token("d2", created_at=NOW + 1))
    assert await store.token_create(_token("d1", created_at=NOW))
    assert await store.token_create(_token("d3", "other", NOW - 1))
    assert not await store.token_create(_token("d1", "other", NOW + 5))  # digest taken
    assert await store.token_get("d1") == _token("d1", created_at=NOW)
    assert await store.token_get("nope") is None
    assert [t.digest for t in await store.token_list(NS)] == ["d1", "d2"]
    assert [t.digest for t in await store.token_list("other")] == ["d3"]
    assert [t.digest for t in await store.token_list(None)] == ["d3", "d1", "d2"]
    assert await store.token_list("nobody") == []


async def test_a_token_is_deleted_only_within_its_namespace(store: Store) -> None:
    await store.token_create(_token("d1"))
    assert not await store.token_delete("other", "d1")
    assert await store.token_get("d1") is not None
    assert await store.token_delete(NS, "d1")
    assert await store.token_get("d1") is None
    assert not await store.token_delete(NS, "d1")


async def test_token_limits_are_set_changed_and_cleared(store: Store) -> None:
    await store.token_create(_token("d1", limit_read=5, limit_write=6, limit_interval=7.0))
    assert await store.token_get("d1") == _token(
        "d1", limit_read=5, limit_write=6, limit_interval=7.0
    )
    assert await store.token_limit_set("d1", 100, None, 1.5)
    token = await store.token_get("d1")
    assert token is not None
    assert (token.limit_read, token.limit_write, token.limit_interval) == (100, None, 1.5)
    assert await store.token_limit_set("d1", None, None, None)
    assert await store.token_get("d1") == _token("d1")
    assert not await store.token_limit_set("missing", 1, 1, 1.0)
