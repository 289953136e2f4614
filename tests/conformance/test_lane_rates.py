"""Rates per lane through the Store, on every backend: a sliding window of starts,
kept by every claim (a worker's, a finish's hand-over, an HTTP consumer's)."""

from __future__ import annotations

import asyncio
import dataclasses

from ferryq import insights
from ferryq.job import State
from ferryq.lanes import LaneRule, Rate
from ferryq.store import open_store
from ferryq.store.base import Claimed, Finish, Store
from tests.conformance.jobs import NS, insert, succeed
from tests.conftest import START

NOW = START


async def claim(store: Store, now: float, limit: int = 10) -> list[Claimed]:
    return await store.job_claim(NS, ["default"], limit, "w1", now)


async def job_state(store: Store, job_id: int) -> tuple[State, float]:
    job = await store.job_get(job_id)
    assert job is not None
    return job.state, job.run_at


async def test_a_lane_starts_no_more_than_its_rate_in_any_window(store: Store) -> None:
    await store.lane_rule_set(NS, LaneRule("L", 10, rate=Rate(3, 1.0)), NOW)
    ids = [await insert(store, NOW, lane="L") for _ in range(10)]
    plain = await insert(store, NOW)
    first = await claim(store, NOW, limit=20)
    assert [c.id for c in first] == [*ids[:3], plain]  # another lane's job is not held up
    # The rest are scheduled again, due when the window will have room for each.
    assert [await job_state(store, i) for i in ids[3:]] == [
        (State.SCHEDULED, NOW + 1), (State.SCHEDULED, NOW + 1), (State.SCHEDULED, NOW + 1),
        (State.SCHEDULED, NOW + 2), (State.SCHEDULED, NOW + 2), (State.SCHEDULED, NOW + 2),
        (State.SCHEDULED, NOW + 3),
    ]  # fmt: skip
    assert await claim(store, NOW + 0.999) == []
    assert [c.id for c in await claim(store, NOW + 1)] == ids[3:6]
    assert [c.id for c in await claim(store, NOW + 2.5)] == ids[6:9]
    assert [c.id for c in await claim(store, NOW + 3)] == []  # 3 started in (2, 3]
    assert [c.id for c in await claim(store, NOW + 3.5)] == ids[9:]


async def test_a_job_held_by_the_rate_is_explained(store: Store) -> None:
    await store.lane_rule_set(NS, LaneRule("L", 1, rate=Rate(1, 10.0)), NOW)
    a, b = [await insert(store, NOW, lane="L") for _ in range(2)]
    (started,) = await claim(store, NOW)
    assert started.id == a
    await store.job_finish_many([succeed(started, NOW + 1)])
    assert await job_state(store, b) == (State.READY, NOW)
    said = await insights.explain(store, b, NOW + 1)
    assert said.reason == "rate_limited"
    assert said.data["until"] == NOW + 10
    assert "rate limited until" in said.message
    assert await claim(store, NOW + 2) == []
    assert await job_state(store, b) == (State.SCHEDULED, NOW + 10)
    said = await insights.explain(store, b, NOW + 2)
    assert (said.reason, said.data["until"]) == ("rate_limited", NOW + 10)
    assert [c.id for c in await claim(store, NOW + 10)] == [b]


async def test_a_finish_hands_a_rated_lane_nothing_over_the_rate(store: Store) -> None:
    await store.lane_rule_set(NS, LaneRule("L", 1, rate=Rate(1, 10.0)), NOW)
    a, b = [await insert(store, NOW, lane="L") for _ in range(2)]
    (started,) = await claim(store, NOW)
    done = dataclasses.replace(succeed(started, NOW + 1), lane="L")
    report, taken = await store.job_finish_and_claim([done], NS, ["default"], 5, "w1", NOW + 1)
    assert report.accepted == [a]
    assert taken == []
    assert await claim(store, NOW + 2) == []
    assert await job_state(store, b) == (State.SCHEDULED, NOW + 10)


async def test_every_attempt_counts_against_the_rate(store: Store) -> None:
    await store.lane_rule_set(NS, LaneRule("L", 1, rate=Rate(2, 10.0)), NOW)
    a = await insert(store, NOW, lane="L")
    for at in (NOW, NOW + 1):
        (job,) = await claim(store, at)
        retry = Finish("retry", a, job.fence, at, at, error={"message": "x"}, run_at=at,
                       order_time=at)  # fmt: skip
        await store.job_finish_many([retry])
    assert await claim(store, NOW + 2) == []
    assert await job_state(store, a) == (State.SCHEDULED, NOW + 10)


async def test_an_http_consumer_takes_within_the_rate(store: Store) -> None:
    await store.lane_rule_set(NS, LaneRule("L", 5, rate=Rate(2, 60.0)), NOW)
    ids = [await insert(store, NOW, lane="L") for _ in range(4)]
    taken = await store.job_take(NS, "default", 5, "http:1", 30.0, NOW)
    assert [job.id for job in taken] == ids[:2]
    assert await store.job_take(NS, "default", 5, "http:1", 30.0, NOW + 1) == []


async def test_a_rule_without_a_rate_claims_as_before(store: Store) -> None:
    await store.lane_rule_set(NS, LaneRule("L", 5, rate=Rate(1, 60.0)), NOW)
    ids = [await insert(store, NOW, lane="L") for _ in range(3)]
    assert [c.id for c in await claim(store, NOW)] == ids[:1]
    await store.lane_rule_set(NS, LaneRule("L", 5), NOW)
    assert (await store.lane_rules(NS))[0].rate is None
    # The jobs the rate deferred keep their due times (NOW + 60, NOW + 120); then
    # nothing holds them back.
    assert [c.id for c in await claim(store, NOW + 120)] == ids[1:]


async def test_claims_at_once_from_many_connections_keep_the_rate_exactly(
    store: Store, backend_url: str
) -> None:
    await store.lane_rule_set(NS, LaneRule("L", 50, rate=Rate(5, 100.0)), NOW)
    ids = [await insert(store, NOW, lane="L") for _ in range(40)]
    others = [open_store(backend_url) for _ in range(4)]
    for other in others:
        await other.open(migrate=False)
    try:
        rounds = [
            other.job_claim(NS, ["default"], 2, f"w{i}", NOW + 0.001 * i)
            for i, other in enumerate(others * 4)
        ]
        claimed = [c.id for batch in await asyncio.gather(*rounds) for c in batch]
    finally:
        for other in others:
            await other.close()
    assert sorted(claimed) == ids[:5]  # five starts, and the first five, in lane order
