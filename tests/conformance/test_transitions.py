"""Every transition of the state machine (ferryq.job.TRANSITIONS), driven through a Store.

Adding a transition to the table without a scenario here fails the first test.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from ferryq.job import TRANSITIONS, Event, State
from ferryq.lanes import LaneRule, Rate
from ferryq.store import Store
from ferryq.store.base import Finish, FinishKind
from ferryq.worker.maintenance import Maintenance
from tests.conformance.backends import backend_url as backend_url  # not pooled
from tests.conformance.jobs import NS, claim_one, insert, succeed
from tests.conftest import START

NOW = START
Scenario = Callable[[Store], Awaitable[int]]
S, E = State, Event


async def _running(store: Store, **fields: Any) -> int:
    job_id = await insert(store, NOW, **fields)
    assert (await claim_one(store, NOW)).id == job_id
    return job_id


async def _finish(store: Store, kind: FinishKind, **fields: Any) -> int:
    job_id = await _running(store)
    finish = Finish(kind, job_id, 1, NOW, NOW, **fields)
    assert (await store.job_finish_many([finish])).accepted == [job_id]
    return job_id


async def _lease_expired(store: Store, max_tries: int, retry: str = "{}") -> int:
    job_id = await _running(store, ttr=5.0, max_tries=max_tries, retry=retry)
    assert await Maintenance(store, "leader").recover_leases(NOW + 6) == 1
    return job_id


async def _terminal_then_respawn(store: Store, make: Scenario) -> int:
    job_id = await make(store)
    assert await store.job_respawn([job_id], NOW + 100) == [job_id]
    return job_id


async def _expired(store: Store, **fields: Any) -> int:
    job_id = await insert(store, NOW, expires_at=NOW + 1, **fields)
    assert await store.job_expire(NOW + 2, 10) == [job_id]
    return job_id


async def _cancelled_running(store: Store) -> int:
    job_id = await _running(store)
    await store.job_cancel(job_id, NOW)
    await store.job_finish_many([Finish("cancelled", job_id, 1, NOW)])
    return job_id


async def _cancelled(store: Store, **fields: Any) -> int:
    job_id = await insert(store, NOW, **fields)
    await store.job_cancel(job_id, NOW)
    return job_id


async def _cancelled_behind(store: Store) -> int:
    job_id = await _behind(store)
    await store.job_cancel(job_id, NOW)
    return job_id


async def _expired_behind(store: Store) -> int:
    job_id = await _behind(store, expires_at=NOW + 1)
    assert await store.job_expire(NOW + 2, 10) == [job_id]
    return job_id


async def _succeeded(store: Store) -> int:
    job_id = await insert(store, NOW)
    await store.job_finish_many([succeed(await claim_one(store, NOW), NOW)])
    return job_id


async def _promoted(store: Store) -> int:
    job_id = await insert(store, NOW, delay=5.0)
    assert await store.job_promote_due(NOW + 5, 10) == 1
    return job_id


async def _dead(store: Store) -> int:
    return await _finish(store, "dead", error={"message": "x"})


async def _behind(store: Store, **fields: Any) -> int:
    """A job queued in lane L behind a running one."""
    await _running(store, lane="L")
    return await insert(store, NOW, lane="L", **fields)


async def _admitted(store: Store, **fields: Any) -> int:
    job_id = await _behind(store, **fields)
    head = await store.job_get(job_id - 1)
    assert head is not None
    await store.job_finish_many([Finish("succeeded", head.id, head.fence, NOW, NOW)])
    return job_id


async def _stepped_back(store: Store, **fields: Any) -> int:
    await store.lane_rule_set(NS, LaneRule("L", 2), NOW)
    job_id = await _behind(store, **fields)
    assert (await store.job_get(job_id)).state != State.WAITING  # type: ignore[union-attr]
    await store.lane_rule_set(NS, LaneRule("L", 1), NOW)
    return job_id


async def _acked(store: Store, make: Scenario) -> int:
    job_id = await make(store)
    assert await store.job_ack(NS, "default", [job_id], NOW) == [job_id]
    return job_id


async def _respawned_behind(store: Store) -> int:
    await store.lane_rule_set(NS, LaneRule("L", 1, "continue"), NOW)
    dead = await _running(store, lane="L", max_tries=1)
    await store.job_finish_many([Finish("dead", dead, 1, NOW, NOW, error={"message": "x"})])
    await _running(store, lane="L")  # the next job now holds the lane
    assert await store.job_respawn([dead], NOW + 1) == [dead]
    return dead


async def _held(store: Store) -> int:
    """A job after another that has not ended."""
    first = await insert(store, NOW)
    return await insert(store, NOW, after=(first,))


async def _released(store: Store, kind: FinishKind = "succeeded") -> int:
    job_id = await _held(store)
    first = await claim_one(store, NOW)
    error = None if kind == "succeeded" else {"message": "x"}
    await store.job_finish_many([Finish(kind, first.id, first.fence, NOW, NOW, error=error)])
    return job_id


async def _deferred_by_the_rate(store: Store) -> int:
    await store.lane_rule_set(NS, LaneRule("L", 2, rate=Rate(1, 10.0)), NOW)
    await insert(store, NOW, lane="L")
    job_id = await insert(store, NOW, lane="L")
    assert len(await store.job_claim(NS, ["default"], 2, "w1", NOW)) == 1
    return job_id


SCENARIOS: dict[tuple[State | None, Event], Scenario] = {
    (None, E.ENQUEUE_DUE): lambda s: insert(s, NOW),
    (None, E.ENQUEUE_DELAYED): lambda s: insert(s, NOW, delay=5.0),
    (S.SCHEDULED, E.DUE): _promoted,
    (S.READY, E.CLAIM): _running,
    (S.RUNNING, E.SUCCEED): _succeeded,
    (S.RUNNING, E.NEXT_STAGE): lambda s: _finish(
        s, "next", stage="b", context="{}", run_at=NOW + 5, order_time=NOW + 5
    ),
    (S.RUNNING, E.NEXT_STAGE_NOW): lambda s: _finish(
        s, "next", stage="b", context="{}", run_at=NOW, order_time=NOW
    ),
    (S.RUNNING, E.RETRY): lambda s: _finish(
        s, "retry", error={"message": "x"}, run_at=NOW + 5, order_time=NOW + 5
    ),
    (S.RUNNING, E.RETRY_NOW): lambda s: _finish(s, "retry", error={"message": "x"}, run_at=NOW),
    (S.RUNNING, E.DIE): _dead,
    (S.RUNNING, E.LEASE_EXPIRED): lambda s: _lease_expired(s, max_tries=3),
    (S.RUNNING, E.LEASE_EXPIRED_NOW): lambda s: _lease_expired(
        s, max_tries=3, retry='{"kind": "fixed", "seconds": [0]}'
    ),
    (S.RUNNING, E.LEASE_EXPIRED_DEAD): lambda s: _lease_expired(s, max_tries=1),
    (S.RUNNING, E.SHUTDOWN_RETURN): lambda s: _finish(s, "returned"),
    (S.RUNNING, E.CANCEL): _cancelled_running,
    (S.SCHEDULED, E.CANCEL): lambda s: _cancelled(s, delay=5.0),
    (S.READY, E.CANCEL): _cancelled,
    (S.SCHEDULED, E.EXPIRE): lambda s: _expired(s, delay=5.0),
    (S.READY, E.EXPIRE): _expired,
    (S.DEAD, E.RESPAWN): lambda s: _terminal_then_respawn(s, _dead),
    (S.CANCELLED, E.RESPAWN): lambda s: _terminal_then_respawn(s, _cancelled),
    (S.EXPIRED, E.RESPAWN): lambda s: _terminal_then_respawn(s, _expired),
    (None, E.ENQUEUE_IN_LANE): _behind,
    (S.WAITING, E.ADMIT): _admitted,
    (S.WAITING, E.ADMIT_DELAYED): lambda s: _admitted(s, delay=5.0),
    (S.READY, E.STEP_BACK): _stepped_back,
    (S.SCHEDULED, E.STEP_BACK): lambda s: _stepped_back(s, delay=5.0),
    (S.WAITING, E.CANCEL): lambda s: _cancelled_behind(s),
    (S.WAITING, E.EXPIRE): lambda s: _expired_behind(s),
    (S.DEAD, E.RESPAWN_IN_LANE): _respawned_behind,
    # Ended behind the job that holds lane L (which still holds it), then respawned.
    (S.CANCELLED, E.RESPAWN_IN_LANE): lambda s: _terminal_then_respawn(s, _cancelled_behind),
    (S.EXPIRED, E.RESPAWN_IN_LANE): lambda s: _terminal_then_respawn(s, _expired_behind),
    (S.RUNNING, E.ACK): lambda s: _acked(s, _running),
    (S.READY, E.ACK): lambda s: _acked(s, lambda s: insert(s, NOW)),
    (S.SCHEDULED, E.ACK): lambda s: _acked(s, lambda s: insert(s, NOW, delay=5.0)),
    (S.WAITING, E.ACK): lambda s: _acked(s, _behind),
    (None, E.ENQUEUE_HELD): _held,
    (S.SCHEDULED, E.RELEASE): _released,
    (S.SCHEDULED, E.RELEASE_FAILED): lambda s: _released(s, "dead"),
    (S.READY, E.RATE_DEFER): _deferred_by_the_rate,
}


def test_every_transition_has_a_scenario() -> None:
    assert set(SCENARIOS) == set(TRANSITIONS)


@pytest.mark.parametrize("edge", list(TRANSITIONS), ids=lambda e: f"{e[0]}--{e[1].name}")
async def test_transition(store: Store, edge: tuple[State | None, Event]) -> None:
    job_id = await SCENARIOS[edge](store)
    job = await store.job_get(job_id)
    assert job is not None and job.state == TRANSITIONS[edge]
