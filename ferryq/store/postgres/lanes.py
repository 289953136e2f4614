"""Lanes on PostgreSQL: the rule of ferryq.lanes, applied to many lanes in few statements.

Every transaction that changes which jobs a lane holds first takes the lane's
advisory lock (``lane_lock``; an enqueue's insert takes it itself, before its first
row, and a batch of finishes by its first statement, for the lanes its jobs' rows
name), before it touches any job row, so concurrent enqueues,
finishes, cancels and expiries of one lane decide one after another, and never in a
circle. Settling a batch of lanes is two statements whatever their number: the lock
and ``lane_settle``. The functions take a ``Run`` so the same code serves the
store's pool and an application's own connection (transactional enqueue).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

from ferryq import lanes
from ferryq.job import State
from ferryq.lanes import Candidate, Held, LaneKey, LaneRule, LaneView
from ferryq.store.base import Claimed
from ferryq.store.postgres.queries import Q, Statement
from ferryq.store.sql import CLAIM_COLUMNS, lane_rule

Run = Callable[[Statement, dict[str, Any]], Awaitable[list[Any]]]


async def lock(run: Run, keys: Collection[LaneKey]) -> None:
    if keys:
        namespaces, names = zip(*sorted(keys), strict=True)
        await run(Q["lane_lock"], {"namespaces": list(namespaces), "lanes": list(names)})


async def lock_jobs(run: Run, job_ids: Sequence[int]) -> None:
    """Lock the lanes of these jobs, found from their rows (see ``lane_lock_jobs``)."""
    if job_ids:
        await run(Q["lane_lock_jobs"], {"ids": list(job_ids)})


async def rules(run: Run, namespaces: Iterable[str]) -> dict[str, list[LaneRule]]:
    found: dict[str, list[LaneRule]] = {}
    for namespace, *columns in await run(Q["lane_rules"], {"namespaces": sorted(set(namespaces))}):
        found.setdefault(namespace, []).append(lane_rule(*columns))
    return found


async def views(run: Run, keys: Collection[LaneKey]) -> list[LaneView]:
    ordered = sorted(keys)
    by_namespace = await rules(run, (namespace for namespace, _ in ordered))
    chosen = {key: lanes.rule_for(by_namespace.get(key[0], ()), key[1]) for key in ordered}
    rows = await run(Q["lane_snapshot"], {
        "namespaces": [n for n, _ in ordered], "lanes": [lane for _, lane in ordered],
        "limits": [chosen[key].limit for key in ordered],
    })  # fmt: skip
    return [
        LaneView(
            namespace,
            lane,
            chosen[(namespace, lane)],
            halted_by,
            [Held(i, State(st), *rest) for i, st, *rest in _rows(held)],
            [Candidate(*row) for row in _rows(waiting)],
        )
        for namespace, lane, halted_by, held, waiting in rows
    ]


async def settle(
    run: Run,
    keys: Collection[LaneKey],
    now: float,
    dead: Mapping[LaneKey, list[int]] | None = None,
    *,
    locked: bool = False,
    taker: lanes.Taker | None = None,
    notify_done: bool = False,
) -> list[Claimed]:
    """Bring each lane to what its rule allows: halt it behind a new dead job if its
    policy says so, then demote and admit; return the jobs ``taker`` took.
    ``locked``: the caller holds the locks. ``notify_done``: send the finished-jobs
    sign too (a round trip the caller then saves).

    One statement settles every lane that needs no step back (``lane_settle``); the
    rare rest (halted, or over a lowered limit) go through :func:`lanes.plan`.
    """
    if not keys:
        return []
    ordered = sorted(keys)
    if not locked:
        await lock(run, ordered)
    if dead:
        await _halt(run, dead, now)
    rows = await run(Q["lane_settle"], {
        "namespaces": [n for n, _ in ordered], "lanes": [lane for _, lane in ordered],
        "now": now, "budget": taker.budget if taker else 0,
        "take_namespace": taker.namespace if taker else "", "worker": taker.worker if taker else "",
        "take_queues": list(taker.queues) if taker else [], "notify_done": notify_done,
    })  # fmt: skip
    taken = [Claimed(*row[1:]) for row in rows if row[0] == "take"]
    if taker:
        taker.budget -= len(taken)
    rest = {(row[_NAMESPACE], row[_LANE]) for row in rows if row[0] == "rest"}
    if rest:
        await _settle_by_plan(run, rest, now)
    return taken


# Where a settle row (a tag, then the claim columns) holds a lane's namespace and name.
_NAMESPACE, _LANE = 1 + CLAIM_COLUMNS.index("namespace"), 1 + CLAIM_COLUMNS.index("lane")


async def _halt(run: Run, dead: Mapping[LaneKey, list[int]], now: float) -> None:
    """Record the halts that deaths cause in lanes whose policy is ``halt``."""
    by_namespace = await rules(run, (namespace for namespace, _ in dead))
    halting = sorted(
        (key, min(ids))
        for key, ids in dead.items()
        if lanes.rule_for(by_namespace.get(key[0], ()), key[1]).on_dead == "halt"
    )
    if halting:
        await run(Q["lane_halt"], {
            "namespaces": [k[0] for k, _ in halting], "lanes": [k[1] for k, _ in halting],
            "job_ids": [job_id for _, job_id in halting], "now": now,
        })  # fmt: skip


async def _settle_by_plan(run: Run, keys: Collection[LaneKey], now: float) -> None:
    admit: list[lanes.Admit] = []
    demote: list[int] = []
    for view in await views(run, keys):
        plan = lanes.plan(view, now)
        admit.extend(plan.admit)
        demote.extend(plan.demote)
    if admit or demote:
        await run(Q["lane_apply"], {
            "ids": [a.id for a in admit], "states": [a.state.value for a in admit],
            "run_ats": [a.run_at for a in admit], "order_times": [a.order_time for a in admit],
            "demote": demote,
        })  # fmt: skip


async def release(run: Run, job_ids: Sequence[int]) -> dict[LaneKey, int]:
    """Lift the halts these dead jobs put on their lanes: each lane, with its job."""
    rows = await run(Q["lane_release"], {"ids": list(job_ids)})
    return {(r[0], r[1]): r[2] for r in rows}


def _rows(text: str | list[Any]) -> list[Any]:
    # asyncpg returns json as text; psycopg decodes it.
    return json.loads(text) if isinstance(text, str) else text
