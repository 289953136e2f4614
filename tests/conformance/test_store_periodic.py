"""The store's record of periodic tasks: declared, advanced by one leader, listed."""

from __future__ import annotations

from ferryq.store import Store
from ferryq.store.base import PeriodicAdvance, PeriodicEntry
from tests.conformance.jobs import NS, claim_one, insert, succeed
from tests.conftest import START

NOW = START
NIGHTLY = PeriodicEntry("nightly", "cron 0 3 * * *", "reports", 1)


async def test_a_new_periodic_task_starts_from_now(store: Store) -> None:
    (state,) = await store.periodic_sync(NS, [NIGHTLY], NOW)
    assert (state.task, state.schedule, state.queue, state.catch_up) == (
        "nightly", "cron 0 3 * * *", "reports", 1,
    )  # fmt: skip
    assert state.checked_until == NOW and state.updated_at == NOW
    assert state.last_tick is None and state.last_job is None and state.last_state is None
    assert await store.periodic_list("elsewhere") == []


async def test_declaring_again_updates_the_schedule_but_keeps_the_progress(store: Store) -> None:
    await store.periodic_sync(NS, [NIGHTLY], NOW)
    changed = PeriodicEntry("nightly", "every 60 s", "default", 0)
    other = PeriodicEntry("hourly", "cron 0 * * * *", "default", 1)
    states = await store.periodic_sync(NS, [changed, other], NOW + 10)
    assert [s.task for s in states] == ["hourly", "nightly"]
    nightly = states[1]
    assert (nightly.schedule, nightly.queue, nightly.catch_up) == ("every 60 s", "default", 0)
    assert nightly.checked_until == NOW and nightly.updated_at == NOW + 10
    assert states[0].checked_until == NOW + 10


async def test_only_one_leader_advances_from_the_same_point(store: Store) -> None:
    await store.periodic_sync(NS, [NIGHTLY], NOW)
    job_id = await insert(store, NOW, queue="reports")
    first = PeriodicAdvance(NOW + 60, NOW + 120, NOW + 60, last_tick=NOW + 60, last_job=job_id)
    assert await store.periodic_advance(NS, "nightly", NOW, first)
    late = PeriodicAdvance(NOW + 61, NOW + 120, NOW + 61, last_tick=NOW + 60, last_job=999)
    assert not await store.periodic_advance(NS, "nightly", NOW, late)
    (state,) = await store.periodic_list(NS)
    assert state.checked_until == NOW + 60 and state.next_tick == NOW + 120
    assert state.last_tick == NOW + 60 and state.last_job == job_id
    assert state.last_state == "ready"
    # Nothing new enqueued: the last tick and job stay.
    quiet = PeriodicAdvance(NOW + 90, NOW + 120, NOW + 90)
    assert await store.periodic_advance(NS, "nightly", NOW + 60, quiet)
    await store.job_finish_many([succeed(await claim_one(store, NOW + 90, "reports"), NOW + 91)])
    (state,) = await store.periodic_list(NS)
    assert state.checked_until == NOW + 90 and state.last_job == job_id
    assert state.last_state == "succeeded"  # found in the history too
