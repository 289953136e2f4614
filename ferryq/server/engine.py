"""The server's share of the engine: one store, tokens, rate limits, waiting consumers,
and maintenance, for every HTTP route to use.

The server is a peer of the workers: it reads and writes the same tables through the
Store protocol, and takes part in the maintenance election, so leases run out and
delayed jobs come due with or without a worker process running.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
from collections.abc import Sequence
from typing import Any

from ferryq import insights
from ferryq.app import App
from ferryq.handle import JobHandle
from ferryq.job import Job
from ferryq.policy import JobOptions
from ferryq.server.batching import Coalescer, split
from ferryq.server.tokens import RateLimiter, TokenCache
from ferryq.store.base import Finish, Store
from ferryq.worker.maintenance import MaintenanceLoop

log = logging.getLogger("ferryq.server")

#: How long a waiting consumer goes without looking again, at most: a delayed job that
#: came due, or a change no notification announced, is seen within this.
RECHECK_SECONDS = 0.25
#: Wake-ups of waiting consumers by other processes' writes are at least this far apart.
WAKE_SPACING = 0.005


class Engine:
    """Everything the routes share. ``start()`` on the serving event loop first."""

    def __init__(self, app: App, *, maintenance: bool = True) -> None:
        self.app = app
        host, pid = socket.gethostname(), os.getpid()
        self.id = f"{insights.HTTP_HOLDER_PREFIX}{host}:{pid}:{secrets.token_hex(3)}"
        self.limiter = RateLimiter()
        self._maintenance_enabled = maintenance
        self._store: Store | None = None
        self._tokens: TokenCache | None = None
        self._changed = asyncio.Event()
        self._waiting = 0
        self._watcher: asyncio.Task[None] | None = None
        self._services: list[asyncio.Task[None]] = []
        self._maintenance: MaintenanceLoop | None = None
        self.closing = False
        # Concurrent requests of one kind share a transaction (see batching.py).
        self._takes = Coalescer(self._take_batch)
        self._acks = Coalescer(self._ack_batch)
        self._inserts = Coalescer(self._insert_batch)

    @property
    def store(self) -> Store:
        if self._store is None:
            raise RuntimeError("the engine is not started")
        return self._store

    @property
    def tokens(self) -> TokenCache:
        if self._tokens is None:
            raise RuntimeError("the engine is not started")
        return self._tokens

    def now(self) -> float:
        return self.app.clock()

    async def start(self) -> None:
        self._store = await self.app.store()
        self._tokens = TokenCache(self._store)
        if self._maintenance_enabled:
            self._maintenance = MaintenanceLoop(self._store, self.id, self.app.clock)
            self._services.append(asyncio.create_task(self._maintenance.run()))
            insights.maintained_here(self._store)  # explain: leases are recovered here

    def close(self) -> None:
        """Stop serving: waiting consumers return empty-handed at once."""
        self.closing = True
        self.notify()

    async def stop(self) -> None:
        tasks = [*self._services, *([self._watcher] if self._watcher else [])]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._maintenance is not None:
            insights.maintained_here(self.store, False)
            with contextlib.suppress(Exception):
                await self._maintenance.leave()
        await self.app.aclose()

    # -- consumers ---------------------------------------------------------------

    def notify(self) -> None:
        """Something was published here: waiting consumers look again at once."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def take(
        self,
        namespace: str,
        queues: Sequence[str],
        count: int,
        ttr: float,
        timeout: float,
        gone: asyncio.Event | None = None,
    ) -> list[Job]:
        """Lease up to ``count`` jobs, trying the queues in the order given; with nothing
        ready, wait up to ``timeout`` seconds for the first one. Once ``gone`` is set
        (the consumer went away) the wait ends empty-handed."""
        taken = await self._take_now(namespace, queues, count, ttr)
        if taken or timeout <= 0:
            return taken
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        self._waiting += 1
        self._ensure_watcher()
        consumer_gone = asyncio.ensure_future((gone or asyncio.Event()).wait())
        try:
            while not self.closing and (left := deadline - loop.time()) > 0:
                await _changed_or(self._changed, consumer_gone, min(left, RECHECK_SECONDS))
                if consumer_gone.done():
                    break
                taken = await self._take_now(namespace, queues, 1, ttr)
                if taken:
                    return taken
            return []
        finally:
            consumer_gone.cancel()
            self._waiting -= 1

    async def give_back(self, jobs: Sequence[Job]) -> None:
        """Return taken jobs that no consumer received: ready again where they were,
        their try not charged (as a worker shutting down returns jobs it did not start)."""
        now = self.now()
        returned = [Finish("returned", job.id, job.fence, now, lane=job.lane) for job in jobs]
        await self.store.job_finish_many(returned)
        self.notify()

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
        jobs = await self.store.job_take(namespace, queue, sum(counts), self.id, ttr, self.now())
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
        self.notify()
        return [handle.id for handle in handles]

    async def _insert_batch(
        self, key: tuple[str, str, int | None], parts: list[tuple[list[str], JobOptions]]
    ) -> list[list[JobHandle]]:
        task, options, limit = key[0], parts[0][1], key[2]
        args = [a for encoded, _ in parts for a in encoded]
        handles = await self.app.enqueue_raw(task, args, options, payload_limit=limit)
        return split(handles, [len(args) for args, _ in parts])

    async def ack(self, namespace: str, queue: str, job_id: int) -> bool:
        """End the job as succeeded (see Store.job_ack); False if it was not there."""
        return await self._acks.submit((namespace, queue), job_id)

    async def _ack_batch(self, key: tuple[str, str], ids: list[int]) -> list[bool]:
        acked = set(await self.store.job_ack(key[0], key[1], ids, self.now()))
        return [job_id in acked for job_id in ids]

    def _ensure_watcher(self) -> None:
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.create_task(self._watch())

    async def _watch(self) -> None:
        """While consumers wait, wake them when another process may have written."""
        while self._waiting:
            try:
                changed = await self.store.wait_for_change(RECHECK_SECONDS)
            except Exception:
                log.exception("watching for new jobs failed")
                await asyncio.sleep(RECHECK_SECONDS)
                continue
            if changed:
                self.notify()
                # A store reports the change again, without waiting, until the next take
                # has looked: let the consumers just woken take first.
                await asyncio.sleep(WAKE_SPACING)


async def _changed_or(changed: asyncio.Event, gone: asyncio.Future[Any], within: float) -> None:
    """Wait until ``changed`` is set, ``gone`` is done, or ``within`` seconds pass."""
    change = asyncio.ensure_future(changed.wait())
    try:
        await asyncio.wait((change, gone), timeout=within, return_when=asyncio.FIRST_COMPLETED)
    finally:
        change.cancel()
