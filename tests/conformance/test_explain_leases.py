"""Explain of a running job looks past the lease to the worker holding it: a holder that
stopped heartbeating is named, and so is the lack of anyone to recover its lease."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ferryq import insights
from ferryq.insights import WORKER_ALIVE_SECONDS, when
from ferryq.store import Store
from ferryq.store.base import WorkerInfo
from tests.conformance.backends import backend_url as backend_url  # not pooled
from tests.conformance.jobs import NS, claim_one, insert
from tests.conftest import FrozenClock

TTR = 60.0  # the lease outlives the holder's last heartbeat by more than the live window


def _worker(worker_id: str, heartbeat_at: float, queues: list[str] | None = None) -> WorkerInfo:
    return WorkerInfo(worker_id, NS, queues or ["default"], "host", 1, 1, heartbeat_at - 5,
                      heartbeat_at)  # fmt: skip


async def _running(store: Store, clock: FrozenClock) -> int:
    """A job claimed by worker w1 (the claim's holder), leased for TTR seconds."""
    job_id = await insert(store, clock.now, ttr=TTR)
    assert (await claim_one(store, clock.now)).id == job_id
    return job_id


@pytest.fixture
def maintained(store: Store) -> Iterator[None]:
    """This process takes part in maintenance on the store, as a server does."""
    insights.maintained_here(store)
    yield
    insights.maintained_here(store, False)


async def test_a_heartbeating_holder_is_just_leasing(store: Store, clock: FrozenClock) -> None:
    job_id = await _running(store, clock)
    await store.worker_beat(_worker("w1", clock.now))
    clock.advance(2)
    explained = await insights.explain(store, job_id, clock.now)
    assert explained.reason == "running"
    assert "probably stopped" not in explained.message
    assert explained.message.startswith(f"job {job_id}: leased by worker w1 until")
    assert explained.data["worker"] == "w1" and explained.data["fence"] >= 1  # kept as they were
    assert explained.data["lease_until"] == clock.now - 2 + TTR
    assert explained.data["worker_heartbeat_at"] == clock.now - 2
    assert explained.data["worker_stopped"] is False
    assert explained.data["live_workers"] == 1 and explained.data["maintained"] is True


async def test_a_holder_that_stopped_heartbeating_with_no_worker_left(
    store: Store, clock: FrozenClock
) -> None:
    job_id = await _running(store, clock)
    await store.worker_beat(_worker("w1", clock.now))
    lease_until = clock.now + TTR
    clock.advance(42)
    explained = await insights.explain(store, job_id, clock.now)
    assert explained.reason == "running"
    assert "worker w1 last heartbeat 42 s ago; it has probably stopped" in explained.message
    assert explained.message.endswith(
        "no worker is running: start one (ferryq worker ...) and the lease will be "
        f"recovered after {when(lease_until)}"
    )
    assert explained.data["worker_stopped"] is True
    assert explained.data["worker_heartbeat_at"] == clock.now - 42
    assert explained.data["live_workers"] == 0 and explained.data["maintained"] is False


async def test_a_holder_that_stopped_while_another_worker_runs(
    store: Store, clock: FrozenClock
) -> None:
    job_id = await _running(store, clock)
    await store.worker_beat(_worker("w1", clock.now))
    lease_until = clock.now + TTR
    clock.advance(WORKER_ALIVE_SECONDS + 1)
    await store.worker_beat(_worker("w2", clock.now, ["elsewhere"]))  # any queue will do
    explained = await insights.explain(store, job_id, clock.now)
    assert "it has probably stopped" in explained.message
    assert explained.message.endswith(
        f"the maintenance leader will recover the lease after {when(lease_until)}"
    )
    assert explained.data["live_workers"] == 1 and explained.data["maintained"] is True


async def test_a_holder_with_no_heartbeat_on_record(store: Store, clock: FrozenClock) -> None:
    job_id = await _running(store, clock)  # w1 never wrote its row (or it was pruned)
    explained = await insights.explain(store, job_id, clock.now)
    assert "worker w1 has no heartbeat on record; it has probably stopped" in explained.message
    assert explained.data["worker_heartbeat_at"] is None
    assert explained.data["worker_stopped"] is True


async def test_an_expired_lease_with_no_worker_to_recover_it(
    store: Store, clock: FrozenClock
) -> None:
    job_id = await _running(store, clock)
    await store.worker_beat(_worker("w1", clock.now))
    clock.advance(TTR + 10)
    explained = await insights.explain(store, job_id, clock.now)
    assert explained.reason == "lease_expired"
    assert f"worker w1 last heartbeat {TTR + 10:.0f} s ago" in explained.message
    assert explained.message.endswith(
        "no worker is running: start one (ferryq worker ...) and the lease will be recovered"
    )
    await store.worker_beat(_worker("w2", clock.now))
    explained = await insights.explain(store, job_id, clock.now)
    assert explained.message.endswith("; the maintenance leader will recover it")


async def test_a_server_maintaining_the_store_recovers_leases_without_workers(
    store: Store, clock: FrozenClock, maintained: None
) -> None:
    job_id = await _running(store, clock)
    clock.advance(TTR + 1)
    explained = await insights.explain(store, job_id, clock.now)
    assert explained.reason == "lease_expired"
    assert explained.message.endswith("; the maintenance leader will recover it")
    assert explained.data["live_workers"] == 0 and explained.data["maintained"] is True


async def test_cancelling_a_job_whose_holder_stopped(store: Store, clock: FrozenClock) -> None:
    job_id = await _running(store, clock)
    await store.worker_beat(_worker("w1", clock.now))
    await store.job_cancel(job_id, clock.now)
    assert (await insights.explain(store, job_id, clock.now)).message.endswith(
        "cancel requested; worker w1 is stopping it"
    )
    clock.advance(30)
    explained = await insights.explain(store, job_id, clock.now)
    assert explained.reason == "cancelling"
    assert "cancel requested; worker w1 last heartbeat 30 s ago; it has probably stopped; no " \
        "worker is running" in explained.message  # fmt: skip


async def test_an_http_consumer_lease_has_no_heartbeat_to_miss(
    store: Store, clock: FrozenClock
) -> None:
    job_id = await insert(store, clock.now)
    holder = f"{insights.HTTP_HOLDER_PREFIX}host:1:abc"
    [taken] = await store.job_take(NS, "default", 1, holder, TTR, clock.now)
    assert taken.id == job_id
    clock.advance(30)
    explained = await insights.explain(store, job_id, clock.now)
    assert explained.reason == "running" and "probably stopped" not in explained.message
    assert explained.data["worker_stopped"] is False and explained.data["worker"] == holder
