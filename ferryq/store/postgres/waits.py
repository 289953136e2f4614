"""Waiting for other connections' writes on PostgreSQL: LISTEN on a connection of its
own. An enqueue sends a NOTIFY per queue (``ferryq_jobs``) that wakes idle workers,
and a batch of finishes that ends jobs one (``ferryq_done``) that wakes result
waiters. While the listening connection is down, waits sleep their time out (the
caller's own timeout polls), and the connection is made again in the background.

Behind a transaction pooler LISTEN has no session to live in: it runs on the direct
URL when one is given, and otherwise the waits poll the server (``Poller``).

The listening connection is the store's one session of its own on the server
(``Waits.session``): leadership holds its advisory locks there too
(ferryq.store.postgres.maintenance), so that a worker spends one connection on both.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator

import asyncpg

from ferryq.errors import StoreError
from ferryq.faults import FaultLog
from ferryq.store import safe_url
from ferryq.store.postgres.connection import Conn, Database, refuses_a_connection

log = logging.getLogger("ferryq.store.postgres")
JOBS_CHANNEL, DONE_CHANNEL = "ferryq_jobs", "ferryq_done"
#: Without LISTEN, how often the waits look at the server for a transaction that wrote
#: and ended (``Poller``): a job enqueued elsewhere is picked up half of it later on
#: the median, plus the claim. Through PgBouncer on a busy 2-core machine (load 7-11),
#: jobs enqueued 0.2-0.5 s apart to an idle worker: every 0.05 s, pickup p50 31-66 ms
#: and an idle worker 2.2-3.6% of a core; every 0.1 s, p50 54-70 ms and 1.8-2.7%
#: (with LISTEN on a direct URL, 0.6-1.4%; the default mode, direct, 0.4-0.9%).
POLL_SECONDS = 0.1
#: The polling stops once nobody has waited (or claimed) for this long, and starts
#: again at the next wait: an App that waited for one result does not poll forever.
POLL_UNTIL_IDLE = 5.0


class Waits:
    """The waits of one store: for a change since its last claim, for a finish.
    ``url``: where to LISTEN; None to poll through ``db`` instead."""

    def __init__(self, url: str | None, db: Database) -> None:
        self._url = url
        self._db = db
        self.listener: Listener | Poller | None = None

    async def claiming(self) -> None:
        """A claim (or take) is about to run: what is enqueued from here on ends the
        next ``wait_for_change``."""
        if (listener := await self.listening()) is not None:
            await listener.claiming()

    async def wait_for_change(self, within: float) -> bool:
        listener = await self.listening()
        if listener is None:  # no notifications right now: the caller's timeout polls
            await asyncio.sleep(within)
            return False
        with listener.watching():
            return await _wait(listener.jobs, within)

    async def wait_for_finish(self, within: float, poll: float) -> None:
        listener = await self.listening()
        if listener is None:
            await asyncio.sleep(min(poll, within))
            return
        with listener.watching():
            await _wait(listener.done, min(within, 1.0))
        listener.done.clear()

    async def session(self) -> Conn:
        """The listening connection, for the session state of this store's own that must
        live as long as it (leadership's advisory locks); a StoreError while it is down.
        The caller runs one statement at a time on it, and nothing else does."""
        listener = await self.listening()
        if not isinstance(listener, Listener) or listener.conn is None:
            raise StoreError("no connection to PostgreSQL to listen and lead on right now")
        return listener.conn

    async def reserve(self) -> None:
        """The listening connection, opened now (a worker's start): a StoreError if the
        server refuses it, naming the budget where that is why."""
        if self._url is None:
            return
        listener = await self.listening()
        error = self.listener.error if isinstance(self.listener, Listener) else None
        if listener is None and error is not None:
            if refuses_a_connection(error):
                raise self._db.budget.refused(safe_url(self._url), error) from error
            raise StoreError(
                f"cannot connect to PostgreSQL at {safe_url(self._url)} to listen: {error}"
            ) from error

    async def listening(self) -> Listener | Poller | None:
        if self.listener is None:
            self.listener = Listener(self._url) if self._url is not None else Poller(self._db)
        return self.listener if await self.listener.ready() else None

    async def close(self) -> None:
        if self.listener is not None:
            await self.listener.close()
            self.listener = None

    def terminate(self) -> None:
        listener, self.listener = self.listener, None
        if isinstance(listener, Poller):
            listener.stop()
        elif listener is not None and listener.conn is not None:
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
        self.error: BaseException | None = None  # why the last connect failed
        self._listens_on: Conn | None = None  # the connection whose LISTENs are sent
        self._retry_at = 0.0
        self._connecting = asyncio.Lock()
        self._faults = FaultLog(log)

    async def ready(self) -> bool:
        if self._listening():
            self._faults.succeeded("LISTEN for wake-ups (polling meanwhile)")
            return True
        async with self._connecting:  # one connection, however many callers ask at once
            return await self._connect()

    def _listening(self) -> bool:
        """Connected, and its LISTENs sent: another may use it from then on."""
        conn = self.conn
        if conn is None:
            return False
        return not conn.is_closed() and conn is self._listens_on

    async def _connect(self) -> bool:
        if self._listening():
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
                self._listens_on = self.conn
            except asyncio.CancelledError:
                # A wait cancelled here would leave a connection that listens to
                # nothing, taken for a listening one from then on: none is better.
                conn, self.conn = self.conn, None
                conn.terminate()
                raise
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            await self.close()
            self.error = exc
            self._faults.failed("LISTEN for wake-ups (polling meanwhile)", exc)
            self._retry_at = time.monotonic() + 1.0
            return False
        self.error = None
        self._faults.succeeded("LISTEN for wake-ups (polling meanwhile)")
        self.jobs.set()  # anything may have happened while we were not listening
        self.done.set()
        return True

    def watching(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    async def claiming(self) -> None:
        self.jobs.clear()

    def _on_jobs(self, *_: object) -> None:
        self.jobs.set()

    def _on_done(self, *_: object) -> None:
        self.done.set()

    async def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()


class Poller:
    """The events of a ``Listener``, from polling: every POLL_SECONDS while someone
    waits, it reads the server's snapshot (``pg_current_snapshot()``: the transactions
    in progress, and the next to be given an id). Any transaction that wrote and ended
    since the last look changes it, so the change is commit-exact, like SQLite's
    ``data_version``: an enqueue committed after a claim began is never missed. Any
    write counts (the leader's lease, another database's), so a busy server wakes the
    waits more often than needed; they then claim nothing, as after a NOTIFY for a
    queue of another worker's.

    The look is one simple query (COPY … TO STDOUT: asyncpg reads rows of a plain
    SELECT only through the extended protocol, two round trips that a transaction
    pooler keeps together only inside a transaction, two round trips more).
    """

    def __init__(self, db: Database) -> None:
        self._db = db
        self.jobs = asyncio.Event()
        self.done = asyncio.Event()
        self._seen: bytes | None = None
        self._task: asyncio.Task[None] | None = None
        self._wanted_at = time.monotonic()
        self._watching = 0  # waits under way
        self._faults = FaultLog(log)

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        """Around a wait: the polling goes on while it lasts."""
        self._watching += 1
        try:
            yield
        finally:
            self._watching -= 1
            self._wanted_at = time.monotonic()

    async def ready(self) -> bool:
        self._wanted_at = time.monotonic()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._poll())
        return True

    async def claiming(self) -> None:
        """The first claim looks at the server first, so that the first poll after it
        compares with what the claim saw (else a first look wakes the waits at once)."""
        if self._seen is None:
            with contextlib.suppress(Exception):  # the polls say what is wrong
                self._seen = await self._look()
        self.jobs.clear()

    async def _look(self) -> bytes:
        return await self._db.session(_snapshot, transaction=False)

    async def _poll(self) -> None:
        while self._watching or time.monotonic() - self._wanted_at < POLL_UNTIL_IDLE:
            try:
                snapshot = await self._look()
            except Exception as exc:  # the waits time out meanwhile: the callers poll
                self._faults.failed("polling for wake-ups", exc)
                await asyncio.sleep(1.0)
                continue
            self._faults.succeeded("polling for wake-ups")
            if snapshot != self._seen:
                self._seen = snapshot
                self.jobs.set()
                self.done.set()
            await asyncio.sleep(POLL_SECONDS)

    def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            # Its event loop may be gone already: stopping is then best effort.
            with contextlib.suppress(RuntimeError):
                task.cancel()

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


async def _snapshot(conn: Conn) -> bytes:
    out = bytearray()

    async def keep(data: bytes) -> None:
        out.extend(data)

    await conn.copy_from_query("SELECT pg_current_snapshot()", output=keep)
    return bytes(out)
