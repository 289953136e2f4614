"""Reads and operator actions on SQLite: jobs, queues as the HTTP API sees them,
tokens, lane rules, periodic tasks, workers.

Each function runs on the store's thread in the transaction its caller began (a read
snapshot or a write, see ferryq.store.sqlite.store); the flows written once for both
backends (cancel, the counts, the lane listing) run through a ``Session``.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping, Sequence

from ferryq import lanes
from ferryq.job import Job, State
from ferryq.lanes import LaneRule, LaneView
from ferryq.store import base, flows
from ferryq.store.base import Dependencies, JobFilter, LaneInfo, LaneWindow, WorkerInfo
from ferryq.store.flows import drive
from ferryq.store.sql import (
    TOKEN_COLUMNS,
    dependencies_from_rows,
    job_from_row,
    lane_window,
    list_query,
    rule_params,
    worker_from_row,
)
from ferryq.store.sqlite import lanes as lane_steps
from ferryq.store.sqlite.claims import move_to_history
from ferryq.store.sqlite.queries import Q
from ferryq.store.sqlite.session import Session

Conn = sqlite3.Connection

# -- jobs ----------------------------------------------------------------------


def get(conn: Conn, job_id: int) -> Job | None:
    row = conn.execute(Q["job_get_hot"], {"id": job_id}).fetchone()
    if row is None:
        row = conn.execute(Q["job_get_history"], {"id": job_id}).fetchone()
    return None if row is None else job_from_row(row)


def job_list(conn: Conn, where: JobFilter) -> list[Job]:
    sql, params = list_query(where)
    return [job_from_row(row) for row in conn.execute(sql, params)]


def dependencies(conn: Conn, job_id: int) -> Dependencies:
    return dependencies_from_rows(conn.execute(Q["job_dependencies"], {"id": job_id}).fetchall())


def dependency_results(conn: Conn, job_id: int) -> list[str | None]:
    rows = conn.execute(Q["job_dependency_results"], {"id": job_id})
    return [result if state == "succeeded" else None for _, state, result in rows]


def cancel(conn: Conn, job_id: int, now: float) -> Job:
    return drive(flows.cancel(Session(conn), job_id, now))


def respawn(
    conn: Conn, job_ids: Sequence[int], now: float, expires_at: float | None, max_tries: int | None
) -> list[int]:
    moved = []
    for job_id in job_ids:
        params = {"id": job_id, "now": now, "expires_at": expires_at, "max_tries": max_tries}
        if conn.execute(Q["job_respawn"], params).rowcount:
            conn.execute(Q["history_delete"], {"id": job_id})
            moved.append(job_id)
    # A job in a lane comes back waiting, ahead of the later jobs by its id; the one
    # that halted its lane resumes at once.
    back = {(r[1], r[2]) for r in conn.execute(Q["lane_of_jobs"], {"ids": json.dumps(moved)})}
    released = lane_steps.release(conn, moved)
    if released:  # it goes first and keeps its place, as a retry does
        resumed = json.dumps(list(released.values()))
        conn.execute(Q["lane_admit_due"], {"ids": resumed, "now": now})
    lane_steps.settle(conn, back | released.keys(), now)
    return moved


def purge(conn: Conn, job_ids: Sequence[int], now: float) -> int:
    purged = [i for i in job_ids if conn.execute(Q["job_purge"], {"id": i}).rowcount]
    lane_steps.settle(conn, set(lane_steps.release(conn, purged)), now)
    return len(purged)


def counts(conn: Conn, namespace: str | None) -> dict[tuple[str, str, str], int]:
    return drive(flows.job_counts(Session(conn), namespace))


# -- queues as the HTTP API sees them ------------------------------------------


def queue_peek(conn: Conn, namespace: str, queue: str, now: float) -> Job | None:
    params = {"namespace": namespace, "queue": queue, "now": now}
    row = conn.execute(Q["queue_peek"], params).fetchone()
    return None if row is None else job_from_row(row)


def queue_size(conn: Conn, namespace: str, queue: str, state: State) -> int:
    name = "queue_size_history" if state.terminal else "queue_size_hot"
    params = {"namespace": namespace, "queue": queue, "state": state.value}
    return int(conn.execute(Q[name], params).fetchone()[0])


def queue_clear(conn: Conn, namespace: str, queue: str, now: float) -> int:
    params = {"namespace": namespace, "queue": queue, "state": State.CANCELLED.value,
              "now": now}  # fmt: skip
    return len(move_to_history(conn, "queue_clear", params))


def dead_oldest(conn: Conn, namespace: str, queue: str, limit: int) -> list[int]:
    params = {"namespace": namespace, "queue": queue, "limit": limit}
    return [r[0] for r in conn.execute(Q["dead_oldest"], params)]


# -- tokens --------------------------------------------------------------------


def token_create(conn: Conn, token: base.Token) -> bool:
    params = {column: getattr(token, column) for column in TOKEN_COLUMNS}
    return writes_a_row(conn, "token_create", params)


def token_get(conn: Conn, digest: str) -> base.Token | None:
    row = conn.execute(Q["token_get"], {"digest": digest}).fetchone()
    return None if row is None else base.Token(*row)


def token_list(conn: Conn, namespace: str | None) -> list[base.Token]:
    name = "token_list_all" if namespace is None else "token_list"
    return [base.Token(*row) for row in conn.execute(Q[name], {"namespace": namespace})]


def token_delete(conn: Conn, namespace: str, digest: str) -> bool:
    return writes_a_row(conn, "token_delete", {"namespace": namespace, "digest": digest})


def token_limit_set(
    conn: Conn, digest: str, read: int | None, write: int | None, interval: float | None
) -> bool:
    params = {"digest": digest, "limit_read": read, "limit_write": write,
              "limit_interval": interval}  # fmt: skip
    return writes_a_row(conn, "token_limit_set", params)


def writes_a_row(conn: Conn, statement: str, params: Mapping[str, object]) -> bool:
    """Run a write that returns a row when it changed something."""
    return bool(conn.execute(Q[statement], params).fetchall())


# -- lanes ---------------------------------------------------------------------


def lane_rule_set(conn: Conn, namespace: str, rule: LaneRule, now: float) -> None:
    conn.execute(Q["lane_rule_set"], {"namespace": namespace, "now": now, **rule_params(rule)})
    lanes_named = lane_steps.matching(conn, namespace, rule.pattern)
    lane_steps.settle(conn, lanes_named, now, limits_changed=True)


def lane_rule_delete(conn: Conn, namespace: str, pattern: str, now: float) -> bool:
    params = {"namespace": namespace, "pattern": pattern}
    if not conn.execute(Q["lane_rule_delete"], params).rowcount:
        return False
    lane_steps.settle(conn, lane_steps.matching(conn, namespace, pattern), now,
                      limits_changed=True)  # fmt: skip
    return True


def lane_window_of(conn: Conn, namespace: str, lane: str) -> LaneWindow:
    row = conn.execute(Q["lane_window"], {"namespace": namespace, "lane": lane}).fetchone()
    return lane_window(row)


def lane_view(conn: Conn, namespace: str, lane: str) -> LaneView:
    rule = lanes.rule_for(lane_steps.rules(conn, namespace), lane)
    return lane_steps.view(conn, namespace, lane, rule)


def lane_ahead(conn: Conn, namespace: str, lane: str, job_id: int) -> int:
    params = {"namespace": namespace, "lane": lane, "id": job_id}
    return int(conn.execute(Q["lane_ahead"], params).fetchone()[0])


def lane_list(conn: Conn, namespace: str, limit: int) -> list[LaneInfo]:
    return drive(flows.lane_list(Session(conn), namespace, limit))


# -- periodic tasks ------------------------------------------------------------


def periodic_sync(
    conn: Conn, namespace: str, entries: Sequence[base.PeriodicEntry], now: float
) -> list[base.PeriodicState]:
    for entry in entries:
        params = {"namespace": namespace, "task": entry.task, "schedule": entry.schedule,
                  "queue": entry.queue, "catch_up": entry.catch_up, "now": now}  # fmt: skip
        conn.execute(Q["periodic_upsert"], params)
    return periodic_list(conn, namespace)


def periodic_advance(
    conn: Conn, namespace: str, task: str, checked_from: float, advance: base.PeriodicAdvance
) -> bool:
    params = {"namespace": namespace, "task": task, "checked_from": checked_from,
              "checked_until": advance.checked_until, "next_tick": advance.next_tick,
              "now": advance.updated_at, "last_tick": advance.last_tick,
              "last_job": advance.last_job}  # fmt: skip
    return conn.execute(Q["periodic_advance"], params).rowcount == 1


def periodic_list(conn: Conn, namespace: str) -> list[base.PeriodicState]:
    rows = conn.execute(Q["periodic_list"], {"namespace": namespace})
    return [base.PeriodicState(*row) for row in rows]


# -- workers -------------------------------------------------------------------


def worker_beat(conn: Conn, worker: WorkerInfo) -> None:
    params = {
        "id": worker.id, "namespace": worker.namespace, "queues": json.dumps(worker.queues),
        "host": worker.host, "pid": worker.pid, "concurrency": worker.concurrency,
        "started_at": worker.started_at, "heartbeat_at": worker.heartbeat_at,
        "running": json.dumps(worker.running), "stats": json.dumps(worker.stats),
    }  # fmt: skip
    conn.execute(Q["worker_beat"], params)


def worker_remove(conn: Conn, worker_id: str) -> None:
    conn.execute(Q["worker_remove"], {"id": worker_id})


def worker_list(conn: Conn, alive_since: float | None) -> list[WorkerInfo]:
    rows = conn.execute(Q["worker_list"], {"since": alive_since or 0.0})
    return [worker_from_row(r) for r in rows]


def worker_prune(conn: Conn, dead_before: float) -> int:
    return conn.execute(Q["worker_prune"], {"before": dead_before}).rowcount
