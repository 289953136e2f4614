"""Claims and finishes on PostgreSQL: the worker's hot path, and the HTTP consumers'
takes.

Claims take rows with ``FOR UPDATE SKIP LOCKED`` through partial indexes; finishes
go in batches through ``unnest``. A worker's cycle runs on two connections at once:
the finishes in a transaction of their own, which also takes what the lanes they
free hand over, and the claim beside it. A process's claims (hand-overs included)
run one at a time, in the order they were asked for (``Turns``), so that a one-slot
worker starts its jobs in order.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ferryq.job import Job, State
from ferryq.lanes import LaneKey, Taker
from ferryq.store import base, flows
from ferryq.store.base import TO_HISTORY, Claimed, Finish, FinishReport, Leases
from ferryq.store.postgres import lanes
from ferryq.store.postgres.connection import Conn, Database, run, runner
from ferryq.store.postgres.queries import Q
from ferryq.store.postgres.session import ConnSession
from ferryq.store.postgres.waits import DONE_CHANNEL, Waits
from ferryq.store.sql import held_leases, job_from_row, requeue_statement
from ferryq.turns import Turn, Turns

#: How long a namespace seen with a lane rate claims through the gate without asking.
RATED_FOR = 10.0


class Claims:
    """The claims of one store: their turns, and its memory of rated namespaces."""

    def __init__(self, db: Database, waits: Waits) -> None:
        self._db = db
        self._waits = waits
        self._turns = Turns()
        self.rated = Rated()

    async def finish_many(self, finishes: Sequence[Finish]) -> FinishReport:
        return (await self._finish(finishes, None))[0]

    async def _finish(
        self, finishes: Sequence[Finish], taker: Taker | None, now: float = 0.0
    ) -> tuple[FinishReport, list[Claimed]]:
        return await self._db.session(finish_many, finishes, self.rated, taker, now)

    async def finish_and_claim(
        self,
        finishes: Sequence[Finish],
        namespace: str,
        queues: Sequence[str],
        limit: int,
        worker: str,
        now: float,
    ) -> tuple[FinishReport, list[Claimed]]:
        """``Store.job_finish_and_claim``."""
        if not limit:
            return await self.finish_many(finishes), []
        # This process's claims run one at a time, in the order they were asked for
        # (the turn is taken before anything is awaited): two claims at once would skip
        # each other's rows, and the later one could take, and start, the later jobs
        # first. Finishes still run beside claims, except those that hand lanes' next
        # jobs over (``_hand_over``), which are claims too.
        turn = self._turns.take()
        try:
            await self._waits.claiming()
            if not finishes:
                return FinishReport([], []), await self._claim(
                    namespace, queues, limit, worker, now, turn
                )
            # A lane freed by one of these finishes hands its next job to this worker; the
            # slots kept for that are claimed for in the same transaction if the lanes had
            # less to give.
            freeing = sum(1 for f in finishes if f.lane is not None and f.kind in TO_HISTORY)
            taker = Taker(namespace, queues, worker, min(limit, freeing))
            # Two connections at once: the server finishes one batch while it claims the
            # next. Both run to their end before any failure is raised, so none is left
            # in flight.
            finished, claimed = await asyncio.gather(
                self._hand_over(finishes, taker, now, turn),
                self._claim(namespace, queues, limit - taker.budget, worker, now, turn),
                return_exceptions=True,
            )
            if isinstance(finished, BaseException) and isinstance(claimed, BaseException):
                raise finished
            if isinstance(finished, BaseException):
                assert not isinstance(claimed, BaseException)
                raise base.CycleHalfDone(None, claimed) from finished
            report, taken = finished
            if isinstance(claimed, BaseException):
                raise base.CycleHalfDone(report, taken) from claimed
            return report, taken + claimed
        finally:
            turn.end()

    async def _hand_over(
        self, finishes: Sequence[Finish], taker: Taker, now: float, turn: Turn
    ) -> tuple[FinishReport, list[Claimed]]:
        """Finishes whose freed lanes may hand their next jobs to this worker: a
        claim, so it waits for the claims asked for before it. Run beside one of them,
        it could make ready the job behind the one it takes, for that earlier claim to
        take and start first (in the same lane, out of id order)."""
        if taker.budget:
            await turn.wait()
        return await self._finish(finishes, taker, now)

    async def _claim(
        self, namespace: str, queues: Sequence[str], limit: int, worker: str, now: float,
        turn: Turn,
    ) -> list[Claimed]:  # fmt: skip
        await turn.wait()
        try:
            # Each statement commits by itself: the promotion need not wait for the
            # claim, and two round trips fewer (BEGIN, COMMIT) is pickup latency saved.
            # Behind a transaction pooler each would be in a transaction of its own
            # (connection.PooledConn): one for both costs two round trips fewer.
            return await self._db.session(
                claim, namespace, queues, limit, worker, now, self.rated,
                transaction=self._db.pooling.transaction,
            )  # fmt: skip
        finally:
            turn.end()

    async def take(
        self, namespace: str, queue: str, limit: int, worker: str, ttr: float, now: float
    ) -> list[Job]:
        """``Store.job_take``: a claim for an HTTP consumer, leased for its ``ttr``."""
        await self._waits.claiming()  # as a claim: what is enqueued next wakes us
        # Each statement commits by itself, as a claim's do.
        return await self._db.session(
            take, namespace, queue, limit, worker, ttr, now, self.rated,
            transaction=self._db.pooling.transaction,
        )  # fmt: skip


async def claim(
    conn: Conn, namespace: str, queues: Sequence[str], limit: int, worker: str, now: float,
    rated: Rated,
) -> list[Claimed]:  # fmt: skip
    """The first ``limit`` ready jobs of ``queues``, due ones promoted first."""
    await run(conn, Q["job_promote_due_queues"], namespace=namespace, queues=list(queues),
              now=now, limit=1000)  # fmt: skip
    if limit <= 0:  # freed lanes may take every slot: promoting is all there is to do
        return []
    return await _claim_ready(conn, namespace, queues, limit, worker, now, rated)


async def _claim_ready(
    conn: Conn, namespace: str, queues: Sequence[str], limit: int, worker: str, now: float,
    rated: Rated,
) -> list[Claimed]:  # fmt: skip
    """The first ready jobs of ``queues``. The plain claim takes nothing in a namespace
    with a lane rate (its guard): then, and at once for a namespace seen with one
    (``rated``), the jobs are picked and pass the rate gate first (``_gated``)."""
    params = {"limit": limit, "now": now, "worker": worker}
    rows: list[Any] = []
    if not rated.known(namespace):
        if len(queues) == 1:
            rows = await run(conn, Q["job_claim_queue"], namespace=namespace, queue=queues[0],
                             **params)  # fmt: skip
        else:
            rows = await run(conn, Q["job_claim_queues"], namespace=namespace,
                             queues=list(queues), **params)  # fmt: skip
    if not rows and await _rated(conn, namespace, rated):
        rows = await _gated(conn, namespace, queues, "job_claim", params, rated)
    return sorted((Claimed(*row) for row in rows), key=lambda c: (c.order_time, c.id))


async def take(
    conn: Conn, namespace: str, queue: str, limit: int, worker: str, ttr: float, now: float,
    rated: Rated,
) -> list[Job]:  # fmt: skip
    await run(conn, Q["job_promote_due_queues"], namespace=namespace, queues=[queue], now=now,
              limit=1000)  # fmt: skip
    params = {"limit": limit, "worker": worker, "ttr": ttr, "now": now}
    rows: list[Any] = []
    if not rated.known(namespace):
        rows = await run(conn, Q["job_take"], namespace=namespace, queue=queue, **params)
    if not rows and await _rated(conn, namespace, rated):
        rows = await _gated(conn, namespace, [queue], "job_take_ids", params, rated)
    return sorted(map(job_from_row, rows), key=lambda job: (job.order_time, job.id))


class Rated:
    """The namespaces seen with a lane rate in the last ``RATED_FOR`` seconds: their
    claims go to the gate at once (the plain claim's guard finds nothing for them
    first). A namespace whose rates are gone claims plainly again after that."""

    def __init__(self) -> None:
        self._seen: dict[str, float] = {}

    def known(self, namespace: str) -> bool:
        return self._seen.get(namespace, -math.inf) > time.monotonic() - RATED_FOR

    def saw(self, namespace: str, rated: bool) -> None:
        if rated:
            self._seen[namespace] = time.monotonic()
        else:
            self._seen.pop(namespace, None)


async def _rated(conn: Conn, namespace: str, rated: Rated) -> bool:
    """Whether a rule of the namespace has a rate (remembered in ``rated``)."""
    if rated.known(namespace):
        return True
    found = bool((await run(conn, Q["lane_rated"], namespace=namespace))[0][0])
    rated.saw(namespace, found)
    return found


async def _gated(
    conn: Conn, namespace: str, queues: Sequence[str], statement: str, params: dict[str, Any],
    rated: Rated,
) -> list[Any]:  # fmt: skip
    """Claim (``statement``: job_claim or job_take_ids) what the rate gate lets start of
    the ready jobs picked, in a transaction (a savepoint in a finish's): the picked rows
    stay locked until the gate's decisions commit with the claim."""
    async with conn.transaction():
        picked = await run(conn, Q["job_pick"], namespace=namespace, queues=list(queues),
                           limit=params["limit"], now=params["now"])  # fmt: skip
        ids, still = await flows.rate_gate(ConnSession(conn), namespace, picked, params["now"])
        if still is not None:
            rated.saw(namespace, still)
        if not ids:
            return []
        return await run(conn, Q[statement], ids=json.dumps(ids), **{
            k: v for k, v in params.items() if k != "limit"
        })  # fmt: skip


async def next_due(conn: Conn, namespace: str, queues: Sequence[str]) -> float | None:
    rows = await run(conn, Q["job_next_due"], namespace=namespace, queues=list(queues))
    return None if rows[0][0] is None else float(rows[0][0])


# -- finishes ------------------------------------------------------------------


async def finish_many(
    conn: Conn, finishes: Sequence[Finish], rated: Rated, taker: Taker | None = None,
    now: float = 0.0,
) -> tuple[FinishReport, list[Claimed]]:  # fmt: skip
    """Write ``finishes``; what freed lanes hand to ``taker``, and the ready jobs that
    make up the rest of its budget (claimed at ``now``), come back as claimed."""
    run_here = runner(conn)
    # Lanes first, rows after: the locks of the lanes of every job in the batch, found
    # from the jobs' rows (``Finish.lane`` is not relied on), before any row is
    # touched; taken by the first statement, or by one of their own when no finish
    # of the batch moves to history.
    every = [f.id for f in finishes]
    ended = _Ended()
    to_history = [f for f in finishes if f.kind in TO_HISTORY]
    if not to_history:
        await lanes.lock_jobs(run_here, every)
    else:
        rows = await run(
            conn, Q["job_finish_batch_to_history"], lock_ids=every,
            ids=[f.id for f in to_history], fences=[f.fence for f in to_history],
            states=[f.kind for f in to_history], results=[f.result for f in to_history],
            errors=[None if f.error is None else json.dumps(f.error) for f in to_history],
            started=[f.started_at for f in to_history],
            finished=[f.finished_at for f in to_history],
        )  # fmt: skip
        for job_id, namespace, lane, state in rows:
            ended.add(job_id, namespace, lane, state)
    for finish in finishes:
        if finish.kind in TO_HISTORY:
            continue
        cancel = {"id": finish.id, "fence": finish.fence, "state": "cancelled",
                  "now": finish.finished_at}  # fmt: skip
        if cancelled := await run(conn, Q["job_cancel_if_requested"], **cancel):
            ended.add(finish.id, cancelled[0][1], cancelled[0][2], "cancelled")
            continue
        name, params = requeue_statement(finish)
        ended.accepted.extend(r[0] for r in await run(conn, Q[name], **params))
    done = set(ended.accepted)
    notify = bool(to_history and done)
    taken: list[Claimed] = []
    if ended.lanes:
        ended_at = max(f.finished_at for f in finishes)
        taken = await lanes.settle(run_here, ended.lanes, ended_at, ended.dead, locked=True,
                                   taker=taker, notify_done=notify)  # fmt: skip
    elif notify:
        await conn.execute(f"SELECT pg_notify('{DONE_CHANNEL}', '')")
    if taker is not None and taker.budget > 0:
        # No lock is waited for: the claim skips rows others hold.
        taken += await _claim_ready(conn, taker.namespace, taker.queues, taker.budget,
                                    taker.worker, now, rated)  # fmt: skip
    stale = [f.id for f in finishes if f.id not in done]
    return FinishReport([f.id for f in finishes if f.id in done], stale), taken


class _Ended:
    """What a batch of finishes did: the jobs it moved, the lanes that have room now,
    and the deaths that may halt a lane."""

    def __init__(self) -> None:
        self.accepted: list[int] = []
        self.lanes: set[LaneKey] = set()
        self.dead: dict[LaneKey, list[int]] = {}

    def add(self, job_id: int, namespace: str, lane: str | None, state: str) -> None:
        self.accepted.append(job_id)
        if lane is not None:
            self.lanes.add((namespace, lane))
            if state == "dead":
                self.dead.setdefault((namespace, lane), []).append(job_id)


async def ack(conn: Conn, namespace: str, queue: str, ids: Sequence[int], now: float) -> set[int]:
    """``Store.job_ack``: an HTTP consumer's jobs end succeeded, whatever attempt holds
    them (it has no fencing token)."""
    run_here = runner(conn)
    await lanes.lock_jobs(run_here, ids)  # the lanes before the rows
    rows = await run(conn, Q["job_ack"], ids=list(ids), namespace=namespace, queue=queue,
                     state=State.SUCCEEDED.value, now=now)  # fmt: skip
    await lanes.settle(run_here, {(r[1], r[2]) for r in rows if r[2] is not None}, now,
                       locked=True)  # fmt: skip
    if rows:
        await conn.execute(f"SELECT pg_notify('{DONE_CHANNEL}', '')")
    return {r[0] for r in rows}


# -- leases --------------------------------------------------------------------


async def leases(
    db: Database,
    fences: Mapping[int, int],
    extend: Sequence[int],
    now: float,
    started: Mapping[int, float],
    progress: Mapping[int, str],
) -> Leases:
    """``Store.job_leases``: the renewal, then a look at every lease held."""
    extended: list[int] = []
    if extend:
        rows = await db.fetch(
            "job_lease_extend", ids=list(extend),
            fences=[fences.get(i, -1) for i in extend],
            started=[started.get(i) for i in extend],
            progress=[progress.get(i) for i in extend], now=now,
        )  # fmt: skip
        extended = sorted(r[0] for r in rows)
    rows = await db.fetch("job_held", ids=list(fences))
    return held_leases(fences, extended, rows)
