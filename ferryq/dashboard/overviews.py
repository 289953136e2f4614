"""The overview of each namespace, kept and recomputed in the background when stale.

Counting a long history is the dashboard's costliest read: seconds for millions of
finished jobs on SQLite. So an overview is reused for at least ``FRESH_SECONDS``, and
for ten times as long as it took to compute; after that, the next request gets it as
it was and starts a recomputation, so pages never wait for one. The very first is
waited for a moment, then the page says it is counting and fetches it again shortly.
It reads through operations on a store of their own (``Operations.reader``): a SQLite
store runs one statement at a time, and a count taking seconds would hold up every API
call made meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from ferryq.ops import Operations
from ferryq.ops.views import Overview

log = logging.getLogger("ferryq.dashboard")

FRESH_SECONDS = 2.0
COST_FACTOR = 10.0  # an overview that took 1 s to compute is reused for 10 s
MAX_KEPT = 100  # namespaces whose overview is kept


@dataclass(slots=True)
class _Entry:
    data: Overview
    computed: float  # monotonic
    took: float

    def stale(self) -> bool:
        return time.monotonic() - self.computed > max(FRESH_SECONDS, COST_FACTOR * self.took)


class Overviews:
    def __init__(self, url: str, clock: Callable[[], float]) -> None:
        self.url = url
        self.clock = clock
        self._ops: Operations | None = None
        self._opening = asyncio.Lock()
        self._entries: dict[str | None, _Entry] = {}
        self._running: dict[str | None, asyncio.Task[None]] = {}

    async def get(self, namespace: str | None, wait: float) -> Overview | None:
        """The namespace's overview (None: all). A stale one starts a recomputation; the
        first one is waited for up to ``wait`` seconds, then None while it is counted."""
        entry = self._entries.get(namespace)
        if entry is None or entry.stale():
            task = self._running.get(namespace)
            if task is None:
                task = self._running[namespace] = asyncio.create_task(self._compute(namespace))
            if entry is None:
                done, _ = await asyncio.wait([task], timeout=wait)
                if not done:
                    return None
                entry = self._entries.get(namespace)
                if entry is None:
                    raise RuntimeError("the overview could not be computed (see the log)")
        return entry.data

    async def _compute(self, namespace: str | None) -> None:
        try:
            began = time.monotonic()
            data = await (await self._reader()).overview(namespace)
            if len(self._entries) >= MAX_KEPT:
                self._entries.clear()
            self._entries[namespace] = _Entry(data, time.monotonic(), time.monotonic() - began)
        except Exception:
            # Nobody may be waiting for this one: say it here. The next request tries again.
            log.exception("computing the dashboard's overview failed")
        finally:
            del self._running[namespace]

    async def _reader(self) -> Operations:
        async with self._opening:
            if self._ops is None:
                self._ops = await Operations.reader(self.url, self.clock)
            return self._ops

    async def close(self) -> None:
        if self._ops is not None:
            await self._ops.close()
            self._ops = None
