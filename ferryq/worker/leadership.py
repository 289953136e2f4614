"""A duty that one process among many performs: whoever holds its leadership acts.

Every process runs the loop; each round it takes or keeps the leadership (a lease row
on SQLite, an advisory lock on PostgreSQL) and acts only while holding it, so there is
no single point of failure and no extra process to deploy.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import time
from collections.abc import Callable
from typing import Generic, TypeVar

from ferryq.faults import FaultLog
from ferryq.logs import fields
from ferryq.store.base import Store

log = logging.getLogger("ferryq.leadership")
T = TypeVar("T")


class LeaderLoop(abc.ABC, Generic[T]):
    """Every ``interval`` seconds, ``once()``: ``act(now)`` while holding the leadership
    called ``name``, ``idle()`` otherwise."""

    def __init__(
        self,
        store: Store,
        holder: str,
        clock: Callable[[], float],
        name: str,
        *,
        interval: float = 0.5,
        leader_ttl: float = 5.0,
    ) -> None:
        self.store = store
        self.holder = holder
        self.clock = clock
        self.name = name
        self.interval = interval
        self.leader_ttl = leader_ttl
        # Rounds further apart than this (by the monotonic clock) mean the database
        # did not answer in between.
        self.cut_off_after = max(4 * interval, 2.0)
        self._answered_at: float | None = None
        self._faults = FaultLog(log)
        self.leading = False  # as of the last round that reached the database

    @abc.abstractmethod
    async def act(self, now: float) -> T:
        """One round of the duty; called only while holding the leadership."""

    @abc.abstractmethod
    def idle(self) -> T:
        """What a round returns when another process holds the leadership."""

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.once()
            except Exception as exc:
                self._faults.failed(f"{self.name} round", exc)
            else:
                self._faults.succeeded(f"{self.name} round")

    async def once(self) -> T:
        now = self.clock()
        leading = await self.store.leader_acquire(self.name, self.holder, self.leader_ttl, now)
        answered = time.monotonic()
        if self._answered_at is not None and answered - self._answered_at > self.cut_off_after:
            self.reconnected(answered - self._answered_at)
        self._answered_at = answered
        if leading != self.leading:
            self._changed(leading, "acquired" if leading else "lost")
        if leading:
            return await self.act(now)
        return self.idle()

    def reconnected(self, gap: float) -> None:
        """The database answered after ``gap`` seconds without a round: it was down,
        locked or slow, for this process and most likely for every other one."""

    async def leave(self) -> None:
        """Give up the leadership, so another process takes over at once."""
        await self.store.leader_release(self.name, self.holder)
        if self.leading:
            self._changed(False, "released")

    def _changed(self, leading: bool, event: str) -> None:
        self.leading = leading
        said = "is now" if leading else "gave up being" if event == "released" else "is no longer"
        log.info("%s %s the %s leader", self.holder, said, self.name,
                 extra=fields(leadership=self.name, event=event, worker=self.holder))  # fmt: skip
