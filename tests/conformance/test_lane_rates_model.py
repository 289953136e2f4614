"""Rates per lane, by random walks (hypothesis), on every backend.

Each example draws lanes (a limit of 1 to 3, a rate of 1 to 3 starts per 1 or 2.5 s)
with a few jobs each, and a walk of claims: time moves on by a random step, each
claim takes a random batch with a clock up to 0.3 s off the true time (claimers on
other machines, or a claim that waited for its turn), and each job it starts either
succeeds, is retried at once, or is retried after 0.5 s. Then claims go on, time
moving, until every job has ended.

Checked, from the times each claim used: no lane ever starts more than its rate in
any window (half-open, ``per`` long), retries included; each lane's jobs start for the
first time in id order; every job ends, succeeded.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
from collections import defaultdict
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ferryq.job import State
from ferryq.lanes import LaneRule, Rate
from ferryq.store import open_store
from ferryq.store.base import Finish, NewJob, Store
from tests.conftest import START, model_settings

FATES = ("succeed", "retry now", "retry later")
_namespaces = itertools.count()


@dataclass(frozen=True)
class Lane:
    limit: int
    rate: Rate
    jobs: int


@dataclass(frozen=True)
class Step:
    advance: float
    batch: int
    skew: float
    fates: tuple[str, ...]


lanes = st.builds(
    Lane,
    st.integers(1, 3),
    st.builds(Rate, st.integers(1, 3), st.sampled_from((1.0, 2.5))),
    st.integers(1, 10),
)
steps = st.builds(
    Step,
    st.sampled_from((0.0, 0.1, 0.4, 0.9, 1.5)),
    st.integers(1, 5),
    st.sampled_from((0.0, -0.3, 0.3, -0.05, 0.1)),
    st.lists(st.sampled_from(FATES), min_size=5, max_size=5).map(tuple),
)


def most_in_any_window(times: list[float], per: float) -> int:
    ordered = sorted(times)
    return max(bisect.bisect_left(ordered, t + per) - i for i, t in enumerate(ordered))


async def walk(url: str, drawn: list[Lane], walk_steps: list[Step]) -> None:
    namespace = f"rates{next(_namespaces)}"
    store = open_store(url)
    await store.open()
    now = START
    starts: dict[str, list[float]] = defaultdict(list)
    first: dict[str, list[int]] = defaultdict(list)
    lane_of: dict[int, str] = {}
    try:
        for number, lane in enumerate(drawn):
            name = f"L{number}"
            await store.lane_rule_set(namespace, LaneRule(name, lane.limit, rate=lane.rate), now)
            job = NewJob(namespace=namespace, queue="q", task="t", state=State.WAITING,
                         run_at=now, order_time=now, created_at=now, lane=name)  # fmt: skip
            for row in await store.job_insert_many(job, ["[]"] * lane.jobs):
                lane_of[row.id] = name

        async def claim(at: float, batch: int, fates: tuple[str, ...]) -> None:
            claimed = await store.job_claim(namespace, ["q"], batch, "w", at)
            finishes = []
            for job, fate in zip(claimed, itertools.cycle(fates)):
                lane = lane_of[job.id]
                starts[lane].append(at)
                if job.id not in first[lane]:
                    first[lane].append(job.id)
                if fate == "succeed" or job.attempts >= 3:
                    finishes.append(Finish("succeeded", job.id, job.fence, at, at, "null",
                                           lane=lane))  # fmt: skip
                else:
                    due = at + (0.0 if fate == "retry now" else 0.5)
                    finishes.append(Finish("retry", job.id, job.fence, at, at, lane=lane,
                                           error={"message": "again"}, run_at=due,
                                           order_time=due))  # fmt: skip
            await store.job_finish_many(finishes)

        for step in walk_steps:
            now += step.advance
            await claim(now + step.skew, step.batch, step.fates)
        for _ in range(400):
            if not await _left(store, namespace):
                break
            now += 0.25
            await claim(now, 5, ("succeed",))
        assert not await _left(store, namespace), "jobs left unfinished"
    finally:
        await store.close()
    for number, lane in enumerate(drawn):
        name = f"L{number}"
        if starts[name]:
            assert most_in_any_window(starts[name], lane.rate.per) <= lane.rate.n, (name, starts)
        assert first[name] == sorted(first[name]), (name, first[name])
        assert len(first[name]) == lane.jobs


async def _left(store: Store, namespace: str) -> int:
    """The jobs of ``namespace`` that have not succeeded."""
    counts = await store.job_counts(namespace)
    return sum(n for (_, _, state), n in counts.items() if state != "succeeded")


@pytest.mark.parametrize("backend_url", ["sqlite", "postgres"], indirect=True)
def test_lanes_never_start_more_than_their_rate_and_keep_their_order(backend_url: str) -> None:
    @given(st.lists(lanes, min_size=1, max_size=3), st.lists(steps, max_size=30))
    @model_settings(backend_url)
    def check(drawn: list[Lane], walk_steps: list[Step]) -> None:
        asyncio.run(walk(backend_url, drawn, walk_steps))

    check()
