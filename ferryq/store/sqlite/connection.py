"""The SQLite file as the store uses it: its connections, its thread, its write lock,
its disk.

One connection per store lives on one dedicated thread, so the event loop never
blocks on the database. Every write is a ``BEGIN IMMEDIATE`` transaction: it takes the
write lock up front, which lets SQLite's busy handler queue writers from several
processes instead of failing them half-way. If a writer still times out waiting for
the lock, it begins again, so "database is locked" never reaches a caller. Any other
SQLite error reaches callers as a StoreError (DiskFull, DatabaseReadOnly) that says
in one line what is wrong with which file; the SQLite error is its ``__cause__``.

A disk that fills up is survived: while little space is left the store keeps the WAL
short, and after a write failed for want of space it empties the WAL before the next
write, so that writes work again as soon as space is freed.

After each write that changed rows, the other stores waiting on the file are woken
(ferryq.store.sqlite.wake), unless the write says it ``wakes`` no one: heartbeats,
leadership and lease renewals, which no waiter looks for and an idle worker makes
all the time (a waiting store still sees them at its next safety poll).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

from ferryq.errors import ConfigurationError, DatabaseReadOnly, StoreError
from ferryq.store.sqlite import failures, session, wake
from ferryq.store.sqlite.queries import MIGRATIONS

log = logging.getLogger("ferryq.store.sqlite")
T = TypeVar("T")
Conn = sqlite3.Connection

#: The longest one attempt at the write lock waits in SQLite's busy handler; between
#: attempts the store looks whether it is closing, when a write gives up the wait.
LOCK_POLL = 0.5
#: The query options a SQLite URL may carry (``sqlite:///jobs.db?synchronous=full``).
URL_OPTIONS = ("synchronous",)
#: Below this much free space on its disk, a store keeps the WAL short: SQLite
#: checkpoints every SHORT_CHECKPOINT pages instead of 1,000 and cuts the WAL file back
#: each time it starts it over. A WAL left to grow into the last free bytes could never
#: be checkpointed again: moving its pages into the database takes room too.
LOW_SPACE = 64 << 20
SHORT_CHECKPOINT = 64
#: The WAL file is cut back to this size when SQLite starts it over after a burst (a
#: large enqueue_many, checkpoints held off by readers), instead of keeping its peak.
WAL_SIZE_LIMIT = 16 << 20
#: Seconds between two looks at the free space by a store that writes.
SPACE_CHECK_INTERVAL = 1.0


def parse_url(url: str) -> tuple[str, dict[str, str]]:
    """The file and the options of a SQLite URL, or a ConfigurationError saying why not."""
    parts = urlsplit(url)
    if parts.scheme != "sqlite" or parts.netloc:
        raise ConfigurationError(
            f"invalid SQLite URL {url!r}: use sqlite:///relative.db or sqlite:////abs/path.db"
        )
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    if not path or path == ":memory:":
        raise ConfigurationError(
            "SQLite needs a file: workers share it across processes (sqlite:///ferryq.db)"
        )
    options = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
    unknown = sorted(set(options) - set(URL_OPTIONS))
    if unknown:
        raise ConfigurationError(
            f"unknown SQLite URL option(s) {', '.join(map(repr, unknown))}: "
            f"the options are {', '.join(URL_OPTIONS)}"
        )
    return path, options


class Database:
    """The store's connections to one file and the thread they live on.

    ``conn`` is the store's own, used on its thread; ``quick`` commits an enqueue on
    the event loop's thread (see ferryq.store.sqlite.inserts); ``watch`` reads
    ``PRAGMA data_version`` for the waits (ferryq.store.sqlite.waits). ``lock`` lets
    one of them be used at a time. ``read_only``: see ``SQLiteStore``.
    """

    def __init__(self, path: str, *, synchronous: str, busy_timeout: float, read_only: bool):
        if synchronous.upper() not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            raise ConfigurationError(
                f"synchronous must be off, normal, full or extra: {synchronous!r}"
            )
        self.path = path
        self.file = Path(path).absolute()  # for messages, whatever the working folder
        self.read_only = read_only
        self.synchronous = synchronous.upper()
        self._busy_timeout = busy_timeout
        self.executor: ThreadPoolExecutor | None = None
        self.conn: Conn | None = None
        # At synchronous=NORMAL a commit waits for no disk: an async enqueue commits on
        # the event loop's thread when the write lock is free at once, on this
        # connection, which never waits for the lock and leaves checkpoints to ``conn``.
        self.quick: Conn | None = None
        self.watch: Conn | None = None
        # One user of the connections at a time: the store's thread, or a thread that
        # enqueues (job_insert_blocking), or the event loop's (job_insert_many).
        self.lock = threading.Lock()
        # Wake-ups between stores (see ferryq.store.sqlite.wake): commits ring the
        # waiting stores' bells.
        self.notifier = wake.Notifier(wake.folder_of(self.file))
        self.on_close: Callable[[], None] = lambda: None  # the waits stop listening
        self._open_lock = threading.Lock()
        self.closing = threading.Event()
        self._caller: _Call | None = None  # the call the store's thread is running
        self.short = False  # keeping the WAL short: little space left
        self._space_checked = -math.inf
        self.reclaim = False  # a write found no space: empty the WAL before the next

    # -- opening and closing -------------------------------------------------------

    async def open(self, migrate: bool) -> None:
        with self._open_lock:
            if self.executor is not None:
                return
            self.executor = ThreadPoolExecutor(1, thread_name_prefix="ferryq-sqlite")
            self.closing.clear()
        try:
            # One executor job, so no call queued behind it can see an unmigrated file.
            await self._call(self._connect, migrate, doing="opening")
        except Exception:
            await self.close()
            raise

    async def close(self) -> None:
        executor, self.executor = self.executor, None
        if executor is None:
            return
        self.closing.set()  # a write still waiting for another process's lock gives up
        if self.conn is not None:
            await asyncio.get_running_loop().run_in_executor(executor, self._close_writers)
        executor.shutdown(wait=True)
        if self.watch is not None:
            self.watch.close()
            self.watch = None
        self._stop_listening()

    def terminate(self) -> None:
        executor, self.executor = self.executor, None
        self.closing.set()
        if executor is not None:
            executor.shutdown(wait=True)
        # An enqueue on another thread may be using them: closing one under it
        # would crash the process. (A write waiting for another process's lock
        # gives up within LOCK_POLL, as the store closes.)
        with self.lock:
            for conn in (self.conn, self.quick, self.watch):
                if conn is not None:
                    conn.close()
            self.conn = self.quick = self.watch = None
        self._stop_listening()

    def _stop_listening(self) -> None:
        """After the connections closed: waits under way end (their data version
        reads as unknown), and the store's socket goes."""
        self.notifier.listen(None)
        self.notifier.close()
        self.on_close()

    def _close_writers(self) -> None:
        with self.lock:
            for conn in (self.conn, self.quick):
                if conn is not None:
                    conn.close()
            self.conn = self.quick = None

    def _connect(self, migrate: bool) -> None:
        if self.read_only and not self.file.is_file():
            raise StoreError(f"no ferryq database at {self.file} (set FERRYQ_URL or --url)")
        parent = Path(self.path).parent
        if not parent.exists():
            raise ConfigurationError(
                f"folder {str(parent)!r} for the SQLite database does not exist"
            )
        try:
            self._connect_to_write(migrate)
        except (sqlite3.Error, DatabaseReadOnly) as exc:
            self._disconnect()
            if not self.read_only:
                raise
            if (
                isinstance(exc, sqlite3.Error)
                and failures.primary(exc) not in failures.READ_INSTEAD
            ):
                raise
            self._connect_to_read()

    def _connect_to_write(self, migrate: bool) -> None:
        if self.file.exists() and not os.access(self.file, os.W_OK):
            # SQLite would open it to read without a word, and the first write would fail.
            raise failures.read_only(
                self.file, failures.why_read_only(self.file) or "the file is not writable"
            )
        # A store that only reads opens the file with mode=rw, which never creates it.
        target = _uri(self.file, "mode=rw") if self.read_only else self.path
        conn = sqlite3.connect(
            target, uri=self.read_only, isolation_level=None, check_same_thread=False
        )
        self.conn = conn
        conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout * 1000)}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {self.synchronous}")
        conn.execute("PRAGMA cache_size = -65536")  # KiB: 64 MiB keeps the hot indexes cached
        conn.execute(f"PRAGMA journal_size_limit = {WAL_SIZE_LIMIT}")
        # From here on a write waits for the lock in write_here's loop, LOCK_POLL at a time.
        conn.execute(f"PRAGMA busy_timeout = {int(min(self._busy_timeout, LOCK_POLL) * 1000)}")
        if migrate:
            self.write_here(session.migrate)
        if not self.read_only and self.synchronous in ("OFF", "NORMAL"):
            self.quick = quick = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False
            )
            quick.execute("PRAGMA busy_timeout = 0")
            quick.execute(f"PRAGMA synchronous = {self.synchronous}")
            quick.execute("PRAGMA wal_autocheckpoint = 0")
        self.watch = sqlite3.connect(target, uri=self.read_only, check_same_thread=False,
                                     isolation_level=None)  # fmt: skip

    def _connect_to_read(self) -> None:
        """Open a database this process cannot write now, to read it: ``mode=ro``, or,
        when SQLite cannot even make its -shm file (a read-only folder or file system,
        a full disk) and no WAL holds commits, ``immutable=1``, which needs neither."""
        wal = Path(f"{self.file}-wal")
        try:
            self.conn = self._reader("mode=ro")
        except sqlite3.Error as exc:
            if failures.primary(exc) not in failures.READ_INSTEAD or (
                wal.exists() and wal.stat().st_size
            ):
                raise
            self.conn = self._reader("mode=ro&immutable=1")
        log.info("opened SQLite database %s to read only: it cannot be written now", self.file)

    def _reader(self, query: str) -> Conn:
        conn = sqlite3.connect(
            _uri(self.file, query), uri=True, isolation_level=None, check_same_thread=False
        )
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout * 1000)}")
            found = conn.execute(
                "SELECT 1 FROM sqlite_schema WHERE name = 'ferryq_migrations'"
            ).fetchone()  # the first read: SQLite opens the WAL here, or fails to
            version = session.schema_version(conn) if found else 0
        except BaseException:
            conn.close()
            raise
        if version < MIGRATIONS[-1][0]:
            conn.close()
            what = f"schema version {version}" if found else "no ferryq tables"
            raise StoreError(
                f"SQLite database {self.file} has {what} where this ferryq needs version "
                f"{MIGRATIONS[-1][0]}, and cannot be written now: run `ferryq migrate` once "
                "it can"
            )
        return conn

    def _disconnect(self) -> None:
        for conn in (self.conn, self.quick, self.watch):
            if conn is not None:
                conn.close()
        self.conn = self.quick = self.watch = None

    # -- calls on the store's thread ----------------------------------------------

    async def write(self, fn: Callable[..., T], *args: Any, wakes: bool = True) -> T:
        """``fn(conn, *args)`` in a write transaction on the store's thread (see
        ``write_here``)."""
        return await self._call(self.write_here, _bound(fn, args), wakes, doing="writing")

    async def read(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(conn, *args)`` in one read snapshot on the store's thread, so a job
        moving to history is seen once."""
        return await self._call(self._read_here, _bound(fn, args), doing="reading")

    def submit(self, fn: Callable[[], object]) -> bool:
        """Run ``fn`` on the store's thread, with the connections' lock, some time
        soon; False if the store is closed."""
        executor = self.executor
        if executor is None:
            return False
        try:
            executor.submit(self._locked, None, fn)
        except RuntimeError:  # closed meanwhile
            return False
        return True

    async def _call(self, fn: Callable[..., T], *args: Any, doing: str) -> T:
        if self.executor is None:
            raise StoreError("the store is closed")
        call = _Call()
        try:
            return await asyncio.get_running_loop().run_in_executor(
                self.executor, self._locked, call, fn, *args
            )
        except asyncio.CancelledError:
            call.gone = True  # a write still waiting for the lock gives up (write_here)
            raise
        except sqlite3.Error as exc:
            raise self.failure(exc, doing) from exc

    def _locked(self, call: _Call | None, fn: Callable[..., T], *args: Any) -> T:
        with self.lock:
            self._caller = call
            try:
                return fn(*args)
            finally:
                self._caller = None

    def failure(self, error: sqlite3.Error, doing: str) -> StoreError:
        if failures.primary(error) in failures.NO_SPACE:
            self.reclaim = True
        return failures.failure(self.file, error, doing)

    def write_here(self, fn: Callable[[Conn], T], wakes: bool = True) -> T:
        """Run ``fn`` in a write transaction, on this thread, which holds the lock;
        waiting out other writers however long, unless the store closes meanwhile or
        the caller stops waiting (a task of the event loop cancelled: a worker cutting
        off a claim as it stops). A write whose caller has gone is not made, even once
        the lock is free: nobody would learn what it claimed or wrote. ``wakes``: the
        waiting stores are told of the commit."""
        conn = self.require_conn()
        self._mind_space(conn)
        caller = self._caller
        delay, began = 0.01, time.monotonic()
        warn_at = began + max(self._busy_timeout, LOCK_POLL)
        while True:
            try:
                conn.execute("BEGIN IMMEDIATE")
                break
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc):
                    raise
            if self.closing.is_set() or (caller is not None and caller.gone):
                why = "as the store closed" if self.closing.is_set() else "as its caller left"
                raise StoreError(
                    f"gave up waiting for the write lock of SQLite database {self.path!r} "
                    f"(another process holds it) {why}"
                )
            time.sleep(delay)
            delay = min(delay * 2, LOCK_POLL)
            if (now := time.monotonic()) >= warn_at:
                warn_at = now + max(self._busy_timeout, LOCK_POLL)
                log.warning("SQLite write lock busy for %.0f s, still waiting", now - began)
        if caller is not None and caller.gone:
            conn.execute("ROLLBACK")
            raise StoreError(f"a write to SQLite database {self.path!r} whose caller left")
        try:
            result = fn(conn)
            conn.execute("COMMIT")
        except BaseException:
            # A full disk may have rolled the transaction back already, and a failed
            # COMMIT may leave it open: either way the next write must find none.
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            raise
        self.notifier.committed(conn, conn.total_changes, quiet=not wakes)
        return result

    def _read_here(self, fn: Callable[[Conn], T]) -> T:
        conn = self.require_conn()
        conn.execute("BEGIN")
        try:
            return fn(conn)
        finally:
            if conn.in_transaction:  # an error may have ended it
                conn.execute("COMMIT")

    def require_conn(self) -> Conn:
        if self.conn is None:
            raise StoreError("the store is not open")
        return self.conn

    # -- the disk ------------------------------------------------------------------

    def _mind_space(self, conn: Conn) -> None:
        """Before a write: after one that found no space, empty the WAL (a TRUNCATE
        checkpoint gives its pages back to the disk, once the database file has the room
        to take them); and keep the WAL short while little space is left."""
        if self.reclaim:
            self.reclaim = not failures.truncate_wal(conn)
            if not self.reclaim:
                log.debug("SQLite database %s: emptied the WAL after a write found no space",
                          self.file)  # fmt: skip
            self._space_checked = -math.inf
        now = time.monotonic()
        if now < self._space_checked + SPACE_CHECK_INTERVAL:
            return
        self._space_checked = now
        free = failures.free_space(self.file.parent)
        if (free < LOW_SPACE) == self.short:
            return
        self.short = not self.short
        checkpoint, limit = (SHORT_CHECKPOINT, 0) if self.short else (1000, WAL_SIZE_LIMIT)
        conn.execute(f"PRAGMA wal_autocheckpoint = {checkpoint}")
        conn.execute(f"PRAGMA journal_size_limit = {limit}")
        if self.short:  # not a warning: a one-off command would print it on every run
            log.info("%.1f MiB free on the disk of SQLite database %s: keeping its WAL short",
                     free / (1 << 20), self.file)  # fmt: skip
        else:
            log.info("SQLite database %s: its disk has room again", self.file)

    def checkpoint(self) -> None:
        """After quick commits: a checkpoint, and a look at the free space (a quick
        commit does neither; while space is short, enqueues leave the quick way)."""
        if self.conn is not None:
            with contextlib.suppress(sqlite3.Error):
                self._mind_space(self.conn)
                self.conn.execute("PRAGMA wal_checkpoint(PASSIVE)")

    def refuses(self, error: BaseException) -> bool:
        """See ``Store.refuses``."""
        if isinstance(error, ValueError | TypeError | OverflowError):
            return True  # not even bound: a text no codec takes, an integer past 64 bits
        # The store raises StoreError with SQLite's own error as the cause.
        cause = error.__cause__ if isinstance(error, StoreError) else error
        if not isinstance(cause, sqlite3.Error):
            return False
        code = failures.primary(cause)
        return code in failures.REFUSALS or (code == sqlite3.SQLITE_ERROR and "JSON" in str(cause))


def _bound(fn: Callable[..., T], args: tuple[Any, ...]) -> Callable[[Conn], T]:
    return (lambda conn: fn(conn, *args)) if args else fn


class _Call:
    """A call run on the store's thread; ``gone`` once its caller stopped waiting."""

    __slots__ = ("gone",)

    def __init__(self) -> None:
        self.gone = False


def _uri(file: Path, query: str) -> str:
    return f"{file.as_uri()}?{query}"
