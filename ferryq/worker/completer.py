"""Batches finished attempts into few writes (group commit).

Finishes accumulate while a write is in flight and go out together in the next one,
so batches grow with load and a lone finish is written at once, with no timer.
A failed write is retried; a finish is never dropped.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from ferryq.store.base import Finish, FinishReport, Store

log = logging.getLogger("ferryq.worker")


class Completer:
    def __init__(
        self,
        store: Store,
        on_written: Callable[[list[Finish], FinishReport], None],
        max_batch: int = 2000,
    ) -> None:
        self._store = store
        self._on_written = on_written
        self._max_batch = max_batch
        self._pending: list[Finish] = []
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._closing = False
        self.writes = 0  # batches written so far: lets a burst know nothing changed

    @property
    def backlog(self) -> int:
        return len(self._pending)

    def add(self, finish: Finish) -> None:
        self._pending.append(finish)
        self._idle.clear()
        self._wake.set()

    async def run(self) -> None:
        delay = 0.05
        while True:
            if not self._pending:
                self._idle.set()
                if self._closing:
                    return
                await self._wake.wait()
                self._wake.clear()
                continue
            batch = self._pending[: self._max_batch]
            try:
                report = await self._store.job_finish_many(batch)
            except Exception:
                log.exception(
                    "writing %d completion(s) failed; retrying in %.2f s", len(batch), delay
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            delay = 0.05
            del self._pending[: len(batch)]
            self.writes += 1
            self._on_written(batch, report)

    async def drain(self) -> None:
        """Write everything pending, then let ``run`` return."""
        self._closing = True
        self._wake.set()
        await self._idle.wait()
