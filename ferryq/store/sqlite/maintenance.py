"""Maintenance on SQLite, the leader's duties: promotion of due jobs, the leases that
ran out, expiry, the history's pruning and counting, and leadership itself (a lease
row in ``ferryq_leaders``).

Each function runs on the store's thread in the transaction its caller began.
"""

from __future__ import annotations

import sqlite3

from ferryq.job import State
from ferryq.store.base import Claimed
from ferryq.store.sqlite.claims import move_terminal
from ferryq.store.sqlite.queries import Q

Conn = sqlite3.Connection
FOLD_ROWS = 50_000  # history rows counted per fold, at most (one short write)


def promote_due(conn: Conn, now: float, limit: int) -> int:
    return conn.execute(Q["job_promote_due"], {"now": now, "limit": limit}).rowcount


def expired_leases(conn: Conn, now: float, limit: int) -> list[Claimed]:
    rows = conn.execute(Q["job_expired_leases"], {"now": now, "limit": limit})
    return [Claimed(*row) for row in rows]


def expire(conn: Conn, now: float, limit: int) -> list[int]:
    ids = [r[0] for r in conn.execute(Q["job_expire_ids"], {"now": now, "limit": limit})]
    for job_id in ids:
        move_terminal(conn, job_id, State.EXPIRED, now)
    return ids


def history_prune(conn: Conn, before: float, limit: int) -> int:
    pruned = conn.execute(Q["history_prune"], {"before": before, "limit": limit}).rowcount
    if pruned:
        conn.execute(Q["deps_prune"])
    conn.execute(Q["lane_windows_prune"], {"before": before})
    return pruned


def history_fold(conn: Conn) -> int:
    """Count up to FOLD_ROWS history rows past the fold's mark into the stored counts."""
    mark, until = conn.execute(Q["history_fold_range"], {"limit": FOLD_ROWS}).fetchone()
    if until <= mark:
        return 0
    groups = conn.execute(Q["history_fold"], {"until": until}).fetchall()
    conn.executemany(Q["history_count_add"], [
        {"namespace": ns, "queue": queue, "state": state, "n": n}
        for ns, queue, state, n in groups
    ])  # fmt: skip
    conn.execute(Q["history_fold_mark"], {"until": until})
    return sum(n for *_, n in groups)


def leader_acquire(conn: Conn, name: str, holder: str, ttl: float, now: float) -> bool:
    params = {"name": name, "holder": holder, "expires_at": now + ttl, "now": now}
    return conn.execute(Q["leader_acquire"], params).rowcount == 1


def leader_release(conn: Conn, name: str, holder: str) -> None:
    conn.execute(Q["leader_release"], {"name": name, "holder": holder})
