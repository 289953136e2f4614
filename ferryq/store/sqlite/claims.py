"""Claims and finishes on SQLite: the worker's hot path, and the HTTP consumers' takes.

A worker's cycle is one write transaction: the finishes of its ended attempts, the
jobs the lanes they freed hand over to it, then a claim for the slots left, all
under one commit. Every statement here runs on the store's thread, inside the write
transaction its caller began (ferryq.store.sqlite.connection), which holds the
database's one write lock: nothing else changes a row meanwhile.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any

from ferryq import lanes
from ferryq.job import Job, State
from ferryq.lanes import LaneKey
from ferryq.store import flows
from ferryq.store.base import TO_HISTORY, Claimed, Finish, FinishReport, Leases
from ferryq.store.flows import drive
from ferryq.store.sql import held_leases, job_from_row, requeue_statement
from ferryq.store.sqlite import lanes as lane_steps
from ferryq.store.sqlite.queries import Q
from ferryq.store.sqlite.session import Session

Conn = sqlite3.Connection
NO_FINISHES = FinishReport([], [])


def cycle(
    conn: Conn,
    finishes: Sequence[Finish],
    namespace: str,
    queues: Sequence[str],
    limit: int,
    worker: str,
    now: float,
) -> tuple[FinishReport, list[Claimed]]:
    """``Store.job_finish_and_claim`` in the write transaction begun."""
    # The lanes that finishes free hand their next jobs to this worker first.
    taker = lanes.Taker(namespace, queues, worker, limit)
    report, taken = finish_many(conn, finishes, taker) if finishes else (NO_FINISHES, [])
    if taker.budget > 0:
        taken += claim(conn, namespace, queues, taker.budget, worker, now)
    return report, taken


def claim(
    conn: Conn, namespace: str, queues: Sequence[str], limit: int, worker: str, now: float
) -> list[Claimed]:
    """The first ``limit`` ready jobs of ``queues``, due ones promoted first, claimed
    for ``worker`` at ``now``; in a namespace with a lane rate, those the gate lets
    start."""
    _promote(conn, namespace, queues, now)
    rated = _rated(conn, namespace)
    if len(queues) == 1 and not rated:
        params = {"namespace": namespace, "queue": queues[0], "limit": limit,
                  "now": now, "worker": worker}  # fmt: skip
        rows = conn.execute(Q["job_claim_queue"], params).fetchall()
    else:
        picked = _pick_ready(conn, namespace, queues, limit, now)
        ids = _gate(conn, namespace, picked, now) if rated else [row[0] for row in picked]
        if not ids:
            return []
        params = {"ids": json.dumps(ids), "now": now, "worker": worker}
        rows = conn.execute(Q["job_claim"], params).fetchall()
    return sorted((Claimed(*row) for row in rows), key=lambda c: (c.order_time, c.id))


def take(
    conn: Conn, namespace: str, queue: str, limit: int, worker: str, ttr: float, now: float
) -> list[Job]:
    """``Store.job_take``: a claim for an HTTP consumer, leased for its ``ttr``."""
    params = {"namespace": namespace, "queue": queue, "limit": limit, "worker": worker,
              "ttr": ttr, "now": now}  # fmt: skip
    _promote(conn, namespace, [queue], now)
    if _rated(conn, namespace):
        ids = _gate(conn, namespace, _pick_ready(conn, namespace, [queue], limit, now), now)
        rows = conn.execute(Q["job_take_ids"], {**params, "ids": json.dumps(ids)})
    else:
        rows = conn.execute(Q["job_take"], params)
    taken = [job_from_row(row) for row in rows]
    return sorted(taken, key=lambda job: (job.order_time, job.id))


def ack(conn: Conn, namespace: str, queue: str, job_ids: Sequence[int], now: float) -> list[int]:
    """``Store.job_ack``: an HTTP consumer's jobs end succeeded, whatever attempt holds
    them (it has no fencing token)."""
    params = {"namespace": namespace, "queue": queue, "ids": json.dumps(list(job_ids)),
              "state": State.SUCCEEDED.value, "now": now}  # fmt: skip
    moved = move_to_history(conn, "job_ack", params)
    return [job_id for job_id in dict.fromkeys(job_ids) if job_id in moved]


def _rated(conn: Conn, namespace: str) -> bool:
    """Whether a rule of the namespace has a rate, so its claims pass the gate."""
    return bool(conn.execute(Q["lane_rated"], {"namespace": namespace}).fetchone()[0])


def _gate(
    conn: Conn, namespace: str, picked: list[tuple[int, str | None, bool]], now: float
) -> list[int]:
    """Of the picked ready jobs, those their lanes' rates let start now (the rest are
    deferred: see ``flows.rate_gate``)."""
    if not picked:
        return []
    return drive(flows.rate_gate(Session(conn), namespace, picked, now))[0]


def _promote(conn: Conn, namespace: str, queues: Sequence[str], now: float) -> None:
    """Make the due jobs of these queues ready (up to a thousand each)."""
    for queue in queues:
        params = {"namespace": namespace, "queue": queue, "now": now, "limit": 1000}
        conn.execute(Q["job_promote_due_queue"], params)


def _pick_ready(
    conn: Conn, namespace: str, queues: Sequence[str], limit: int, now: float
) -> list[tuple[int, str | None, bool]]:
    """The first ``limit`` ready jobs across ``queues``, in claim order: (id, lane,
    started), as the rate gate reads them.

    One index range per queue, merged here: a single query over ``queue IN (…)`` would
    make SQLite sort the whole backlog.
    """
    candidates: list[tuple[float, int, str | None, bool]] = []
    for queue in queues:
        params = {"namespace": namespace, "queue": queue, "now": now, "limit": limit}
        candidates.extend(conn.execute(Q["job_claim_ids"], params))
    if len(queues) > 1:
        candidates.sort(key=lambda row: (row[0], row[1]))
    return [(job_id, lane, bool(started)) for _, job_id, lane, started in candidates[:limit]]


def next_due(conn: Conn, namespace: str, queues: Sequence[str]) -> float | None:
    """The first due time of a scheduled job of ``queues``."""
    params = [{"namespace": namespace, "queue": queue} for queue in queues]
    due = [conn.execute(Q["job_next_due_queue"], p).fetchone()[0] for p in params]
    return min((float(value) for value in due if value is not None), default=None)


# -- finishes ------------------------------------------------------------------


def finish_many(
    conn: Conn, finishes: Sequence[Finish], taker: lanes.Taker | None = None
) -> tuple[FinishReport, list[Claimed]]:
    """Write ``finishes`` (a stale token changes nothing and is reported); what the
    lanes they free hand over to ``taker`` comes back claimed."""
    accepted: list[int] = []
    stale: list[int] = []
    in_lanes: dict[int, LaneKey] = {}  # the jobs that left a lane's hold
    to_history = sorted((f for f in finishes if f.kind in TO_HISTORY), key=_by_id)
    if to_history:
        batch = json.dumps([_history_row(f) for f in to_history])
        conn.execute("SAVEPOINT batch")
        moved = conn.execute(Q["job_finish_batch_to_history"], {"batch": batch}).fetchall()
        if len(moved) == len(to_history):  # the usual case: every token still current
            conn.execute(Q["job_delete_batch"], {"batch": batch})
            accepted.extend(f.id for f in to_history)
            in_lanes.update((job_id, (ns, lane)) for job_id, ns, lane in moved if lane)
        else:  # rare: some tokens are stale, so find out which, one by one
            conn.execute("ROLLBACK TO batch")
            ids = json.dumps([f.id for f in to_history])
            in_lanes.update(
                (r[0], (r[1], r[2])) for r in conn.execute(Q["lane_of_jobs"], {"ids": ids})
            )
            _finish_one_by_one(conn, [_history_params(f) for f in to_history], accepted, stale)
        conn.execute("RELEASE batch")
    for finish in finishes:
        if finish.kind in TO_HISTORY:
            continue
        cancel = {"id": finish.id, "fence": finish.fence, "state": "cancelled",
                  "now": finish.finished_at}  # fmt: skip
        if cancelled := conn.execute(Q["job_cancel_if_requested"], cancel).fetchone():
            conn.execute(Q["job_delete"], {"id": finish.id})
            accepted.append(finish.id)
            if cancelled[2] is not None:
                in_lanes[finish.id] = (cancelled[1], cancelled[2])
            continue
        statement, params = requeue_statement(finish)
        (accepted if conn.execute(Q[statement], params).rowcount else stale).append(finish.id)
    taken = _settle_finished(conn, finishes, set(accepted), in_lanes, taker) if in_lanes else []
    return FinishReport(accepted, stale), taken


def _settle_finished(
    conn: Conn,
    finishes: Sequence[Finish],
    accepted: set[int],
    in_lanes: dict[int, LaneKey],
    taker: lanes.Taker | None,
) -> list[Claimed]:
    """Lanes whose jobs ended make room; a death may halt its lane."""
    ended: set[LaneKey] = set()
    dead: dict[LaneKey, list[int]] = {}
    now = 0.0
    for finish in finishes:
        key = in_lanes.get(finish.id)
        if key is None or finish.id not in accepted:
            continue
        now = max(now, finish.finished_at)
        ended.add(key)  # a requeued job keeps its place: settling changes nothing then
        if finish.kind == "dead":
            dead.setdefault(key, []).append(finish.id)
    return lane_steps.settle(conn, ended, now, dead, taker)


def _finish_one_by_one(
    conn: Conn, rows: Sequence[dict[str, Any]], accepted: list[int], stale: list[int]
) -> None:
    for params in rows:
        if conn.execute(Q["job_finish_to_history"], params).rowcount:
            conn.execute(Q["job_delete"], {"id": params["id"]})
            accepted.append(params["id"])
        else:
            stale.append(params["id"])


def _history_row(finish: Finish) -> list[Any]:
    error = None if finish.error is None else json.dumps(finish.error)
    return [finish.id, finish.fence, finish.kind, finish.result, error,
            finish.started_at, finish.finished_at]  # fmt: skip


def _history_params(finish: Finish) -> dict[str, Any]:
    return {
        "id": finish.id, "fence": finish.fence, "state": finish.kind, "result": finish.result,
        "error": None if finish.error is None else json.dumps(finish.error),
        "started_at": finish.started_at, "finished_at": finish.finished_at,
    }  # fmt: skip


def _by_id(finish: Finish) -> int:
    return finish.id


# -- leases, and moves to history outside a worker's attempt --------------------


def leases(
    conn: Conn,
    fences: Mapping[int, int],
    extend: Sequence[int],
    now: float,
    started: Mapping[int, float],
    progress: Mapping[int, str],
) -> Leases:
    """``Store.job_leases``, in the transaction begun (a read one when ``extend`` is
    empty)."""
    extended: list[int] = []
    if extend:
        pairs = json.dumps(
            [[i, fences.get(i, -1), started.get(i), progress.get(i)] for i in extend]
        )
        renewed = conn.execute(Q["job_lease_extend"], {"pairs": pairs, "now": now})
        extended = sorted(r[0] for r in renewed)
    rows = conn.execute(Q["job_held"], {"ids": json.dumps(list(fences))}).fetchall()
    return held_leases(fences, extended, rows)


def move_to_history(conn: Conn, statement: str, params: dict[str, Any]) -> set[int]:
    """Move the jobs that ``statement`` copies to history out of the hot table, and
    settle the lanes they leave (a lane frees the place a job held as a finish does)."""
    rows = conn.execute(Q[statement], params).fetchall()
    if not rows:
        return set()
    moved = [row[0] for row in rows]
    conn.execute(Q["job_delete_ids"], {"ids": json.dumps(moved)})
    lane_steps.settle(conn, {(row[1], row[2]) for row in rows if row[2] is not None},
                      params["now"])  # fmt: skip
    return set(moved)


def move_terminal(conn: Conn, job_id: int, state: State, now: float) -> bool:
    """End a job that is not running as ``state`` (expired), settling its lane."""
    params = {"id": job_id, "state": state.value, "now": now}
    in_lane = conn.execute(Q["lane_of_jobs"], {"ids": f"[{job_id}]"}).fetchone()
    if conn.execute(Q["job_move_terminal"], params).rowcount:
        conn.execute(Q["job_delete"], {"id": job_id})
        if in_lane is not None:
            lane_steps.settle(conn, {(in_lane[1], in_lane[2])}, now)
        return True
    return False
