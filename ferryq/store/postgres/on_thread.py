"""A sync enqueue's own connection: the caller's thread inserts, without the event loop.

A sync call (``task.enqueue()`` in a web request's thread) that went through the
store's event loop would pay two thread switches on top of the insert, a third of
the call here. So a call that finds no other enqueue under way inserts on its own
thread, on one psycopg connection kept for that (with generic plans, as the
enqueues' pool has). Calls that find it busy, or a thread whose connection cannot be
had (psycopg not installed, the server out of reach, a URL libpq does not read), go
through the event loop, which commits them together and rides out outages.

A connection lost before the insert was sent costs nothing: the call goes through
the loop. One lost while it ran leaves the insert's outcome unknown, so the call
fails with StoreError, as it would on the loop (an enqueue is not run twice).

Behind a pooler the settings cannot go in the startup packet: a session pooler's
connection gets them by ``SET`` once connected; behind a transaction pooler psycopg
prepares no statement (its ``prepare_threshold``), and an insert runs in a transaction
begun as the store's are (``begin``), but for a plain job's when the URL sets nothing
of its own: that one statement goes alone, in one round trip (psycopg sends its
Parse, Bind and Execute together), its own transaction, where ferryq's settings have
nothing to do (against three round trips in a transaction: ``bench/pooled.py``).
"""

from __future__ import annotations

import logging
import select
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from ferryq.errors import StoreError
from ferryq.faults import one_line
from ferryq.store.base import Inserted, NewJob
from ferryq.store.flows import drive
from ferryq.store.postgres.pooler import set_statements
from ferryq.store.postgres.queries import Statement

log = logging.getLogger("ferryq.store.postgres")
Run = Callable[[Statement, dict[str, Any]], Coroutine[Any, Any, list[Any]]]
Insert = Callable[[Run, NewJob, Sequence[str], bool], Coroutine[Any, Any, list[Inserted]]]
#: After a connection could not be made, the loop takes every call this long.
RETRY_CONNECT = 1.0
#: Seconds a call waits for the connection before it goes through the loop instead
#: (a server that does not answer, rather than refuses).
CONNECT_TIMEOUT = 5


class ThreadInserts:
    """One connection for sync enqueues, used by one thread at a time."""

    def __init__(
        self, url: str, safe_url: str, settings: dict[str, str], insert: Insert, *,
        pooled: bool = False, begin: str | None = None, alone: bool = False,
    ) -> None:  # fmt: skip
        self._url, self._safe_url = url, safe_url
        self._options = " ".join(f"-c {name}={value}" for name, value in settings.items())
        self._pooled = pooled  # behind a pooler: settings by SET, or in ``begin``
        self._set = set_statements(settings)
        self._begin = begin
        self._alone = alone  # a one-statement insert needs no transaction (see above)
        self._insert = insert
        self._lock = threading.Lock()
        self._conn: Any = None
        self._closed = False
        self._next_connect = 0.0

    def insert(self, job: NewJob, args: Sequence[str], notify: bool) -> list[Inserted] | None:
        """The jobs' ids, or None when this thread cannot insert now: the connection
        is in use by another thread, or cannot be had. ``notify``: the insert sends
        its queue's wake-up."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            conn = self._connection()
            if conn is None:
                return None
            return self._run(conn, job, args, notify)
        finally:
            if self._closed:
                self._drop()
            self._lock.release()

    def close(self) -> None:
        """Never waits (it may run on an event loop): a thread inserting now drops
        the connection as it ends."""
        self._closed = True
        if self._lock.acquire(blocking=False):
            try:
                self._drop()
            finally:
                self._lock.release()

    def _connection(self) -> Any:
        conn = self._conn
        if conn is not None and not conn.closed and not conn.broken and not _hung_up(conn):
            return conn
        self._drop()
        if self._closed or time.monotonic() < self._next_connect:
            return None
        try:
            import psycopg
        except ImportError:  # optional: ferryq[postgres] brings it
            self._next_connect = float("inf")
            return None
        try:
            self._conn = self._connect(psycopg)
        except Exception as exc:  # the loop's pool says what is wrong, and waits
            self._next_connect = time.monotonic() + RETRY_CONNECT
            log.debug("no connection of its own for sync enqueues (%s): %s",
                      self._safe_url, one_line(exc))  # fmt: skip
            return None
        return self._conn

    def _connect(self, psycopg: Any) -> Any:
        if self._pooled:
            conn = psycopg.connect(self._url, autocommit=True, prepare_threshold=None,
                                   connect_timeout=CONNECT_TIMEOUT)  # fmt: skip
            if self._begin is None:  # a session pooler: the session keeps them
                conn.execute(self._set)
            return conn
        # Options the URL gives (a search_path…) apply here as they do on asyncpg's
        # connections: ours are added to them, not put in their place.
        given = psycopg.conninfo.conninfo_to_dict(self._url).get("options") or ""
        options = f"{given} {self._options}".strip()
        return psycopg.connect(self._url, autocommit=True, options=options,
                               connect_timeout=CONNECT_TIMEOUT)  # fmt: skip

    def _run(self, conn: Any, job: NewJob, args: Sequence[str], notify: bool) -> list[Inserted]:
        import psycopg

        async def run(statement: Statement, params: dict[str, Any]) -> list[Any]:
            cursor = conn.execute(statement.pyformat, params)
            return list(cursor.fetchall()) if cursor.description else []

        try:
            one_statement = job.lane is None and job.unique_key is None and not job.after
            if self._begin is None or (self._alone and one_statement):
                return drive(self._insert(run, job, args, notify))
            conn.execute(self._begin)
            try:
                inserted = drive(self._insert(run, job, args, notify))
            except BaseException:
                if not conn.broken:
                    conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return inserted
        except psycopg.OperationalError as exc:
            if not conn.broken:
                raise  # the server's refusal (a lock timeout, a full disk…)
            self._drop()
            raise StoreError(
                f"lost the connection to PostgreSQL at {self._safe_url}: {one_line(exc)}"
            ) from exc

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # a broken connection has nothing to say
                log.debug("closing a broken connection", exc_info=True)


def _hung_up(conn: Any) -> bool:
    """Whether the server sent something to an idle connection: the end of the
    session, as a restart or an administrator leaves it. Looked at before the insert
    is sent, so that a connection found dead costs a reconnect, not the call."""
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)
