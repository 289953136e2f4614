"""Claims jobs for free slots and starts their attempts.

It claims only what free slots (plus a small prefetch) can take, in batches, and
between claims waits for a sign that the database changed, the next due time, or a
slot freeing up, whichever comes first: there is no busy polling of queries. Each
claim also writes the finishes waiting in the completer, in the same transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import operator
from collections.abc import Callable, Sequence

from ferryq.faults import MAX_BACKOFF, FaultLog
from ferryq.store.base import Claimed, CycleHalfDone, Store
from ferryq.turns import Turn, Turns
from ferryq.worker.completer import Completer
from ferryq.worker.executor import Attempt

log = logging.getLogger("ferryq.worker")

#: The order claimed jobs start in: their order time, then their id.
_in_order = operator.attrgetter("order_time", "id")


class Producer:
    def __init__(
        self,
        store: Store,
        completer: Completer,
        *,
        namespace: str,
        queues: Sequence[str],
        worker_id: str,
        capacity: int,
        batch: int,
        clock: Callable[[], float],
        start: Callable[[list[Claimed]], None],
        active: dict[int, Attempt],
        max_idle: float = 1.0,
    ) -> None:
        self.store = store
        self.completer = completer
        self.namespace = namespace
        self.queues = list(queues)
        self.worker_id = worker_id
        self.capacity = capacity
        self.batch = batch
        self.clock = clock
        self.start = start
        self.active = active
        self.max_idle = max_idle
        self.slot_freed = asyncio.Event()
        self.stopping = asyncio.Event()
        # Two cycles may be in flight (the completer's and the claim loop's), so the
        # database works on one batch while the next is gathered; slots a cycle may
        # fill are reserved until its jobs have started. Their jobs start in the order
        # the cycles began, whichever answers first (``_turn``): on PostgreSQL the
        # later cycle skips the rows the earlier one locked, so it holds later jobs.
        self._cycles = asyncio.Semaphore(2)
        self._reserved = 0
        self._starts = Turns()  # each cycle's, in the order the cycles began
        self.faults = FaultLog(log)

    async def cycle(self) -> int:
        """Write pending finishes and claim for free slots; return the number claimed."""
        async with self._cycles:
            finishes = self.completer.take()
            free = self.capacity - len(self.active) - self._reserved
            stop_claiming = self.stopping.is_set() or self.completer.in_doubt
            limit = 0 if stop_claiming else max(0, min(free, self.batch))
            if not finishes and not limit:
                return 0
            self._reserved += limit
            turn = self._starts.take()
            try:
                report, claimed = await self.store.job_finish_and_claim(
                    finishes, self.namespace, self.queues, limit, self.worker_id, self.clock()
                )
            except CycleHalfDone as exc:
                # Finishes that were written are never sent again (they would read as
                # stale); jobs that were claimed still run.
                self._reserved -= limit
                if exc.report is not None:
                    self.completer.written(finishes, exc.report)
                else:
                    self.completer.restore(finishes, exc.__cause__ or exc, alone=True)
                await self._start_in_turn(exc.claimed, turn)
                raise
            except BaseException as exc:
                self._reserved -= limit
                turn.pass_on()
                self.completer.restore(finishes, exc, alone=not limit)
                raise
            self._reserved -= limit
            self.completer.written(finishes, report)
            await self._start_in_turn(claimed, turn)
            return len(claimed)

    async def _start_in_turn(self, claimed: list[Claimed], turn: Turn) -> None:
        """Start ``claimed`` in order, once the cycle before has started its own."""
        if not claimed:
            turn.pass_on()
            return
        try:
            await turn.wait()
            self.start(sorted(claimed, key=_in_order))
        finally:
            turn.end()

    async def run(self, burst: bool) -> None:
        delay = 0.05
        while not self.stopping.is_set():
            # Cleared before looking, so a slot freed from here on wakes the wait below.
            self.slot_freed.clear()
            if self.capacity - len(self.active) <= 0 or self.completer.in_doubt:
                await self._wait(self.max_idle, watch_db=False)  # a slot, or a write
                continue
            writes_before_claim = self.completer.writes
            try:
                claimed = await self.cycle()
                if not claimed:
                    now = self.clock()
                    next_due = await self.store.job_next_due(self.namespace, self.queues)
            except Exception as exc:
                self.faults.failed("claiming jobs", exc, retry_in=delay)
                await self._wait(delay, watch_db=False)
                delay = min(delay * 2, MAX_BACKOFF)
                continue
            self.faults.succeeded("claiming jobs")
            delay = 0.05
            if claimed:
                continue
            if burst and (next_due is None or next_due > now):
                # Done only if nothing was in flight and no write landed since the
                # claim began: a retry written meanwhile may be due already.
                settled = not self.active and self.completer.backlog == 0
                if settled and self.completer.writes == writes_before_claim:
                    return
                await self._wait(self.max_idle, watch_db=False)
                continue
            due_in = self.max_idle if next_due is None else next_due - now
            await self._wait(max(0.0, min(due_in, self.max_idle)), watch_db=True)

    async def _wait(self, within: float, *, watch_db: bool) -> None:
        """Until a slot frees, stop, ``within`` seconds, or (``watch_db``) a write."""
        waiters: list[asyncio.Future[bool]] = [
            asyncio.ensure_future(self.slot_freed.wait()),
            asyncio.ensure_future(self.stopping.wait()),
        ]
        if watch_db:
            waiters.append(asyncio.ensure_future(self.store.wait_for_change(within)))
        try:
            await asyncio.wait(waiters, timeout=within, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await waiter
