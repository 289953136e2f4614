"""SQLite's planner after ANALYZE: a lane's lookups stay inside the lane's index range.

Analysed while one long lane holds every waiting job, the statistics say a lane has
as many waiting jobs as the whole index; SQLite may then prefer walking rowids in
order to the lane's own range. These lookups must not: each would read the table
to answer for one lane.
"""

from __future__ import annotations

import json
import pathlib
import sqlite3

from ferryq.store import open_store
from ferryq.store.base import Store
from ferryq.store.sqlite.queries import Q
from tests.conformance.jobs import NS, new_job
from tests.conftest import START

LANE_LOOKUPS = (
    "lane_ahead",
    "lane_waiting",
    "lane_held",
    "lane_glance",
    "lane_take_next",
    "lane_admit_next",
)


async def opened(path: pathlib.Path) -> Store:
    store = open_store(f"sqlite:///{path}")
    await store.open()
    return store


async def test_lane_lookups_use_the_lane_indexes_after_analyze(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "plans.db"
    store = await opened(path)
    await store.job_insert_many(new_job(START, lane="long"), ["[]"] * 20_000)
    for n in range(50):
        await store.job_insert_many(new_job(START, lane=f"one:{n}"), ["[]"])
    await store.close()
    with sqlite3.connect(path) as conn:
        conn.execute("ANALYZE")
    store = await opened(path)
    await store.job_insert_many(new_job(START, lane="short"), ["[]"] * 3)
    await store.close()
    with sqlite3.connect(path) as conn:
        (last,) = conn.execute("SELECT max(id) FROM ferryq_jobs WHERE lane = 'short'").fetchone()
        params = {"namespace": NS, "lane": "short", "id": last, "limit": 1,
                  "lanes": json.dumps(["short"]), "now": START, "queues": '["default"]',
                  "worker": "w", "budget": 1}  # fmt: skip
        for name in LANE_LOOKUPS:
            plan = [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {Q[name]}", params)]
            assert any("ferryq_jobs_lane_" in step for step in plan), f"{name}: {plan}"
            assert not any("PRIMARY KEY (rowid<" in step for step in plan), f"{name}: {plan}"
            scans = [step for step in plan if step.startswith("SCAN") and "VIRTUAL" not in step]
            assert not scans, f"{name} reads a table or index whole: {plan}"
        assert conn.execute(Q["lane_ahead"], params).fetchone() == (1,)
