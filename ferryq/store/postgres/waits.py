"""Waiting for other connections' writes on PostgreSQL: LISTEN on a connection of its
own. An enqueue sends a NOTIFY per queue (``ferryq_jobs``) that wakes idle workers,
and a batch of finishes that ends jobs one (``ferryq_done``) that wakes result
waiters. While the listening connection is down, waits sleep their time out (the
caller's own timeout polls), and the connection is made again in the background.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import asyncpg

from ferryq.faults import FaultLog
from ferryq.store.postgres.connection import Conn

log = logging.getLogger("ferryq.store.postgres")
JOBS_CHANNEL, DONE_CHANNEL = "ferryq_jobs", "ferryq_done"


class Waits:
    """The waits of one store: for a change since its last claim, for a finish."""

    def __init__(self, url: str) -> None:
        self._url = url
        self.listener: Listener | None = None

    async def claiming(self) -> None:
        """A claim (or take) is about to run: what is enqueued from here on ends the
        next ``wait_for_change``."""
        if (listener := await self.listening()) is not None:
            listener.jobs.clear()

    async def wait_for_change(self, within: float) -> bool:
        listener = await self.listening()
        if listener is None:  # no notifications right now: the caller's timeout polls
            await asyncio.sleep(within)
            return False
        return await _wait(listener.jobs, within)

    async def wait_for_finish(self, within: float, poll: float) -> None:
        listener = await self.listening()
        if listener is None:
            await asyncio.sleep(min(poll, within))
            return
        await _wait(listener.done, min(within, 1.0))
        listener.done.clear()

    async def listening(self) -> Listener | None:
        if self.listener is None:
            self.listener = Listener(self._url)
        return self.listener if await self.listener.ready() else None

    async def close(self) -> None:
        if self.listener is not None:
            await self.listener.close()
            self.listener = None

    def terminate(self) -> None:
        listener, self.listener = self.listener, None
        if listener is not None and listener.conn is not None:
            # Its event loop may be gone already: closing is then best effort.
            with contextlib.suppress(RuntimeError):
                listener.conn.terminate()


async def _wait(event: asyncio.Event, within: float) -> bool:
    try:
        async with asyncio.timeout(within):
            await event.wait()
        return True
    except TimeoutError:
        return False


class Listener:
    """A connection that LISTENs, re-established in the background when it drops."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.jobs = asyncio.Event()
        self.done = asyncio.Event()
        self.conn: Conn | None = None
        self._retry_at = 0.0
        self._connecting = asyncio.Lock()
        self._faults = FaultLog(log)

    async def ready(self) -> bool:
        if self.conn is not None and not self.conn.is_closed():
            self._faults.succeeded("LISTEN for wake-ups (polling meanwhile)")
            return True
        async with self._connecting:  # one connection, however many callers ask at once
            return await self._connect()

    async def _connect(self) -> bool:
        if self.conn is not None and not self.conn.is_closed():
            return True
        if time.monotonic() < self._retry_at:
            return False
        try:
            # Once connected, close() sees the connection, even if we are cancelled.
            self.conn = await asyncpg.connect(self.url)
            try:
                # A server shutting down may accept the connection and then end it here.
                await self.conn.add_listener(JOBS_CHANNEL, self._on_jobs)
                await self.conn.add_listener(DONE_CHANNEL, self._on_done)
            except asyncio.CancelledError:
                # A wait cancelled here would leave a connection that listens to
                # nothing, taken for a listening one from then on: none is better.
                conn, self.conn = self.conn, None
                conn.terminate()
                raise
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            await self.close()
            self._faults.failed("LISTEN for wake-ups (polling meanwhile)", exc)
            self._retry_at = time.monotonic() + 1.0
            return False
        self._faults.succeeded("LISTEN for wake-ups (polling meanwhile)")
        self.jobs.set()  # anything may have happened while we were not listening
        self.done.set()
        return True

    def _on_jobs(self, *_: object) -> None:
        self.jobs.set()

    def _on_done(self, *_: object) -> None:
        self.done.set()

    async def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()
