"""The server's share of the engine: one store, tokens, rate limits, waiting consumers,
and maintenance, for every HTTP route to use.

The server is a peer of the workers: it reads and writes the same tables through the
operations layer (``ferryq.ops``), and takes part in the maintenance election, so
leases run out and delayed jobs come due with or without a worker process running.

Blocking consumes never query the database on their own. Each keeps its deadline on
the event loop's clock and answers at it whatever the database is doing; the looking
is done for all of them at once: a publish or any action that can make jobs ready
(``Signals.ready``) wakes the consumers concerned, and one watcher notices other
processes' writes (``Operations.changed``) and looks again for every waiting consumer,
one round at a time. Result waits are ``Operations.wait_ended``, as in the Python API.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from ferryq import insights
from ferryq.app import App
from ferryq.handle import JobHandle
from ferryq.job import Job
from ferryq.ops import Operations
from ferryq.policy import JobOptions
from ferryq.server.batching import Coalescer, split
from ferryq.server.tokens import RateLimiter, TokenCache
from ferryq.worker.maintenance import MaintenanceLoop

log = logging.getLogger("ferryq.server")
W = TypeVar("W")

#: How long a waiting consumer goes without looking again, at most: a delayed job that
#: came due, or a change no notification announced, is seen within this.
RECHECK_SECONDS = 0.25
#: Rounds of looking are at least this far apart, and at least as far apart as the last
#: round took (so waiting takes at most about half of the database's time), and rounds
#: that no write prompted at least ``RECHECK_ROUNDS`` round durations apart.
WAKE_SPACING = 0.005
RECHECK_ROUNDS = 4


@dataclass(eq=False)
class _Consumer:
    """A blocking consume: the queues it waits on, and the jobs it is answered with."""

    namespace: str
    queues: Sequence[str]
    count: int
    ttr: float
    answer: asyncio.Future[list[Job]]
    looking: bool = False  # a take for it is in flight
    again: bool = False  # something changed while it was: take once more
    idle: asyncio.Event = field(default_factory=asyncio.Event)  # no take in flight

    def __post_init__(self) -> None:
        self.idle.set()

    def queue_keys(self) -> list[tuple[str, str]]:
        return [(self.namespace, queue) for queue in self.queues]


@dataclass(eq=False)
class _Watch(Generic[W]):
    """One kind of waiter, and the task that looks again for all of them."""

    waiters: dict[W, None] = field(default_factory=dict)  # in arrival order
    task: asyncio.Task[None] | None = None


class Engine:
    """Everything the routes share. ``start()`` on the serving event loop first."""

    def __init__(self, app: App, *, maintenance: bool = True) -> None:
        self.app = app
        host, pid = socket.gethostname(), os.getpid()
        self.id = f"{insights.HTTP_HOLDER_PREFIX}{host}:{pid}:{secrets.token_hex(3)}"
        self.limiter = RateLimiter()
        self._maintenance_enabled = maintenance
        self._ops: Operations | None = None
        self._tokens: TokenCache | None = None
        self._consumers: dict[tuple[str, str], dict[_Consumer, None]] = {}
        self._consuming: _Watch[_Consumer] = _Watch()
        self._closed = asyncio.Event()  # result waits end at once
        self._looks: set[asyncio.Task[None]] = set()
        self._services: list[asyncio.Task[None]] = []
        self._maintenance: MaintenanceLoop | None = None
        self.closing = False
        # Concurrent requests of one kind share a transaction (see batching.py).
        self._takes = Coalescer(self._take_batch)
        self._acks = Coalescer(self._ack_batch)
        self._inserts = Coalescer(self._insert_batch)

    @property
    def ops(self) -> Operations:
        if self._ops is None:
            raise RuntimeError("the engine is not started")
        return self._ops

    @property
    def tokens(self) -> TokenCache:
        if self._tokens is None:
            raise RuntimeError("the engine is not started")
        return self._tokens

    def now(self) -> float:
        return self.app.clock()

    async def start(self) -> None:
        self._ops = await self.app.operations()
        self._tokens = TokenCache(self._ops)
        self.app.signals.listen(self.notify)
        if self._maintenance_enabled:
            self._maintenance = MaintenanceLoop(self._ops.store, self.id, self.app.clock)
            self._services.append(asyncio.create_task(self._maintenance.run()))
            insights.maintained_here(self._ops.store)  # explain: leases are recovered here

    def close(self) -> None:
        """Stop serving: waiting requests are answered at once, empty-handed."""
        self.closing = True
        self._closed.set()
        for consumer in self._consuming.waiters:
            if not consumer.answer.done():
                consumer.answer.set_result([])

    async def stop(self) -> None:
        self.app.signals.unlisten(self.notify)
        watchers = [self._consuming.task] if self._consuming.task is not None else []
        tasks = [*self._services, *watchers, *list(self._looks)]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._maintenance is not None:
            insights.maintained_here(self.ops.store, False)
            with contextlib.suppress(Exception):
                await self._maintenance.leave()
        await self.app.aclose()

    # -- consumers ---------------------------------------------------------------

    def notify(self, namespace: str | None = None, queue: str | None = None) -> None:
        """Something was published here (to this queue, if named): its waiting consumers
        look again at once."""
        if namespace is None or queue is None:
            consumers = list(self._consuming.waiters)
        else:
            consumers = list(self._consumers.get((namespace, queue), ()))
        for consumer in consumers:
            self._soon(self._look_for_jobs(consumer))

    async def take(
        self,
        namespace: str,
        queues: Sequence[str],
        count: int,
        ttr: float,
        timeout: float,
        gone: asyncio.Event | None = None,
        since: float | None = None,
    ) -> list[Job]:
        """Lease up to ``count`` jobs, trying the queues in the order given; with nothing
        ready, wait up to ``timeout`` seconds (from ``since``, a time of the event loop's
        clock, if given) for the first one. Once ``gone`` is set (the consumer went
        away) the wait ends empty-handed.

        The answer comes by the deadline whatever the database is doing: a take still
        in flight then is left to finish, and what it leases goes back to its queue."""
        deadline = _deadline(timeout, since)
        if deadline <= asyncio.get_running_loop().time() or self.closing:
            return await self._take_now(namespace, queues, count, ttr)
        consumer = _Consumer(namespace, tuple(queues), count, ttr, _future())
        self._enter_consumer(consumer)
        try:
            self._soon(self._look_for_jobs(consumer))
            await _until(consumer.answer, deadline, gone)
            if consumer.answer.done():
                return consumer.answer.result()
            if gone is not None and gone.is_set():
                # Nobody waits for this answer: a take in flight gives its jobs back
                # before the consumer is answered, so they are ready again by then.
                self._leave_consumer(consumer)
                await consumer.idle.wait()
            return []
        finally:
            self._leave_consumer(consumer)

    def _enter_consumer(self, consumer: _Consumer) -> None:
        for key in consumer.queue_keys():
            self._consumers.setdefault(key, {})[consumer] = None
        self._enter(self._consuming, consumer, self._watch_jobs)

    def _leave_consumer(self, consumer: _Consumer) -> None:
        for key in consumer.queue_keys():
            waiting = self._consumers.get(key, {})
            waiting.pop(consumer, None)
            if not waiting:
                self._consumers.pop(key, None)
        self._consuming.waiters.pop(consumer, None)
        consumer.answer.cancel()  # a take still in flight gives its jobs back

    async def _look_for_jobs(self, consumer: _Consumer) -> None:
        """Take for ``consumer``, once more if something changed meanwhile; jobs taken
        after it stopped waiting go back."""
        if consumer.looking:
            consumer.again = True
            return
        consumer.looking = True
        consumer.idle.clear()
        try:
            while not consumer.answer.done():
                consumer.again = False
                args = (consumer.namespace, consumer.queues, consumer.count, consumer.ttr)
                jobs = await self._take_now(*args)
                consumer.count = 1  # after the first look, the first job is the answer
                if jobs and consumer.answer.done():
                    await self.give_back(jobs)
                elif jobs:
                    consumer.answer.set_result(jobs)
                if jobs or not consumer.again:
                    return
        except Exception as exc:
            _fail(consumer.answer, exc, "looking for jobs for a waiting consumer failed")
        finally:
            consumer.looking = False
            consumer.idle.set()

    async def _watch_jobs(self) -> None:
        """While consumers wait: after another process's write, every
        ``RECHECK_SECONDS``, and when a delayed job comes due, the consumers whose
        queues have a job ready or due look again."""
        await self._watch(self._consuming, self.ops.changed, RECHECK_SECONDS, self._jobs_round)

    async def _jobs_round(self, prompted: bool) -> float | None:
        """Look for the consumers whose queues have work; the time the next delayed job
        of their queues comes due, or now when a consumer was answered (see below). A
        read per queue, not a take per consumer: a write elsewhere seldom concerns them
        all."""
        if prompted and self._consuming.waiters:
            # The store reports the write again until a take (or claim) has looked:
            # the longest waiting consumer's. What commits after it starts is news.
            await self._look_for_jobs(next(iter(self._consuming.waiters)))
        ready, next_due = await self._queues_with_work(self.now())
        consumers = [c for c in self._consuming.waiters if not ready.isdisjoint(c.queue_keys())]
        await asyncio.gather(*(self._look_for_jobs(consumer) for consumer in consumers))
        if any(consumer.answer.done() for consumer in consumers):
            # Each take marks the writes so far as seen, its own queue's and the others'
            # alike: a job enqueued into a queue read earlier in this round, while a
            # later take ran, would wait for the next recheck. Look once more, now.
            return self.now()
        return next_due

    async def _queues_with_work(self, now: float) -> tuple[set[tuple[str, str]], float | None]:
        """The waited-on queues with a job ready or due, and the time the next delayed
        job of any of them comes due: reads only (a read per queue and one per namespace),
        so nothing is leased and nothing is written."""
        keys = list(self._consumers)
        queues: dict[str, list[str]] = {}
        for namespace, queue in keys:
            queues.setdefault(namespace, []).append(queue)
        dues = await asyncio.gather(*(self.ops.next_due(ns, names)
                                      for ns, names in queues.items()))  # fmt: skip
        peeked = await asyncio.gather(*(self.ops.peek(*key) for key in keys))
        ready = {key for key, job in zip(keys, peeked, strict=True) if job is not None}
        next_due: float | None = None
        for (namespace, names), due in zip(queues.items(), dues, strict=True):
            if due is not None and due <= now:  # the take promotes it
                ready.update((namespace, name) for name in names)
            elif due is not None:
                next_due = due if next_due is None else min(next_due, due)
        return ready, next_due

    async def give_back(self, jobs: Sequence[Job]) -> None:
        """Return taken jobs that no consumer received (``Operations.give_back``)."""
        await self.ops.give_back(jobs)

    async def _take_now(
        self, namespace: str, queues: Sequence[str], count: int, ttr: float
    ) -> list[Job]:
        taken: list[Job] = []
        for queue in queues:
            want = count - len(taken)
            if want <= 0:
                break
            taken += await self._takes.submit((namespace, queue, ttr), want)
        return taken

    async def _take_batch(self, key: tuple[str, str, float], counts: list[int]) -> list[list[Job]]:
        namespace, queue, ttr = key
        jobs = await self.ops.take(namespace, queue, sum(counts), self.id, ttr)
        return split(jobs, counts)  # first come, first served

    # -- producers and acks ------------------------------------------------------

    async def enqueue(
        self,
        task: str,
        encoded_args: list[str],
        options: JobOptions,
        payload_limit: int | None = None,
    ) -> list[int]:
        """Insert jobs (args already JSON) and wake waiting consumers; their ids.

        Concurrent enqueues with the same task and options go in one transaction.
        ``payload_limit``: as in ``App.enqueue_raw``.
        """
        self.app.check_enqueue(task, encoded_args, options, payload_limit)
        key = (task, repr(options), payload_limit)
        handles = await self._inserts.submit(key, (encoded_args, options))
        self.notify(options.namespace, options.queue)
        return [handle.id for handle in handles]

    async def _insert_batch(
        self, key: tuple[str, str, int | None], parts: list[tuple[list[str], JobOptions]]
    ) -> list[list[JobHandle]]:
        task, options, limit = key[0], parts[0][1], key[2]
        args = [a for encoded, _ in parts for a in encoded]
        handles = await self.app.enqueue_raw(task, args, options, payload_limit=limit)
        return split(handles, [len(args) for args, _ in parts])

    async def ack(self, namespace: str, queue: str, job_id: int) -> bool:
        """End the job as succeeded (``Operations.ack``); False if it was not there."""
        return await self._acks.submit((namespace, queue), job_id)

    async def _ack_batch(self, key: tuple[str, str], ids: list[int]) -> list[bool]:
        acked = set(await self.ops.ack(key[0], key[1], ids))
        return [job_id in acked for job_id in ids]

    # -- result waits --------------------------------------------------------------

    async def wait_finished(
        self, job: Job, timeout: float, since: float | None = None
    ) -> Job | None:
        """``job`` once it ended, or as last read when ``timeout`` runs out (counted from
        ``since``) or the server stops (``Operations.wait_ended``)."""
        return await self.ops.wait_ended(job, timeout, since=since, stop=self._closed)

    # -- the shared machinery of waits -------------------------------------------------

    def _soon(self, look: Awaitable[None]) -> None:
        """Run ``look`` in a task of its own: the request waits on its deadline only."""
        task = asyncio.ensure_future(look)
        self._looks.add(task)
        task.add_done_callback(self._looks.discard)

    def _enter(
        self, watch: _Watch[W], waiter: W, run: Callable[[], Coroutine[Any, Any, None]]
    ) -> None:
        watch.waiters[waiter] = None
        if watch.task is None or watch.task.done():
            watch.task = asyncio.create_task(run())

    async def _watch(
        self,
        watch: _Watch[W],
        changed: Callable[[float], Awaitable[bool]],
        recheck: float,
        look: Callable[[bool], Awaitable[float | None]],
    ) -> None:
        """While ``watch`` has waiters: a round of ``look(prompted)`` after each change
        (``changed(within)`` says whether one came within that many seconds), or after
        ``recheck`` seconds, or when the time it returned comes. Rounds never overlap,
        and are spaced by their own duration."""
        loop = asyncio.get_running_loop()
        took, due = 0.0, None
        while watch.waiters:
            within = max(recheck, RECHECK_ROUNDS * took)
            if due is not None:
                within = min(within, max(due - self.now(), WAKE_SPACING))
            try:
                prompted = await changed(within)
            except Exception:
                log.exception("watching the database for waiting requests failed")
                prompted = False
                await asyncio.sleep(recheck)
            began = loop.time()
            try:
                due = await look(prompted)
            except Exception:
                log.exception("looking again for waiting requests failed")
                due = None
            took = loop.time() - began
            # A store reports a change again, without waiting, until the next look has
            # seen it; and the database has other work than ours.
            await asyncio.sleep(max(WAKE_SPACING, took))


def _deadline(timeout: float, since: float | None) -> float:
    """When a wait of ``timeout`` seconds from ``since`` (else now) ends, by the loop's
    clock."""
    return (asyncio.get_running_loop().time() if since is None else since) + timeout


def _future() -> asyncio.Future[Any]:
    return asyncio.get_running_loop().create_future()


async def _until(
    answer: asyncio.Future[Any], deadline: float, gone: asyncio.Event | None = None
) -> None:
    """Wait until ``answer`` is done, ``gone`` is set, or the loop's clock reaches
    ``deadline``; ``answer`` itself is left as it is."""
    waits: set[asyncio.Future[Any]] = {answer}
    if gone is not None:
        waits.add(asyncio.ensure_future(gone.wait()))
    try:
        left = deadline - asyncio.get_running_loop().time()
        await asyncio.wait(waits, timeout=max(left, 0.0), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiting in waits - {answer}:
            waiting.cancel()


def _fail(answer: asyncio.Future[Any], exc: Exception, what: str) -> None:
    """The request still waiting gets the error; one already answered only the log."""
    if answer.done():
        log.warning("%s: %s", what, exc)
    else:
        answer.set_exception(exc)
