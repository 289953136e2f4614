"""Batches finished attempts into few writes (group commit).

Finishes accumulate while a write is in flight and go out together in the next one,
so batches grow with load and a lone finish is written at once, with no timer. The
write itself is the producer's cycle (finish and claim in one transaction); this
class owns the buffer and keeps writing until it is empty. A failed write is
retried: a finish is never dropped while the worker runs. Only a stopping worker
whose database stays unreachable gives up, after a bounded wait (``drain``), on
the finishes it could not write; their jobs run again once their leases expire.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from ferryq.store.base import Finish, FinishReport

log = logging.getLogger("ferryq.worker")


class Completer:
    def __init__(
        self,
        on_written: Callable[[list[Finish], FinishReport], None],
        max_batch: int = 2000,
    ) -> None:
        self._on_written = on_written
        self._max_batch = max_batch
        self._pending: list[Finish] = []
        self._in_flight = 0
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._closing = False
        self._flush: Callable[[], Awaitable[object]] | None = None
        self.writes = 0  # batches written so far: lets a burst know nothing changed

    def bind(self, flush: Callable[[], Awaitable[object]]) -> None:
        """``flush`` takes the pending finishes (``take``) and writes them."""
        self._flush = flush

    @property
    def backlog(self) -> int:
        return len(self._pending) + self._in_flight

    @property
    def pending(self) -> list[Finish]:
        """The finishes not written yet (those of a write in flight excepted)."""
        return list(self._pending)

    def add(self, finish: Finish) -> None:
        self._pending.append(finish)
        self._idle.clear()
        self._wake.set()

    def take(self) -> list[Finish]:
        batch = self._pending[: self._max_batch]
        del self._pending[: len(batch)]
        self._in_flight += len(batch)
        return batch

    def restore(self, batch: list[Finish]) -> None:
        """Put back a batch whose write failed, ahead of newer finishes."""
        self._in_flight -= len(batch)
        self._pending[:0] = batch

    def written(self, batch: list[Finish], report: FinishReport) -> None:
        self._in_flight -= len(batch)
        if batch:
            self.writes += 1
            self._on_written(batch, report)
        if not self.backlog:
            self._idle.set()

    async def run(self) -> None:
        assert self._flush is not None, "bind() a flush before run()"
        delay = 0.05
        while True:
            if not self._pending:
                if self._closing and not self._in_flight:
                    return
                await self._wake.wait()
                self._wake.clear()
                continue
            try:
                await self._flush()
            except Exception:
                log.exception("writing %d completion(s) failed; retrying in %.2f s",
                              len(self._pending), delay)  # fmt: skip
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            delay = 0.05

    async def drain(self, within: float) -> None:
        """Write everything pending, then let ``run`` return; or give up after
        ``within`` seconds, when ``run`` is to be cancelled (a write cut off puts its
        batch back in ``pending``)."""
        self._closing = True
        self._wake.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), within)
