"""PostgreSQL: a worker's claims run one at a time, hand-overs included.

A worker has two cycles in flight (ferryq/worker/producer.py) and starts their jobs in
the order the cycles began. On PostgreSQL a cycle finishes on one connection while it
claims on another; a finish that frees a place in a lane hands the lane's next job to
the worker and makes the one behind it ready. That hand-over is a claim: run beside
the claim of a cycle begun before it, it made ready a job that the earlier claim then
took, and the worker started that later job of the lane first.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from ferryq.lanes import LaneRule
from ferryq.store.base import Store
from ferryq.store.postgres import claims as pg_claims
from ferryq.store.postgres.store import PostgresStore
from tests.conformance.jobs import NS, insert, succeed
from tests.conftest import START as NOW

#: How long the earlier claim gives the later cycle's finish to run, and commit,
#: beside it. Only the correct code waits it out; code that runs the hand-over at
#: once is caught within milliseconds.
BESIDE = 1.0


#: The conftest's ``store``, on PostgreSQL only.
pytestmark = pytest.mark.parametrize("backend_url", ["postgres"], indirect=True)


async def test_a_hand_over_waits_for_the_claim_asked_for_before_it(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    await store.lane_rule_set(NS, LaneRule("L", 3), NOW)
    ids = [await insert(store, NOW, lane="L") for _ in range(5)]
    first, second, _third = await store.job_claim(NS, ["default"], 3, "w", NOW)
    assert [first.id, second.id] == ids[:2]

    claiming, finished = asyncio.Event(), asyncio.Event()
    claim: Callable[..., Awaitable[Any]] = pg_claims.claim
    assert isinstance(store, PostgresStore)
    finish = store._claims._finish

    async def slow_claim(*args: Any) -> Any:
        if not claiming.is_set():  # the first claim lets a hand-over run beside it
            claiming.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(finished.wait(), BESIDE)
        return await claim(*args)

    async def noted_finish(*args: Any) -> Any:
        try:
            return await finish(*args)
        finally:
            finished.set()

    monkeypatch.setattr(pg_claims, "claim", slow_claim)
    monkeypatch.setattr(store._claims, "_finish", noted_finish)
    # The claim loop's cycle, then the completer's, with one slot to fill: two of the
    # lane's three places free, so the lane hands its fourth job over and makes the
    # fifth ready.
    earlier = asyncio.ensure_future(store.job_finish_and_claim((), NS, ["default"], 2, "w", NOW))
    await claiming.wait()
    done = [dataclasses.replace(succeed(job, NOW), lane="L") for job in (first, second)]
    later = asyncio.ensure_future(store.job_finish_and_claim(done, NS, ["default"], 1, "w", NOW))
    (_, took_first), (report, took_later) = await asyncio.gather(earlier, later)

    assert report.accepted == ids[:2]
    started = [job.id for job in took_first + took_later]  # the order the worker starts them
    assert started == sorted(started), f"claimed first {took_first}, then {took_later}"
    assert [job.id for job in took_later] == [ids[3]]
