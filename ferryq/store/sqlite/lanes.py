"""Lanes on SQLite: the rule of ferryq.lanes, applied to the lanes a write changed.

Every write holds the database's one write lock, so no lane needs a lock of its own:
settling a lane reads it and admits, demotes or halts in the same transaction as the
change that freed or filled it. Lanes of limit 1, the common case, are settled in a
write or two per namespace (``_next_of_single``); the others are read (cheaply, at a
glance, when that is enough) and planned by :func:`ferryq.lanes.plan`.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence

from ferryq import lanes
from ferryq.job import State
from ferryq.lanes import Candidate, Held, LaneKey, LaneRule, LaneView
from ferryq.store.base import Claimed
from ferryq.store.sql import lane_rule
from ferryq.store.sqlite.queries import Q

Conn = sqlite3.Connection


def settle(
    conn: Conn,
    keys: set[LaneKey],
    now: float,
    dead: dict[LaneKey, list[int]] | None = None,
    taker: lanes.Taker | None = None,
    *,
    limits_changed: bool = False,
) -> list[Claimed]:
    """Bring each lane to what its rule allows (see ferryq.lanes): halt it behind a
    new dead job if its policy says so, demote, admit; return what ``taker`` took.

    Lanes of limit 1 take the plain path unless a job of theirs just died or their
    limit just changed (see ``_next_of_single``). ``lanes.plan`` decides for the
    others, each read by a glance (see ``_views``), and ``lanes.hand_over`` what
    goes to ``taker``; their admissions go in a write or two for all, one for those
    that keep their own times and one for those handed over.
    """
    if not keys:
        return []
    rule = RuleBook(conn)
    dead = dead or {}
    for (namespace, lane), ids in sorted(dead.items()):
        if ids and rule(namespace, lane).on_dead == "halt":
            params = {"namespace": namespace, "lane": lane, "job_id": min(ids), "now": now}
            conn.execute(Q["lane_halt"], params)
    single = set() if limits_changed else {k for k in keys - dead.keys() if rule(*k).limit == 1}
    taken = _next_of_single(conn, single, now, taker, rule) if single else []
    admit: list[int] = []  # admitted with their own times: due now or scheduled
    take: list[int] = []
    for seen in _views(conn, keys - single, rule):
        plan = lanes.plan(seen, now)
        if not plan:
            continue
        for job_id in plan.demote:
            conn.execute(Q["lane_demote"], {"id": job_id})
        handed = lanes.hand_over(seen, plan, taker, now)
        for admitted, waiting in zip(plan.admit, seen.waiting, strict=False):
            if admitted.id == handed:
                take.append(handed)
            elif (admitted.run_at, admitted.order_time) == (waiting.run_at, waiting.order_time):
                admit.append(admitted.id)
            else:  # behind a job that has not started: its times raised to that job's
                params = {"id": admitted.id, "state": admitted.state.value,
                          "run_at": admitted.run_at, "order_time": admitted.order_time}  # fmt: skip
                conn.execute(Q["lane_admit"], params)
    if admit:
        conn.execute(Q["lane_admit_due"], {"ids": json.dumps(admit), "now": now})
    if not take:
        return taken
    assert taker is not None
    params = {"ids": json.dumps(take), "now": now, "worker": taker.worker}
    return taken + [Claimed(*row) for row in conn.execute(Q["lane_take"], params)]


def _next_of_single(
    conn: Conn,
    keys: set[LaneKey],
    now: float,
    taker: lanes.Taker | None,
    rule: RuleBook,
) -> list[Claimed]:
    """Settle lanes of limit 1, in a write or two per namespace: a lane that holds
    nothing now and is not halted admits its first waiting job, or hands it to
    ``taker`` unless it has a rate. A lane that holds a job has no room and nothing to
    step back: no job of it just died (a halt steps back what has not started), and any
    it holds over its limit have started (the settle after a limit change stepped back
    the others)."""
    taken: list[Claimed] = []
    for namespace, names in _by_namespace(keys).items():
        left = names
        unrated = [name for name in names if rule(namespace, name).rate is None]
        if taker is not None and taker.budget > 0 and namespace == taker.namespace and unrated:
            params = {"namespace": namespace, "lanes": json.dumps(unrated), "now": now,
                      "queues": json.dumps(list(taker.queues)), "worker": taker.worker,
                      "budget": taker.budget}  # fmt: skip
            claimed = [Claimed(*row) for row in conn.execute(Q["lane_take_next"], params)]
            taker.budget -= len(claimed)
            taken += claimed
            if claimed:
                done = {c.lane for c in claimed}
                left = [name for name in names if name not in done]
        if left:
            params = {"namespace": namespace, "lanes": json.dumps(left), "now": now}
            conn.execute(Q["lane_admit_next"], params)
    return taken


def _views(conn: Conn, keys: set[LaneKey], rule: RuleBook) -> list[LaneView]:
    """The lanes as ``lanes.plan`` reads them. One glance per namespace reads, for every
    lane, how many jobs it holds and how many of those have not started, the job that
    halts it and its first waiting job: index seeks only. That is the whole lane as a
    plan reads it when every job it holds has started (a plan reads no more of them:
    ``lanes.STARTED``) and it has room for one job at most; any other lane is read in
    full, its held jobs and its first ``limit`` waiting ones."""
    found: list[LaneView] = []
    for namespace, names in _by_namespace(keys).items():
        params = {"namespace": namespace, "lanes": json.dumps(names)}
        for lane, held, unstarted, halted_by, *first in conn.execute(
            Q["lane_glance"], params
        ).fetchall():
            its_rule = rule(namespace, lane)
            if unstarted or (its_rule.limit - held > 1 and first[0] is not None):
                found.append(view(conn, namespace, lane, its_rule))
                continue
            waiting = [] if first[0] is None else [Candidate(*first)]
            found.append(
                LaneView(namespace, lane, its_rule, halted_by, [lanes.STARTED] * held, waiting)
            )
    return found


def _by_namespace(keys: set[LaneKey]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for namespace, lane in sorted(keys):
        found.setdefault(namespace, []).append(lane)
    return found


class RuleBook:
    """The rule of a lane, reading each namespace's rules once."""

    def __init__(self, conn: Conn) -> None:
        self.conn = conn
        self.rules: dict[str, list[LaneRule]] = {}

    def __call__(self, namespace: str, lane: str) -> LaneRule:
        if namespace not in self.rules:
            self.rules[namespace] = rules(self.conn, namespace)
        return lanes.rule_for(self.rules[namespace], lane)


def rules(conn: Conn, namespace: str) -> list[LaneRule]:
    """A namespace's lane rules, in pattern order."""
    rows = conn.execute(Q["lane_rules"], {"namespace": namespace})
    return [lane_rule(*row) for row in rows]


def view(conn: Conn, namespace: str, lane: str, rule: LaneRule) -> LaneView:
    """A lane in full: its halt, the jobs it holds, its first ``limit`` waiting ones."""
    key = {"namespace": namespace, "lane": lane}
    halted = conn.execute(Q["lane_halted_by"], key).fetchone()
    held = [
        Held(i, State(state), bool(started), run_at, order, queue)
        for i, state, started, run_at, order, queue in conn.execute(Q["lane_held"], key)
    ]
    waiting_rows = conn.execute(Q["lane_waiting"], {**key, "limit": rule.limit})
    waiting = [Candidate(*row) for row in waiting_rows]
    return LaneView(namespace, lane, rule, None if halted is None else halted[0], held, waiting)


def matching(conn: Conn, namespace: str, pattern: str) -> set[LaneKey]:
    """The lanes with hot jobs that a rule's pattern names."""
    if not pattern.endswith("*"):
        return {(namespace, pattern)}
    params = {"namespace": namespace, "prefix": pattern[:-1]}
    return {(namespace, row[0]) for row in conn.execute(Q["lane_names"], params)}


def release(conn: Conn, job_ids: Sequence[int]) -> dict[LaneKey, int]:
    """Lift the halts these dead jobs put on their lanes: each lane, with its job."""
    rows = conn.execute(Q["lane_release"], {"ids": json.dumps(list(job_ids))}).fetchall()
    return {(r[0], r[1]): r[2] for r in rows}
