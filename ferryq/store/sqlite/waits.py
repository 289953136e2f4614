"""Waiting for other connections' writes on SQLite: the store's waits.

A store learns that another connection wrote from ``PRAGMA data_version`` on a
connection of its own (the database's ``watch``): a few microseconds, no lock, no
disk. With a bell (ferryq.store.sqlite.wake) the version is looked at when a writer
rings and every ``wake.SAFETY_POLL`` seconds; where there is none it is polled, after
pauses that grow from 0.5 ms to BUSY_POLL, and, for a patient wait (an HTTP
server's), every IDLE_POLL while the database is not busy.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable

from ferryq.store.sqlite import wake
from ferryq.store.sqlite.connection import Database

#: Where a store has no wake-ups, its waits check ``PRAGMA data_version`` at most
#: every BUSY_POLL seconds while the database is busy (it changed twice in the last
#: BUSY_FOR seconds), else every IDLE_POLL seconds: a process at work hears of the
#: next write within ms, an idle one costs little (a lone write now and then, such as
#: a maintenance leader's, does not count as busy).
BUSY_POLL, BUSY_FOR, IDLE_POLL = 0.005, 0.25, 0.05


class Waits:
    """The waits of one store: for a change since its last claim, for a finish."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._claim_version = -1
        self._finish_version = -1  # data_version when wait_for_finish last returned
        self._seen_version = -1
        self._changes = (float("-inf"), float("-inf"))  # when the last two changes were seen
        # This store's bell is made by its first wait (see _bell_here).
        self._bell: wake.Bell | None = None
        self._bell_tried = False
        db.on_close = self._forget_bell

    def claiming(self) -> None:
        """A claim (or take) is about to run: what commits from here on ends the next
        ``wait_for_change``."""
        self._claim_version = self.data_version()

    async def wait_for_finish(self, within: float, poll: float) -> None:
        """Until another connection commits (it may have ended a job) after the last
        call returned, or ``poll`` seconds; never longer than ``within``. Callers that
        share the store share that mark, so each still looks within ``poll``."""
        seen = self._finish_version
        await self._version_moves(lambda: seen, min(poll, within))
        self._finish_version = self.data_version()

    async def wait_for_change(self, within: float, *, patient: bool = False) -> bool:
        """Whether another connection wrote since the last claim (or take), within
        ``within`` seconds. Other stores' commits wake the wait; without wake-ups it
        polls ``PRAGMA data_version``: eagerly, or, ``patient``, seldom while the
        database is idle."""
        return await self._version_moves(lambda: self._claim_version, within, patient)

    async def _version_moves(
        self, baseline: Callable[[], int], within: float, patient: bool = True
    ) -> bool:
        """Whether ``data_version`` differs from ``baseline()`` within ``within`` seconds."""
        bell = self._bell_here()
        if bell is not None:
            return await bell.until(lambda: self.data_version() != baseline(), within)
        deadline = time.monotonic() + within
        pause = 0.0005
        while True:
            if self.data_version() != baseline():
                return True
            now = time.monotonic()
            if now >= deadline:
                return False
            quiet = patient and now - self._changes[0] >= BUSY_FOR
            await asyncio.sleep(min(IDLE_POLL if quiet else pause, deadline - now))
            pause = min(pause * 1.5, BUSY_POLL)

    def _bell_here(self) -> wake.Bell | None:
        """The store's bell, made by its first wait on that wait's event loop; None
        where it has none (its waits poll) or for a wait on another loop."""
        loop = asyncio.get_running_loop()
        if not self._bell_tried and self._db.watch is not None:
            self._bell_tried = True
            self._bell = wake.Bell.open(self._db.file, loop)
            self._db.notifier.listen(self._bell)
        bell = self._bell
        return bell if bell is not None and bell.loop is loop else None

    def data_version(self) -> int:
        watch = self._db.watch
        if watch is None:
            return -1
        try:
            version = int(watch.execute("PRAGMA data_version").fetchone()[0])
        except sqlite3.OperationalError:
            return -2  # unknown: report a change and let the claim find out
        if version != self._seen_version:
            self._seen_version = version
            self._changes = (self._changes[1], time.monotonic())
        return version

    def _forget_bell(self) -> None:
        """The store closed: its socket goes (a reopened store makes a new one)."""
        bell, self._bell, self._bell_tried = self._bell, None, False
        if bell is not None:
            bell.close()
