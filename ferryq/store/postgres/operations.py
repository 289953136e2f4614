"""Reads and operator actions on PostgreSQL: jobs, queues as the HTTP API sees them,
lane rules, periodic tasks.

Each function runs on one of the store's connections, in the transaction (or
snapshot) its caller began (see ferryq.store.postgres.store); the flows written once
for both backends (cancel, the counts, the lane listing) run through a
``ConnSession``. An action that changes a lane's jobs takes the lane's lock before
any job row (ferryq.store.postgres.lanes).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ferryq.job import Job, State
from ferryq.lanes import LaneKey, LaneRule, LaneView
from ferryq.store import base, flows
from ferryq.store.base import Dependencies, JobFilter, LaneInfo
from ferryq.store.postgres import lanes
from ferryq.store.postgres.connection import Conn, run, runner
from ferryq.store.postgres.queries import Q, positional
from ferryq.store.postgres.session import ConnSession
from ferryq.store.sql import dependencies_from_rows, job_from_row, list_query, rule_params

# -- jobs ----------------------------------------------------------------------


async def get(conn: Conn, job_id: int) -> Job | None:
    rows = await run(conn, Q["job_get_hot"], id=job_id)
    if not rows:
        rows = await run(conn, Q["job_get_history"], id=job_id)
    return job_from_row(rows[0]) if rows else None


async def job_list(conn: Conn, where: JobFilter) -> list[Job]:
    sql, params = list_query(where)
    return [job_from_row(row) for row in await run(conn, positional(sql), **params)]


async def dependencies(conn: Conn, job_id: int) -> Dependencies:
    return dependencies_from_rows(await run(conn, Q["job_dependencies"], id=job_id))


async def dependency_results(conn: Conn, job_id: int) -> list[str | None]:
    rows = await run(conn, Q["job_dependency_results"], id=job_id)
    return [result if state == "succeeded" else None for _, state, result in rows]


async def cancel(conn: Conn, job_id: int, now: float) -> Job:
    return await flows.cancel(ConnSession(conn), job_id, now)


async def respawn(
    conn: Conn, ids: list[int], now: float, expires_at: float | None, max_tries: int | None
) -> set[int]:
    run_here = runner(conn)
    in_lanes = {(r[0], r[1]) for r in await run(conn, Q["lane_of_history"], ids=ids)}
    await lanes.lock(run_here, in_lanes)
    rows = await run(conn, Q["job_respawn"], ids=ids, now=now, expires_at=expires_at,
                     max_tries=max_tries)  # fmt: skip
    moved = [r[0] for r in rows]
    # A job in a lane comes back waiting, ahead of the later jobs by its id; the one
    # that halted its lane resumes at once.
    released = await lanes.release(run_here, moved)
    if released:
        await run_here(Q["lane_resume"], {"ids": list(released.values()), "now": now})
    await lanes.settle(run_here, in_lanes | released.keys(), now)
    return set(moved)


async def purge(conn: Conn, ids: list[int], now: float) -> int:
    run_here = runner(conn)
    in_lanes = {(r[0], r[1]) for r in await run(conn, Q["lane_of_history"], ids=ids)}
    await lanes.lock(run_here, in_lanes)
    purged = [r[0] for r in await run(conn, Q["job_purge"], ids=ids)]
    await lanes.settle(run_here, set(await lanes.release(run_here, purged)), now)
    return len(purged)


async def counts(conn: Conn, namespace: str | None) -> dict[tuple[str, str, str], int]:
    return await flows.job_counts(ConnSession(conn), namespace)


# -- queues as the HTTP API sees them ------------------------------------------


async def queue_clear(conn: Conn, namespace: str, queue: str, now: float) -> int:
    run_here = runner(conn)
    key = {"namespace": namespace, "queue": queue}
    in_lanes = [r[0] for r in await run(conn, Q["queue_clear_lanes"], **key)]
    await lanes.lock(run_here, {(namespace, lane) for lane in in_lanes})
    rows = await run(conn, Q["queue_clear"], **key, lanes=in_lanes,
                     state=State.CANCELLED.value, now=now)  # fmt: skip
    await lanes.settle(run_here, {(r[1], r[2]) for r in rows if r[2] is not None}, now,
                       locked=True)  # fmt: skip
    return len(rows)


# -- lanes ---------------------------------------------------------------------


async def lane_rules(conn: Conn, namespace: str) -> list[LaneRule]:
    return (await lanes.rules(runner(conn), [namespace])).get(namespace, [])


async def lane_rule_set(conn: Conn, namespace: str, rule: LaneRule, now: float) -> None:
    await run(conn, Q["lane_rule_set"], namespace=namespace, now=now, **rule_params(rule))
    await lanes.settle(runner(conn), await _matching(conn, namespace, rule.pattern), now)


async def lane_rule_delete(conn: Conn, namespace: str, pattern: str, now: float) -> bool:
    status = await conn.execute(Q["lane_rule_delete"].sql, namespace, pattern)
    if status.split()[-1] == "0":
        return False
    await lanes.settle(runner(conn), await _matching(conn, namespace, pattern), now)
    return True


async def lane_view(conn: Conn, namespace: str, lane: str) -> LaneView:
    return (await lanes.views(runner(conn), [(namespace, lane)]))[0]


async def lane_list(conn: Conn, namespace: str, limit: int) -> list[LaneInfo]:
    return await flows.lane_list(ConnSession(conn), namespace, limit)


async def _matching(conn: Conn, namespace: str, pattern: str) -> set[LaneKey]:
    """The lanes with hot jobs that a rule's pattern names."""
    if not pattern.endswith("*"):
        return {(namespace, pattern)}
    rows = await run(conn, Q["lane_names"], namespace=namespace, prefix=pattern[:-1])
    return {(namespace, r[0]) for r in rows}


# -- periodic tasks ------------------------------------------------------------


async def periodic_sync(
    conn: Conn, namespace: str, entries: Sequence[base.PeriodicEntry], now: float
) -> list[base.PeriodicState]:
    await run(
        conn, Q["periodic_upsert"], namespace=namespace, now=now,
        tasks=[e.task for e in entries], schedules=[e.schedule for e in entries],
        queues=[e.queue for e in entries], catch_ups=[e.catch_up for e in entries],
    )  # fmt: skip
    rows = await run(conn, Q["periodic_list"], namespace=namespace)
    return [base.PeriodicState(*row) for row in rows]


def periodic_advance_params(
    namespace: str, task: str, checked_from: float, advance: base.PeriodicAdvance
) -> dict[str, Any]:
    return {
        "namespace": namespace, "task": task, "checked_from": checked_from,
        "checked_until": advance.checked_until, "next_tick": advance.next_tick,
        "now": advance.updated_at, "last_tick": advance.last_tick, "last_job": advance.last_job,
    }  # fmt: skip
