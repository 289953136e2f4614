"""Operations: every read and operator action a face performs, once.

The faces (the App's methods, the CLI, the native API under ``/v1``, the lmstfy
routes, the dashboard and the metrics page) do not talk to the store. They ask an
``Operations`` for the job, the list, the explanation, the cancel, the lane rule.
Each action here carries its side effects, so no face can forget one:

- an action that can make jobs ready (a respawn, a lane rule, a purge that releases a
  halted lane, a job given back) tells ``Signals.ready``, which wakes the consumers
  waiting in this process (the HTTP server's blocking consumes);
- an action that can end a job (a cancel, an ack) tells ``Signals.ended``, which
  wakes result waits in this process (a cancel of a job that never ran sends no
  notification on PostgreSQL);
- jobs taken and delivered to a consumer, and acks, count in the metrics, as a
  worker's claims and finishes do (an ack that replaces a job on republish too:
  the job did end ``succeeded``).

Every action takes the namespace it may touch: ``None`` is every namespace (the
Python API and the CLI, which hold the database URL), a name confines it (an API
token, a dashboard viewer). A job of another namespace is "not found", exactly as a
missing one, so a token cannot learn which ids exist elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

from ferryq import insights, lanes, metrics, policy
from ferryq.errors import JobNotFound
from ferryq.job import Job, State
from ferryq.lanes import LaneRule
from ferryq.ops import views
from ferryq.store import open_store
from ferryq.store.base import Dependencies, Finish, JobFilter, LaneInfo, Store, Token, WorkerInfo

#: A result wait reads the job again at least this often: a job ended in a way that
#: sent no notification (cancelled or expired before it ran, on PostgreSQL, by another
#: process) is seen within this.
RESULT_RECHECK_SECONDS = 1.0
#: States a job can be respawned from.
RESPAWNABLE = frozenset({State.DEAD, State.CANCELLED, State.EXPIRED})

Ready = Callable[[str | None, str | None], None]


class Signals:
    """What this process should hear about at once: jobs that may be ready (a
    namespace and queue, or None for "anywhere"), and jobs that may have ended.

    One App serves several event loops (the sync API's portal, workers, the
    application's own), and an action on one may concern a wait on another: each
    listener and each wait is called on its own loop, from whichever thread signals.
    The HTTP server listens; waits on the store see other processes' writes.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ready: list[tuple[asyncio.AbstractEventLoop, Ready]] = []
        self._ended: dict[int, set[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = {}

    def listen(self, listener: Ready) -> None:
        """Call ``listener(namespace, queue)`` on the running loop at each ``ready``."""
        with self._lock:
            self._ready.append((asyncio.get_running_loop(), listener))

    def unlisten(self, listener: Ready) -> None:
        with self._lock:
            self._ready = [(loop, known) for loop, known in self._ready if known != listener]

    def ready(self, namespace: str | None = None, queue: str | None = None) -> None:
        with self._lock:
            listeners = list(self._ready)
        for loop, listener in listeners:
            _call_on(loop, listener, namespace, queue)

    def ended(self, job_id: int) -> None:
        with self._lock:
            waits = list(self._ended.get(job_id, ()))
        for loop, event in waits:
            _call_on(loop, event.set)

    def watch_end(self, job_id: int) -> asyncio.Event:
        """An event, of the running loop, set by ``ended(job_id)``; ``unwatch_end`` it."""
        event = asyncio.Event()
        with self._lock:
            self._ended.setdefault(job_id, set()).add((asyncio.get_running_loop(), event))
        return event

    def unwatch_end(self, job_id: int, event: asyncio.Event) -> None:
        with self._lock:
            watching = self._ended.get(job_id, set())
            watching -= {entry for entry in watching if entry[1] is event}
            if not watching:
                self._ended.pop(job_id, None)


def _call_on(loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: Any) -> None:
    """``fn(*args)`` on ``loop``: now if it is this thread's running loop, else soon."""
    try:
        running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        fn(*args)
        return
    with contextlib.suppress(RuntimeError):  # that loop has closed: nobody waits there
        loop.call_soon_threadsafe(fn, *args)


class Operations:
    """The reads and actions on one store, for one event loop (``App.operations()``).

    ``clock`` gives Unix seconds for the job data (tests freeze it); waits count on the
    event loop's own clock.
    """

    def __init__(self, store: Store, clock: Callable[[], float], signals: Signals) -> None:
        self.store = store
        self.clock = clock
        self.signals = signals
        self._own_store = False

    @classmethod
    async def reader(cls, url: str, clock: Callable[[], float]) -> Operations:
        """Operations on a store of their own, not migrated, closed by ``close()``: for
        long reads that should not queue behind the main store's statements (a SQLite
        store runs one at a time)."""
        store = open_store(url)
        await store.open(migrate=False)
        ops = cls(store, clock, Signals())
        ops._own_store = True
        return ops

    async def close(self) -> None:
        """Close the store if these operations opened it (``reader``)."""
        if self._own_store:
            await self.store.close()

    # -- one job -----------------------------------------------------------------------

    async def find(self, job_id: int, namespace: str | None = None) -> Job | None:
        """The job, or None if there is none (in ``namespace``, when given)."""
        job = await self.store.job_get(job_id)
        if job is None or (namespace is not None and job.namespace != namespace):
            return None
        return job

    async def get(self, job_id: int, namespace: str | None = None) -> Job:
        """The job; :class:`JobNotFound` if there is none (in ``namespace``)."""
        job = await self.find(job_id, namespace)
        if job is None:
            raise JobNotFound(job_id)
        return job

    async def explain(self, job_id: int, namespace: str | None = None) -> insights.Explanation:
        if namespace is not None:
            await self.get(job_id, namespace)
        return await insights.explain(self.store, job_id, self.clock())

    async def dependencies(self, job_id: int, namespace: str | None = None) -> Dependencies:
        """The jobs the job waits for (``after``), and those that wait for it."""
        await self.get(job_id, namespace)
        return await self.store.job_dependencies(job_id)

    async def cancel(self, job_id: int, namespace: str | None = None) -> Job:
        """Cancel the job (a running one is asked to stop): as it is now.
        :class:`InvalidTransition` if it already ended."""
        if namespace is not None:
            await self.get(job_id, namespace)
        job = await self.store.job_cancel(job_id, self.clock())
        self.signals.ended(job_id)
        self.signals.ready()  # a cancel can release a lane for the next job
        return job

    async def respawn(
        self,
        job_ids: Sequence[int],
        ttl: float | None = None,
        namespace: str | None = None,
        *,
        states: frozenset[State] = RESPAWNABLE,
        max_tries: int | None = None,
    ) -> list[int]:
        """Queue ended jobs again with a fresh try count: the ids that moved. With a
        namespace, or fewer ``states`` than every respawnable one, only the jobs found
        there and so are touched."""
        ids = await self._among(job_ids, namespace, states)
        now = self.clock()
        moved = (
            await self.store.job_respawn(ids, now, policy.expires_at(now, ttl), max_tries)
            if ids
            else []
        )
        if moved:
            self.signals.ready()
        return moved

    async def purge(
        self,
        job_ids: Sequence[int],
        namespace: str | None = None,
        *,
        states: frozenset[State] | None = None,
    ) -> int:
        """Delete dead jobs for good, releasing lanes they halted (others are kept):
        how many went."""
        ids = await self._among(job_ids, namespace, states)
        purged = await self.store.job_purge(ids, self.clock()) if ids else 0
        if purged:
            self.signals.ready()  # a purge can release a halted lane
        return purged

    async def _among(
        self, job_ids: Sequence[int], namespace: str | None, states: frozenset[State] | None
    ) -> list[int]:
        """The ids (once each, in order) of the jobs to act on: all of them, or those
        in ``namespace`` and ``states``, read one by one."""
        unique = list(dict.fromkeys(job_ids))
        if namespace is None and (states is None or states == RESPAWNABLE):
            return unique  # the store acts on the eligible ones only
        found = [await self.find(job_id, namespace) for job_id in unique]
        return [j.id for j in found if j is not None and (states is None or j.state in states)]

    async def wait_ended(
        self,
        job: Job,
        timeout: float | None,
        *,
        since: float | None = None,
        stop: asyncio.Event | None = None,
    ) -> Job | None:
        """``job`` once it ended, or as last read when ``timeout`` runs out (counted
        from ``since``, a time of the event loop's clock) or ``stop`` is set: by then,
        whatever the database is doing. None if the job is gone meanwhile (purged)."""
        loop = asyncio.get_running_loop()
        deadline = (
            math.inf if timeout is None else (loop.time() if since is None else since) + timeout
        )
        if job.terminal or deadline <= loop.time() or (stop is not None and stop.is_set()):
            return job
        last = [job]
        ended = self.signals.watch_end(job.id)
        watch = asyncio.ensure_future(self._until_ended(last, ended))
        stopping = asyncio.ensure_future(stop.wait()) if stop is not None else None
        try:
            waits = {watch} if stopping is None else {watch, stopping}
            left = None if math.isinf(deadline) else max(0.0, deadline - loop.time())
            await asyncio.wait(waits, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            return watch.result() if watch.done() else last[0]
        finally:
            for task in (watch, stopping):
                if task is not None:
                    task.cancel()
            if watch.done() and not watch.cancelled():
                watch.exception()  # seen, even by a caller cancelled meanwhile
            self.signals.unwatch_end(job.id, ended)

    async def _until_ended(self, last: list[Job], ended: asyncio.Event) -> Job | None:
        """Read the job now (it may have ended since it was read), then again after
        each sign that it may have ended: a commit elsewhere (``Store.wait_for_finish``)
        or an action here (``Signals.ended``). Where the store gives no such sign, the
        pauses double from 2 ms to ``RESULT_RECHECK_SECONDS``. A failing wait fails
        the result wait, as a failing read does."""
        poll = 0.002
        while True:
            ended.clear()  # before the read: a sign during it is kept for the wait
            found = await self.store.job_get(last[0].id)
            if found is None or found.terminal:
                return found
            last[0] = found
            store_sign = asyncio.ensure_future(
                self.store.wait_for_finish(RESULT_RECHECK_SECONDS, poll)
            )
            here = asyncio.ensure_future(ended.wait())
            try:
                await asyncio.wait([store_sign, here], return_when=asyncio.FIRST_COMPLETED)
            finally:
                here.cancel()
                store_sign.cancel()
            if store_sign.done() and not store_sign.cancelled():
                store_sign.result()  # raises what the wait raised
            poll = min(poll * 2, RESULT_RECHECK_SECONDS)

    # -- many jobs ---------------------------------------------------------------------

    async def jobs(self, where: JobFilter) -> list[Job]:
        return await self.store.job_list(where)

    async def stats(self, namespace: str) -> insights.Stats:
        return await insights.stats(self.store, namespace, self.clock())

    async def counts(self, namespace: str | None) -> dict[tuple[str, str, str], int]:
        """Jobs by (namespace, queue, state), the history's included."""
        return await self.store.job_counts(namespace)

    async def workers(
        self, namespace: str | None = None, *, alive: bool = False
    ) -> list[WorkerInfo]:
        """Registered workers (of ``namespace``), or only those with a recent heartbeat."""
        since = self.clock() - insights.WORKER_ALIVE_SECONDS if alive else None
        found = await self.store.worker_list(alive_since=since)
        return [w for w in found if namespace is None or w.namespace == namespace]

    async def overview(self, namespace: str | None) -> views.Overview:
        """Counts, the last hour's activity, recent dead jobs, halted lanes, workers."""
        return await views.overview(self.store, namespace, self.clock())

    # -- lanes -------------------------------------------------------------------------

    async def lane_rules(self, namespace: str) -> list[LaneRule]:
        return await self.store.lane_rules(namespace)

    async def set_lane_limit(
        self, namespace: str, pattern: str, limit: int, on_dead: str | None = None
    ) -> LaneRule:
        """Set a lane rule (checked: ValueError): jobs not started yet follow it at
        once, so waiting consumers look again."""
        rule = lanes.changed_rule(await self.store.lane_rules(namespace), pattern, limit, on_dead)
        await self.store.lane_rule_set(namespace, rule, self.clock())
        self.signals.ready()  # a higher limit admits jobs at once
        return rule

    async def set_lane_rule(
        self, namespace: str, pattern: str, limit: int, on_dead: str | None, rate: lanes.Rate | None
    ) -> LaneRule:
        """Set a rule's limit, policy (None: kept, as by ``set_lane_limit``) and rate
        (checked by ``lanes.check_rate``; None: none) in one write: the dashboard's form."""
        rules = await self.store.lane_rules(namespace)
        rule = dataclasses.replace(lanes.changed_rule(rules, pattern, limit, on_dead), rate=rate)
        await self.store.lane_rule_set(namespace, rule, self.clock())
        self.signals.ready()
        return rule

    async def set_lane_rate(
        self, namespace: str, pattern: str, n: int, per: float = 1.0
    ) -> LaneRule:
        """Give a rule a rate (checked: ValueError): at most ``n`` starts in any ``per``
        seconds in each lane it names; its limit and policy stay (a new rule has the
        defaults)."""
        rate = lanes.check_rate(n, per)
        rule = lanes.rated_rule(await self.store.lane_rules(namespace), pattern, rate)
        await self.store.lane_rule_set(namespace, rule, self.clock())
        return rule

    async def clear_lane_rate(self, namespace: str, pattern: str) -> LaneRule | None:
        """Take the rate off ``pattern``'s rule (its limit and policy stay); None if it
        has no rule (a malformed pattern: ValueError). Jobs a rate deferred keep their
        due times."""
        lanes.check_rule(pattern, lanes.DEFAULT_LIMIT, "continue")
        rules = await self.store.lane_rules(namespace)
        if not any(rule.pattern == pattern for rule in rules):
            return None
        rule = lanes.rated_rule(rules, pattern, None)
        await self.store.lane_rule_set(namespace, rule, self.clock())
        self.signals.ready()
        return rule

    async def clear_lane_limit(self, namespace: str, pattern: str) -> bool:
        """Drop a rule: its lanes fall back to the next matching rule, or limit 1."""
        dropped = await self.store.lane_rule_delete(namespace, pattern, self.clock())
        if dropped:
            self.signals.ready()
        return dropped

    async def lanes(self, namespace: str, limit: int = 50) -> list[LaneInfo]:
        """Lanes with unfinished jobs, busiest first, then halted lanes."""
        return await self.store.lane_list(namespace, limit)

    async def lanes_page(self, namespace: str, limit: int = 50) -> views.LanesPage:
        """Busy lanes, halted lanes and the rules, as the dashboard shows them."""
        return await views.lanes_page(self.store, namespace, limit)

    # -- queues, as lmstfy consumers see them -------------------------------------------

    async def take(
        self, namespace: str, queue: str, count: int, holder: str, ttr: float
    ) -> list[Job]:
        """Lease up to ``count`` ready jobs of the queue (due ones promoted first).
        They count as claimed once ``delivered``: a consumer that went away meanwhile
        has them given back instead."""
        return await self.store.job_take(namespace, queue, count, holder, ttr, self.clock())

    def delivered(self, jobs: Sequence[Job]) -> None:
        """Taken jobs handed to their consumer: claims, in the metrics, as a worker's."""
        now = self.clock()
        for job in jobs:
            metrics.CLAIMED.inc(1, job.namespace, job.queue)
            metrics.LAG_SECONDS.observe(max(now - job.run_at, 0.0), job.namespace, job.queue)

    async def ack(self, namespace: str, queue: str, job_ids: Sequence[int]) -> list[int]:
        """End these jobs of the queue as succeeded: the ids that were there."""
        acked = await self.store.job_ack(namespace, queue, job_ids, self.clock())
        for job_id in acked:
            metrics.FINISHED.inc(1, namespace, queue, "succeeded")
            self.signals.ended(job_id)
        return acked

    async def give_back(self, jobs: Sequence[Job]) -> None:
        """Return taken jobs that nobody received: ready again where they were, their
        try not charged (as a worker shutting down returns jobs it did not start)."""
        now = self.clock()
        returned = [Finish("returned", job.id, job.fence, now, lane=job.lane) for job in jobs]
        await self.store.job_finish_many(returned)
        for namespace, queue in {(job.namespace, job.queue) for job in jobs}:
            self.signals.ready(namespace, queue)

    async def peek(self, namespace: str, queue: str) -> Job | None:
        """The job the queue would give next, without leasing it."""
        return await self.store.queue_peek(namespace, queue, self.clock())

    async def next_due(self, namespace: str, queues: Sequence[str]) -> float | None:
        return await self.store.job_next_due(namespace, queues)

    async def size(self, namespace: str, queue: str, state: State) -> int:
        return await self.store.queue_size(namespace, queue, state)

    async def clear(self, namespace: str, queue: str) -> int:
        """Drop the queue's ready and delayed jobs: how many."""
        return await self.store.queue_clear(namespace, queue, self.clock())

    async def dead_oldest(self, namespace: str, queue: str, limit: int) -> list[int]:
        return await self.store.dead_oldest(namespace, queue, limit)

    async def changed(self, within: float) -> bool:
        """Whether another connection wrote since the last take, within ``within``."""
        return await self.store.wait_for_change(within, patient=True)

    # -- tokens ------------------------------------------------------------------------

    async def token_create(self, token: Token) -> bool:
        return await self.store.token_create(token)

    async def token_get(self, digest: str) -> Token | None:
        return await self.store.token_get(digest)

    async def token_list(self, namespace: str | None) -> list[Token]:
        return await self.store.token_list(namespace)

    async def token_delete(self, namespace: str, digest: str) -> bool:
        return await self.store.token_delete(namespace, digest)

    async def token_limit_set(
        self, digest: str, read: int | None, write: int | None, interval: float | None
    ) -> bool:
        """Set (or, with all ``None``, clear) a token's rate limit; False if no token."""
        return await self.store.token_limit_set(digest, read, write, interval)
