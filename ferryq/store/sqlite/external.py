"""Enqueue on the application's own sqlite3 connection, inside its own transaction.

The connection must be to the store's file and in a transaction, or about to begin one
(Python's default: the application's first write begins it): the jobs exist only if
the application commits. With none begun yet, the enqueue begins it (``BEGIN
IMMEDIATE``, which takes the write lock at once), so that what it reads first (a
unique key's job, the dependencies' states) holds until its insert, as in ferryq's own
write transactions. Bad input is refused before anything is written: a closed connection, one to
another file, one in autocommit mode with no transaction open (the jobs would commit
at once, not with the application's rows).

Workers in other processes are woken at the application's commit, which the store
does not see: a ``CommitWatch`` reads ``PRAGMA data_version`` on a connection of its
own, from a thread of its own, from just before the insert returns until the value
moves (some connection committed), then rings the wake-up sockets (ferryq.store.
sqlite.wake). It looks every 0.5 ms at first, less often as time goes on (every 20 ms
from about 50 ms on), for WATCH_SECONDS; past that, or if the transaction was rolled
back, it stops, and the workers' own look every ``wake.SAFETY_POLL`` seconds finds
what a longer transaction commits.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ferryq.errors import ConfigurationError
from ferryq.store.base import Inserted, NewJob
from ferryq.store.sqlite import wake
from ferryq.store.sqlite.inserts import insert_many

T = TypeVar("T")

#: How long a watch looks for the application's commit before leaving it to the
#: workers' own looks.
WATCH_SECONDS = 5.0
FIRST_PAUSE, LONGEST_PAUSE = 0.0005, 0.02


def insert(connection: object, file: Path, job: NewJob, args: Sequence[str]) -> list[Inserted]:
    """Insert the jobs on ``connection``, in its transaction; checked first."""
    if not isinstance(connection, sqlite3.Connection):
        raise ConfigurationError(
            f"cannot enqueue on a {type(connection).__qualname__} into the SQLite file "
            f"{file}: pass a sqlite3 connection to that file"
        )
    _check(connection, file)
    try:
        if not connection.in_transaction:
            connection.execute("BEGIN IMMEDIATE")
        return insert_many(connection, job, args)
    except sqlite3.OperationalError as exc:
        if "no such table" not in str(exc):
            raise
        raise ConfigurationError(
            f"{file} has no ferryq tables yet: run `ferryq migrate`, or open an App or a "
            "worker on it once, before enqueueing on your own connection"
        ) from exc


def is_aiosqlite(connection: object) -> bool:
    return type(connection).__module__.startswith("aiosqlite")


async def on_thread_of(connection: Any, insert: Callable[[sqlite3.Connection], T]) -> T:
    """``insert`` run with an aiosqlite connection's sqlite3 connection, on the thread
    that owns it, in one hop: the check and the insert run as one call there, between
    the application's own calls, as each of aiosqlite's methods runs. aiosqlite has no
    public way to run a function there; its ``_execute``, on which all its methods are
    built and which SQLAlchemy's adapter uses as well (to set isolation_level), is
    it. Running the statements one by one through its public ``execute`` would cost a
    hop each and a second, async, copy of the insert."""
    execute = getattr(connection, "_execute", None)
    if execute is None:
        raise ConfigurationError(
            "this aiosqlite has no Connection._execute: pip install 'aiosqlite>=0.17,<1'"
        )

    def on_its_thread() -> T:
        return insert(connection._conn)

    try:
        result: T = await execute(on_its_thread)
    except ValueError as exc:  # aiosqlite's "Connection closed", "no active connection"
        if "connection" not in str(exc).lower():
            raise
        raise ConfigurationError(f"cannot enqueue on this aiosqlite connection: {exc}") from exc
    return result


def _check(connection: sqlite3.Connection, file: Path) -> None:
    try:
        rows = connection.execute("PRAGMA database_list").fetchall()
    except sqlite3.ProgrammingError as exc:  # closed, or of another thread
        raise ConfigurationError(f"cannot enqueue on this sqlite3 connection: {exc}") from exc
    main = next((row[2] for row in rows if row[1] == "main"), "")
    if not main or not _same_file(main, file):
        raise ConfigurationError(
            f"the sqlite3 connection is to {main or 'a database in memory'}, not to the "
            f"App's file {file}: enqueue on a connection to {file}"
        )
    if not connection.in_transaction and _autocommit(connection):
        raise ConfigurationError(
            "the sqlite3 connection is in autocommit mode with no transaction open: the "
            "jobs would commit at once; begin a transaction first (BEGIN, or "
            "autocommit=False)"
        )


def _same_file(name: str, file: Path) -> bool:
    try:
        return os.path.samefile(name, file)
    except OSError:
        return False


def _autocommit(connection: sqlite3.Connection) -> bool:
    """Python 3.12's ``autocommit=True``, or the legacy ``isolation_level=None``: no
    transaction begins unless the application sends BEGIN."""
    autocommit = getattr(connection, "autocommit", None)
    if autocommit is True:
        return True
    return autocommit is not False and connection.isolation_level is None


class CommitWatch:
    """Rings the waiting stores once a transaction that enqueued commits (see the
    module's text). One thread, started by the first ``written``, for a store's life."""

    def __init__(self, file: Path) -> None:
        self._file = file
        self._lock = threading.Lock()
        self._wanted = threading.Condition(self._lock)
        self._conn: sqlite3.Connection | None = None
        # data_version as the oldest insert not yet watched for returned; and as the
        # latest returned, if one came since the watch under way began.
        self._baseline: int | None = None
        self._later: int | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        self._notifier = wake.Notifier(wake.folder_of(file))

    def written(self) -> None:
        """Jobs were inserted in a transaction still open: watch for its commit."""
        with self._lock:
            if self._closed:
                return
            if self._conn is None:
                self._conn = sqlite3.connect(self._file, check_same_thread=False)
            version = self._version()
            if self._baseline is None:
                self._baseline = version
            else:
                self._later = version
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="ferryq-commit-watch", daemon=True
                )
                self._thread.start()
            self._wanted.notify()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._wanted.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
        self._notifier.close()

    def _version(self) -> int:
        assert self._conn is not None
        try:
            return int(self._conn.execute("PRAGMA data_version").fetchone()[0])
        except sqlite3.Error:
            return -1  # unknown: taken for a move, which rings (a ring costs a look)

    def _run(self) -> None:
        while True:
            with self._lock:
                while self._baseline is None and not self._closed:
                    self._wanted.wait()
                if self._closed:
                    return
                baseline = self._baseline
            if self._watch(baseline):
                with contextlib.suppress(OSError):
                    self._notifier.ring()

    def _watch(self, baseline: int | None) -> bool:
        """Until data_version moves from ``baseline`` (True), or WATCH_SECONDS; then the
        next watch is for the inserts that came since, if any, from the version read as
        the latest of them returned."""
        deadline = time.monotonic() + WATCH_SECONDS
        pause = FIRST_PAUSE
        moved = False
        while not moved and time.monotonic() < deadline:
            time.sleep(pause)
            pause = min(pause * 1.5, LONGEST_PAUSE)
            with self._lock:
                if self._closed:
                    return False
                moved = self._version() != baseline
        with self._lock:
            self._baseline, self._later = self._later, None
        return moved
