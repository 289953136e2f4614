"""The wake-up NOTIFYs of a store's enqueues: at most one per queue per NOTIFY_EVERY.

An enqueue's NOTIFY (``ferryq_jobs``, the queue's name) wakes idle workers at its
commit. PostgreSQL serializes the commits of transactions that notified, server-wide:
one lock, held through the commit's flush. With 8 processes enqueuing one job per
call on durable settings, the NOTIFY on every call cost a fifth of the calls
(bench/producers.py). Within a burst of enqueues one NOTIFY per queue says all the
others would, so a store sends one per queue at most every NOTIFY_EVERY:

- an enqueue into a queue not notified for NOTIFY_EVERY notifies at its commit, as
  before (an enqueue now and then wakes a worker as at once as ever);
- one into a queue notified more recently does not; once it has committed, the queue
  is owed a NOTIFY, sent on its own NOTIFY_EVERY after the last one.

So every committed enqueue is followed by a NOTIFY of its queue committed after it,
within NOTIFY_EVERY: the wake-up guarantee holds, a burst's later jobs wait at most
that much longer for an idle worker, and a busy worker claims them anyway. A store
closing sends what it owes first. An owed NOTIFY that cannot be sent (the server
gone) is tried again until the store closes; the workers' own fallback looks at the
queue (their waits' timeout) cover what it would have woken.

Enqueues on the application's own connection (ferryq.store.postgres.external)
notify at every commit: the store does not see when that commit happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Collection

from ferryq.faults import FaultLog
from ferryq.store.postgres.connection import Conn, Database

log = logging.getLogger("ferryq.store.postgres")
#: A store's least time between two NOTIFYs of one queue (see the module's text).
#: 8 producer processes, one job per call, durable PostgreSQL (bench/producers.py,
#: medians of 5 rounds on 2 quiet cores): every 50 ms, 2,150 calls/s; a NOTIFY each,
#: 1,926; none, 2,586. Every 10 ms gained little (1,413 against 1,340 and 1,769 in a
#: run of its own, the machine busy): the owed NOTIFYs, a transaction each, came about
#: as often as the calls' had.
NOTIFY_EVERY = 0.05
NOTIFY_OWED = "SELECT pg_notify('ferryq_jobs', q) FROM unnest($1::text[]) AS q"
#: After an owed NOTIFY failed, the next try.
RETRY_SECONDS = 1.0
#: The longest a closing store tries to send what it owes.
CLOSE_SECONDS = 1.0


class Notices:
    """Which enqueues of one store notify, and the NOTIFYs owed for those that did
    not. Its calls may come from any thread (a sync enqueue inserts on its own)."""

    def __init__(self, db: Database, clock: Callable[[], float] = time.monotonic) -> None:
        self._db = db
        self.clock = clock
        self._last: dict[str, float] = {}  # queue → when its last NOTIFY was decided
        self._owed: set[str] = set()
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sending: asyncio.Task[None] | None = None
        self._faults = FaultLog(log)

    def open(self) -> None:
        """On the store's event loop, where owed NOTIFYs are sent."""
        self._loop = asyncio.get_running_loop()

    def wanted(self, queues: Collection[str]) -> bool:
        """Whether an enqueue into ``queues`` notifies: unless each of them was
        notified less than NOTIFY_EVERY ago. If it does, they count as notified now.
        One that does not calls ``owe`` once committed."""
        now = self.clock()
        with self._lock:
            last = self._last
            if all(now - last.get(queue, -NOTIFY_EVERY) < NOTIFY_EVERY for queue in queues):
                return False
            for queue in queues:
                last[queue] = now
            return True

    def deciding(self, queues: Collection[str]) -> Notice:
        """Around an enqueue into ``queues`` (``with``): whether it notifies (``wanted``);
        if not, the NOTIFY owed as it ends, however it ends: one whose outcome is not
        known may have committed, and a NOTIFY too many costs a look."""
        return Notice(self, queues, self.wanted(queues))

    def forget(self, queues: Collection[str]) -> None:
        """``queues`` count as not notified: a NOTIFY decided for an enqueue that was
        not sent after all."""
        with self._lock:
            for queue in queues:
                self._last.pop(queue, None)

    def owe(self, queues: Collection[str]) -> None:
        """An enqueue into ``queues`` that did not notify has committed: a NOTIFY of
        each follows, NOTIFY_EVERY after its last one."""
        with self._lock:
            self._owed.update(queues)
            if self._sending is not None or self._loop is None:
                return
            loop = self._loop
        if _running_loop() is loop:
            self._start()
        else:
            with contextlib.suppress(RuntimeError):  # the loop is gone: the store closed
                loop.call_soon_threadsafe(self._start)

    async def close(self) -> None:
        """What is owed is sent now; then nothing more is."""
        task, self._sending = self._sending, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        with self._lock:
            queues, self._owed = sorted(self._owed), set()
            self._loop = None
        if queues:
            # The store is closing: best effort, and quickly (a session would ride out
            # an outage for half a minute; the workers' own looks find the jobs).
            with contextlib.suppress(Exception):
                async with asyncio.timeout(CLOSE_SECONDS):
                    await self._db.session(_notify, queues, transaction=False)

    def terminate(self) -> None:
        task, self._sending, self._loop = self._sending, None, None
        if task is not None:
            with contextlib.suppress(RuntimeError):  # its event loop may be gone
                task.cancel()

    def _start(self) -> None:
        with self._lock:
            if self._sending is None and self._loop is not None:
                self._sending = self._loop.create_task(self._send_owed())

    async def _send_owed(self) -> None:
        try:
            while True:
                with self._lock:
                    if not self._owed:
                        self._sending = None
                        return
                    due = min(self._last.get(queue, 0.0) for queue in self._owed) + NOTIFY_EVERY
                if (delay := due - self.clock()) > 0:
                    await asyncio.sleep(delay)
                with self._lock:
                    queues, self._owed = sorted(self._owed), set()
                    now = self.clock()
                    for queue in queues:
                        self._last[queue] = now
                try:
                    await self._db.session(_notify, queues, transaction=False)
                except BaseException as exc:  # still owed (a closing store sends them)
                    with self._lock:
                        self._owed.update(queues)
                    if not isinstance(exc, Exception):
                        raise
                    self._faults.failed("sending enqueues' wake-ups", exc)
                    await asyncio.sleep(RETRY_SECONDS)
                    continue
                self._faults.succeeded("sending enqueues' wake-ups")
        except BaseException:
            with self._lock:
                if self._sending is asyncio.current_task():
                    self._sending = None
            raise


class Notice:
    """One enqueue's part in its queues' NOTIFYs (``Notices.deciding``)."""

    def __init__(self, notices: Notices, queues: Collection[str], notify: bool) -> None:
        self.notices = notices
        self.queues = queues
        #: Whether the enqueue sends the NOTIFY itself.
        self.notify = notify
        self._withdrawn = False

    def withdraw(self) -> None:
        """The enqueue did not happen here (it is made again elsewhere, deciding anew)."""
        self._withdrawn = True
        if self.notify:
            self.notices.forget(self.queues)

    def __enter__(self) -> Notice:
        return self

    def __exit__(self, *_: object) -> None:
        if not self.notify and not self._withdrawn:
            self.notices.owe(self.queues)


async def _notify(conn: Conn, queues: list[str]) -> None:
    await conn.execute(NOTIFY_OWED, queues)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
