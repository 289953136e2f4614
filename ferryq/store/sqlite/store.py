"""The embedded SQLite backend.

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

Cancel, dedup on insert, the lane listing, the counts and migrate are the flows
written once for both backends (ferryq.store.flows), driven here on the store's
thread through a ``_Session``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import re
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

from ferryq import lanes
from ferryq.errors import (
    ConfigurationError,
    DatabaseReadOnly,
    DiskFull,
    StoreError,
)
from ferryq.job import Job, State
from ferryq.lanes import Candidate, Held, LaneRule, LaneView
from ferryq.store import base, coalesce, flows
from ferryq.store.base import (
    Claimed,
    Dependencies,
    Finish,
    FinishReport,
    Inserted,
    JobFilter,
    LaneInfo,
    LaneWindow,
    Leases,
    NewJob,
    WorkerInfo,
)
from ferryq.store.coalesce import PendingInsert
from ferryq.store.flows import drive
from ferryq.store.sql import (
    TOKEN_COLUMNS,
    dependencies_from_rows,
    held_leases,
    job_from_row,
    lane_rule,
    lane_window,
    list_query,
    requeue_statement,
    rule_params,
    worker_from_row,
)
from ferryq.store.sqlite import wake
from ferryq.store.sqlite.queries import MIGRATIONS, Q

log = logging.getLogger("ferryq.store.sqlite")
T = TypeVar("T")
#: The longest one attempt at the write lock waits in SQLite's busy handler; between
#: attempts the store looks whether it is closing, when a write gives up the wait.
LOCK_POLL = 0.5
#: Where a store has no wake-ups (see ferryq.store.sqlite.wake), its waits check
#: ``PRAGMA data_version`` at most every BUSY_POLL seconds while the database is busy
#: (it changed twice in the last BUSY_FOR seconds), else every IDLE_POLL seconds:
#: a process at work hears of the next write within ms, an idle one costs little (a
#: lone write now and then, such as a maintenance leader's, does not count as busy).
BUSY_POLL, BUSY_FOR, IDLE_POLL = 0.005, 0.25, 0.05
#: The writes of these methods wake no other store: no waiter looks for what they
#: write (heartbeats, leadership, lease renewals), and an idle worker makes them all
#: the time. A store that waits still sees them at its next safety poll.
QUIET_WRITES = tuple(
    f"SQLiteStore.{method}."
    for method in ("job_leases", "leader_acquire", "leader_release", "worker_beat",
                   "worker_prune", "worker_remove")
)  # fmt: skip
FOLD_ROWS = 50_000  # history rows counted per fold, at most (one short write)
_TO_HISTORY = ("succeeded", "dead", "cancelled")
_NONE = FinishReport([], [])
#: The query options a SQLite URL may carry (``sqlite:///jobs.db?synchronous=full``).
URL_OPTIONS = ("synchronous",)
#: Below this much free space on its disk, a store keeps the WAL short: SQLite
#: checkpoints every SHORT_CHECKPOINT pages instead of 1,000 and cuts the WAL file back
#: each time it starts it over. A WAL left to grow into the last free bytes could never
#: be checkpointed again: moving its pages into the database takes room too.
LOW_SPACE = 64 << 20
SHORT_CHECKPOINT = 64
#: The store's thread checkpoints the WAL after this many quick commits (an async
#: enqueue's, on the event loop's thread, which must not do it itself: a checkpoint
#: waits for the disk). SQLite's own rule is about every thousand pages.
QUICK_CHECKPOINT = 128
#: The most jobs a call commits on the event loop's thread: a larger call (or one
#: whose lane must be settled) would hold up the loop, and goes to the store's thread.
QUICK_JOBS = 16
#: The most dependencies a call may name and still commit on the event loop's thread.
QUICK_AFTER = 64
#: The WAL file is cut back to this size when SQLite starts it over after a burst (a
#: large enqueue_many, checkpoints held off by readers), instead of keeping its peak.
WAL_SIZE_LIMIT = 16 << 20
#: Seconds between two looks at the free space by a store that writes.
SPACE_CHECK_INTERVAL = 1.0
#: Free bytes under which a disk I/O error is taken for a full disk (SQLite reports
#: some writes that found no space, such as growing the -shm file, as I/O errors).
NEARLY_FULL = 1 << 20


#: Result codes that refuse the values written, whatever the moment: a write that got
#: them would get them again (where busy, locked, I/O, full and read-only may pass).
_REFUSALS = frozenset(
    (
        sqlite3.SQLITE_TOOBIG,
        sqlite3.SQLITE_CONSTRAINT,
        sqlite3.SQLITE_MISMATCH,
        sqlite3.SQLITE_RANGE,
    )
)
#: Result codes of a write that found no space (see NEARLY_FULL for I/O errors).
_NO_SPACE = frozenset((sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR))
#: Result codes of a database this process may not write, or whose -wal and -shm files
#: it cannot make.
_CANNOT_WRITE = frozenset((sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_PERM))
#: A store that only reads falls back to opening the file to read on these.
_READ_INSTEAD = _CANNOT_WRITE | _NO_SPACE


class SQLiteStore(base.Store):
    """``read_only=True`` is for callers that only read (the CLI's ``jobs ls``,
    ``stats``…): a file that does not exist is an error, not a new database, and one
    this process cannot write is opened to read (not migrated, and its writes fail
    with DatabaseReadOnly)."""

    def __init__(
        self,
        path: str,
        *,
        synchronous: str = "NORMAL",
        busy_timeout: float = 30.0,
        read_only: bool = False,
    ):
        if synchronous.upper() not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            raise ConfigurationError(
                f"synchronous must be off, normal, full or extra: {synchronous!r}"
            )
        self.path = path
        self.url = f"sqlite:///{path}"
        self.read_only = read_only
        self._file = Path(path).absolute()  # for messages, whatever the working folder
        self._synchronous = synchronous.upper()
        self._busy_timeout = busy_timeout
        self._executor: ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None
        # One user of the connections at a time: the store's thread, or a thread that
        # enqueues (job_insert_blocking), or the event loop's (job_insert_many).
        self._conn_lock = threading.Lock()
        # Enqueue calls waiting for a commit, and whether a commit of calls is under
        # way (see job_insert_many).
        self._inserts: deque[PendingInsert] = deque()
        self._inserts_lock = threading.Lock()
        self._leading = False
        # At synchronous=NORMAL a commit waits for no disk: an async enqueue commits on
        # the event loop's thread when the write lock is free at once, on this
        # connection, which never waits for the lock and leaves checkpoints to _conn.
        self._quick: sqlite3.Connection | None = None
        self._quick_commits = 0
        self._watch: sqlite3.Connection | None = None
        self._claim_version = -1
        self._finish_version = -1  # data_version when wait_for_finish last returned
        self._seen_version = -1
        self._changes = (float("-inf"), float("-inf"))  # when the last two changes were seen
        # Wake-ups between stores (see ferryq.store.sqlite.wake): commits ring the
        # waiting stores' bells; this store's bell is made by its first wait.
        self._wakes = wake.Notifier(wake.folder_of(self._file))
        self._bell: wake.Bell | None = None
        self._bell_tried = False
        self._open_lock = threading.Lock()
        self._closing = threading.Event()
        self._caller: _Call | None = None  # the call the store's thread is running
        self._short = False  # keeping the WAL short: little space left
        self._space_checked = -math.inf
        self._reclaim = False  # a write found no space: empty the WAL before the next

    @classmethod
    def from_url(cls, url: str, *, read_only: bool = False) -> SQLiteStore:
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
        return cls(path, synchronous=options.get("synchronous", "NORMAL"), read_only=read_only)

    # -- lifecycle ---------------------------------------------------------------

    async def open(self, migrate: bool = True) -> None:
        with self._open_lock:
            if self._executor is not None:
                return
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="ferryq-sqlite")
            self._closing.clear()
        try:
            # One executor job, so no call queued behind it can see an unmigrated file.
            await self._call(self._connect, migrate)
        except Exception:
            await self.close()
            raise

    async def close(self) -> None:
        executor, self._executor = self._executor, None
        if executor is None:
            return
        self._closing.set()  # a write still waiting for another process's lock gives up
        if self._conn is not None:
            await asyncio.get_running_loop().run_in_executor(executor, self._close_writers)
        executor.shutdown(wait=True)
        if self._watch is not None:
            self._watch.close()
            self._watch = None
        self._stop_listening()

    def terminate(self) -> None:
        executor, self._executor = self._executor, None
        self._closing.set()
        if executor is not None:
            executor.shutdown(wait=True)
        # An enqueue on another thread may be using them: closing one under it
        # would crash the process. (A write waiting for another process's lock
        # gives up within LOCK_POLL, as the store closes.)
        with self._conn_lock:
            for conn in (self._conn, self._quick, self._watch):
                if conn is not None:
                    conn.close()
            self._conn = self._quick = self._watch = None
        self._stop_listening()

    def _stop_listening(self) -> None:
        """After the connections closed: waits under way end (their data version
        reads as unknown), and the store's socket goes."""
        bell, self._bell, self._bell_tried = self._bell, None, False
        self._wakes.listen(None)
        self._wakes.close()
        if bell is not None:
            bell.close()

    def _close_writers(self) -> None:
        with self._conn_lock:
            for conn in (self._conn, self._quick):
                if conn is not None:
                    conn.close()
            self._conn = self._quick = None

    def _connect(self, migrate: bool) -> None:
        if self.read_only and not self._file.is_file():
            raise StoreError(f"no ferryq database at {self._file} (set FERRYQ_URL or --url)")
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
            if isinstance(exc, sqlite3.Error) and _primary(exc) not in _READ_INSTEAD:
                raise
            self._connect_to_read()

    def _connect_to_write(self, migrate: bool) -> None:
        if self._file.exists() and not os.access(self._file, os.W_OK):
            # SQLite would open it to read without a word, and the first write would fail.
            raise _read_only(self._file, _why_read_only(self._file) or "the file is not writable")
        # A store that only reads opens the file with mode=rw, which never creates it.
        target = _uri(self._file, "mode=rw") if self.read_only else self.path
        conn = sqlite3.connect(
            target, uri=self.read_only, isolation_level=None, check_same_thread=False
        )
        self._conn = conn
        conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout * 1000)}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {self._synchronous}")
        conn.execute("PRAGMA cache_size = -65536")  # KiB: 64 MiB keeps the hot indexes cached
        conn.execute(f"PRAGMA journal_size_limit = {WAL_SIZE_LIMIT}")
        # From here on a write waits for the lock in _write's loop, LOCK_POLL at a time.
        conn.execute(f"PRAGMA busy_timeout = {int(min(self._busy_timeout, LOCK_POLL) * 1000)}")
        if migrate:
            self._write(_migrate)
        if not self.read_only and self._synchronous in ("OFF", "NORMAL"):
            self._quick = quick = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False
            )
            quick.execute("PRAGMA busy_timeout = 0")
            quick.execute(f"PRAGMA synchronous = {self._synchronous}")
            quick.execute("PRAGMA wal_autocheckpoint = 0")
        self._watch = sqlite3.connect(target, uri=self.read_only, check_same_thread=False,
                                      isolation_level=None)  # fmt: skip

    def _connect_to_read(self) -> None:
        """Open a database this process cannot write now, to read it: ``mode=ro``, or,
        when SQLite cannot even make its -shm file (a read-only folder or file system,
        a full disk) and no WAL holds commits, ``immutable=1``, which needs neither."""
        wal = Path(f"{self._file}-wal")
        try:
            self._conn = self._reader("mode=ro")
        except sqlite3.Error as exc:
            if _primary(exc) not in _READ_INSTEAD or (wal.exists() and wal.stat().st_size):
                raise
            self._conn = self._reader("mode=ro&immutable=1")
        log.info("opened SQLite database %s to read only: it cannot be written now", self._file)

    def _reader(self, query: str) -> sqlite3.Connection:
        conn = sqlite3.connect(
            _uri(self._file, query), uri=True, isolation_level=None, check_same_thread=False
        )
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout * 1000)}")
            found = conn.execute(
                "SELECT 1 FROM sqlite_schema WHERE name = 'ferryq_migrations'"
            ).fetchone()  # the first read: SQLite opens the WAL here, or fails to
            version = _schema_version(conn) if found else 0
        except BaseException:
            conn.close()
            raise
        if version < MIGRATIONS[-1][0]:
            conn.close()
            what = f"schema version {version}" if found else "no ferryq tables"
            raise StoreError(
                f"SQLite database {self._file} has {what} where this ferryq needs version "
                f"{MIGRATIONS[-1][0]}, and cannot be written now: run `ferryq migrate` once "
                "it can"
            )
        return conn

    def _disconnect(self) -> None:
        for conn in (self._conn, self._quick, self._watch):
            if conn is not None:
                conn.close()
        self._conn = self._quick = self._watch = None

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        if self._executor is None:
            raise StoreError("the store is closed")
        call = _Call()
        try:
            return await asyncio.get_running_loop().run_in_executor(
                self._executor, self._locked, call, fn, *args
            )
        except asyncio.CancelledError:
            call.gone = True  # a write still waiting for the lock gives up (_write)
            raise
        except sqlite3.Error as exc:
            doing = {self._connect: "opening", self._read: "reading"}.get(fn, "writing")
            raise self._failure(exc, doing) from exc

    def _locked(self, call: _Call | None, fn: Callable[..., T], *args: Any) -> T:
        with self._conn_lock:
            self._caller = call
            try:
                return fn(*args)
            finally:
                self._caller = None

    def _failure(self, error: sqlite3.Error, doing: str) -> StoreError:
        if _primary(error) in _NO_SPACE:
            self._reclaim = True
        return _failure(self._file, error, doing)

    def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` in a write transaction, waiting out other writers however long,
        unless the store closes meanwhile or the caller stops waiting (a task of the
        event loop cancelled: a worker cutting off a claim as it stops). A write whose
        caller has gone is not made, even once the lock is free: nobody would learn
        what it claimed or wrote."""
        conn = self._require_conn()
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
            if self._closing.is_set() or (caller is not None and caller.gone):
                why = "as the store closed" if self._closing.is_set() else "as its caller left"
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
        self._wakes.committed(conn, conn.total_changes, _quiet(fn))
        return result

    def _mind_space(self, conn: sqlite3.Connection) -> None:
        """Before a write: after one that found no space, empty the WAL (a TRUNCATE
        checkpoint gives its pages back to the disk, once the database file has the room
        to take them); and keep the WAL short while little space is left."""
        if self._reclaim:
            self._reclaim = not _truncate_wal(conn)
            if not self._reclaim:
                log.debug("SQLite database %s: emptied the WAL after a write found no space",
                          self._file)  # fmt: skip
            self._space_checked = -math.inf
        now = time.monotonic()
        if now < self._space_checked + SPACE_CHECK_INTERVAL:
            return
        self._space_checked = now
        free = _free_space(self._file.parent)
        if (free < LOW_SPACE) == self._short:
            return
        self._short = not self._short
        checkpoint, limit = (SHORT_CHECKPOINT, 0) if self._short else (1000, WAL_SIZE_LIMIT)
        conn.execute(f"PRAGMA wal_autocheckpoint = {checkpoint}")
        conn.execute(f"PRAGMA journal_size_limit = {limit}")
        if self._short:  # not a warning: a one-off command would print it on every run
            log.info("%.1f MiB free on the disk of SQLite database %s: keeping its WAL short",
                     free / (1 << 20), self._file)  # fmt: skip
        else:
            log.info("SQLite database %s: its disk has room again", self._file)

    def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` in one read snapshot, so a job moving to history is seen once."""
        conn = self._require_conn()
        conn.execute("BEGIN")
        try:
            return fn(conn)
        finally:
            if conn.in_transaction:  # an error may have ended it
                conn.execute("COMMIT")

    def _require_conn(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreError("the store is not open")
        return self._conn

    def refuses(self, error: BaseException) -> bool:
        if isinstance(error, ValueError | TypeError | OverflowError):
            return True  # not even bound: a text no codec takes, an integer past 64 bits
        # The store raises StoreError with SQLite's own error as the cause.
        cause = error.__cause__ if isinstance(error, StoreError) else error
        if not isinstance(cause, sqlite3.Error):
            return False
        code = _primary(cause)
        return code in _REFUSALS or (code == sqlite3.SQLITE_ERROR and "JSON" in str(cause))

    # -- migrations --------------------------------------------------------------

    async def migrate(self) -> list[int]:
        return await self._call(self._write, _migrate)

    async def schema_version(self) -> int:
        return await self._call(self._read, _schema_version)

    # -- hot path ----------------------------------------------------------------

    # Enqueues. Calls made at the same time share a commit (see ferryq.store.coalesce).
    # A call that finds no commit of calls under way leads: it commits on its own
    # thread (a sync caller), or on the store's thread (an async one). Calls arriving
    # meanwhile wait, then the store's thread commits them together, batch after batch
    # until none is left. An async call at NORMAL that finds nothing under way first
    # tries to commit alone on its own thread, without waiting for the lock.

    async def job_insert_many(self, job: NewJob, args: Sequence[str]) -> list[Inserted]:
        if self._executor is None:
            raise StoreError("the store is closed")
        pending = PendingInsert(job, args)
        quick = (
            len(args) <= QUICK_JOBS and job.lane is None and job.unique_key is None
            and len(job.after) <= QUICK_AFTER
        )  # fmt: skip
        if quick and not self._leading and self._quick_insert(pending):
            return pending.outcome()
        loop = asyncio.get_running_loop()
        pending.future, pending.loop = loop.create_future(), loop
        if self._queue_insert(pending):
            self._pass_on()
        try:
            await pending.future
        except asyncio.CancelledError:
            # Not inserted, unless a commit has it already (the caller cannot tell).
            with self._inserts_lock, contextlib.suppress(ValueError):
                self._inserts.remove(pending)
            raise
        return pending.outcome()

    inserts_blocking: bool = True

    def job_insert_blocking(self, job: NewJob, args: Sequence[str]) -> list[Inserted]:
        if self._executor is None:
            raise StoreError("the store is closed")
        wake = threading.Lock()
        wake.acquire()
        pending = PendingInsert(job, args, wake=wake)
        if not self._queue_insert(pending):
            wake.acquire()  # released once its outcome is in
            return pending.outcome()
        try:
            with self._conn_lock:  # nothing was under way: this call is first in line
                with self._inserts_lock:
                    batch = coalesce.take(self._inserts)
                self._commit(batch)
        finally:
            self._pass_on()
        return pending.outcome()

    def _queue_insert(self, pending: PendingInsert) -> bool:
        """Queue a call; True if it leads (no commit of calls was under way)."""
        with self._inserts_lock:
            self._inserts.append(pending)
            leads, self._leading = not self._leading, True
        return leads

    def _pass_on(self) -> None:
        """After a leader's batch: the store's thread commits the calls queued since."""
        with self._inserts_lock:
            if not self._inserts:
                self._leading = False
                return
        executor = self._executor
        try:
            if executor is None:
                raise RuntimeError
            executor.submit(self._flush_inserts)
        except RuntimeError:  # closed meanwhile
            with self._inserts_lock:
                batch, self._leading = coalesce.take(self._inserts, None), False
            coalesce.fail_all(batch, StoreError("the store is closed"))
            for pending in batch:
                pending.settle()

    def _flush_inserts(self) -> None:
        with self._conn_lock:
            while True:
                with self._inserts_lock:
                    batch = coalesce.take(self._inserts)
                    if not batch:
                        self._leading = False
                        return
                self._commit(batch)

    def _commit(self, batch: Sequence[PendingInsert]) -> None:
        """Commit a batch of calls and tell each caller. The connection lock is held."""
        try:
            self._insert_batch(batch)
        except Exception as exc:  # a lone call's refusal, or the store closed
            coalesce.fail_all(batch, exc)
        except BaseException as exc:  # the committing thread is interrupted
            coalesce.fail_interrupted(batch, exc)
            raise
        finally:
            for pending in batch:
                pending.settle()

    def _insert_batch(self, batch: Sequence[PendingInsert]) -> None:
        def insert(conn: sqlite3.Connection) -> list[list[Inserted]]:
            return [_insert_many(conn, p.job, p.args) for p in batch]

        try:
            for pending, inserted in zip(batch, self._write(insert), strict=True):
                pending.inserted = inserted
            return
        except sqlite3.Error as exc:
            if len(batch) == 1 or not self.refuses(exc):
                coalesce.fail_all(batch, self._failure(exc, "writing"))
                return
        except (ValueError, TypeError, OverflowError):
            if len(batch) == 1:
                raise
        # One job the database refuses must not fail the others: each on its own.
        for pending in batch:
            try:
                pending.inserted = self._write(_inserting(pending))
            except sqlite3.Error as exc:
                pending.error = self._failure(exc, "writing")
            except (ValueError, TypeError, OverflowError) as exc:
                pending.error = exc

    def _quick_insert(self, pending: PendingInsert) -> bool:
        """Commit one call on this thread if the write lock is free at once; False when
        it is not (another process writes), when the disk is short of space (the
        store's thread minds the WAL then), or when this process's own connection is
        in use."""
        if self._quick is None or self._short or self._reclaim:
            return False
        if not self._conn_lock.acquire(blocking=False):
            return False
        try:
            conn = self._quick  # read again under the lock: terminate() may have run
            if conn is None:
                return False
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError:
                return False  # busy: the store's thread waits for it
            try:
                pending.inserted = _insert_many(conn, pending.job, pending.args)
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                pending.error = self._failure(exc, "writing")
            except (ValueError, TypeError, OverflowError) as exc:
                pending.error = exc
            finally:
                if conn.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
            if pending.error is not None:
                pending.inserted = None
            else:
                self._wakes.committed(conn, conn.total_changes)
        finally:
            self._conn_lock.release()
        # Its commits never checkpoint: the store's thread does, now and then.
        self._quick_commits += 1
        executor = self._executor
        if self._quick_commits % QUICK_CHECKPOINT == 0 and executor is not None:
            with contextlib.suppress(RuntimeError):
                executor.submit(self._locked, None, self._checkpoint)
        return True

    def _checkpoint(self) -> None:
        """After quick commits: a checkpoint, and a look at the free space (a quick
        commit does neither; while space is short, enqueues leave the quick way)."""
        if self._conn is not None:
            with contextlib.suppress(sqlite3.Error):
                self._mind_space(self._conn)
                self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)")

    async def job_claim(
        self, namespace: str, queues: Sequence[str], limit: int, worker: str, now: float
    ) -> list[Claimed]:
        return (await self.job_finish_and_claim((), namespace, queues, limit, worker, now))[1]

    async def job_finish_many(self, finishes: Sequence[Finish]) -> FinishReport:
        return await self._call(self._write, lambda conn: _finish_many(conn, finishes)[0])

    async def job_finish_and_claim(
        self,
        finishes: Sequence[Finish],
        namespace: str,
        queues: Sequence[str],
        limit: int,
        worker: str,
        now: float,
    ) -> tuple[FinishReport, list[Claimed]]:
        if limit > 0:
            self._claim_version = self._data_version()

        def cycle(conn: sqlite3.Connection) -> tuple[FinishReport, list[Claimed]]:
            # The lanes that finishes free hand their next jobs to this worker first.
            taker = lanes.Taker(namespace, queues, worker, limit)
            report, taken = _finish_many(conn, finishes, taker) if finishes else (_NONE, [])
            if taker.budget > 0:
                taken += _claim(conn, namespace, queues, taker.budget, worker, now)
            return report, taken

        return await self._call(self._write, cycle)

    async def job_leases(
        self,
        held: Sequence[tuple[int, int]],
        extend: Sequence[int],
        now: float,
        started: Mapping[int, float] | None = None,
        progress: Mapping[int, str] | None = None,
    ) -> Leases:
        fences, began, done = dict(held), started or {}, progress or {}

        def leases(conn: sqlite3.Connection) -> Leases:
            extended: list[int] = []
            if extend:
                pairs = json.dumps(
                    [[i, fences.get(i, -1), began.get(i), done.get(i)] for i in extend]
                )
                renewed = conn.execute(Q["job_lease_extend"], {"pairs": pairs, "now": now})
                extended = sorted(r[0] for r in renewed)
            rows = conn.execute(Q["job_held"], {"ids": json.dumps(list(fences))}).fetchall()
            return held_leases(fences, extended, rows)

        if extend:
            return await self._call(self._write, leases)
        return await self._call(self._read, leases)

    async def job_next_due(self, namespace: str, queues: Sequence[str]) -> float | None:
        def next_due(conn: sqlite3.Connection) -> float | None:
            due = [
                conn.execute(
                    Q["job_next_due_queue"], {"namespace": namespace, "queue": queue}
                ).fetchone()[0]
                for queue in queues
            ]
            return min((float(value) for value in due if value is not None), default=None)

        return await self._call(self._read, next_due)

    async def wait_for_finish(self, within: float, poll: float) -> None:
        """Until another connection commits (it may have ended a job) after the last
        call returned, or ``poll`` seconds; never longer than ``within``. Callers that
        share the store share that mark, so each still looks within ``poll``."""
        seen = self._finish_version
        await self._version_moves(lambda: seen, min(poll, within))
        self._finish_version = self._data_version()

    async def wait_for_change(self, within: float, *, patient: bool = False) -> bool:
        """Whether another connection wrote since the last claim (or take), within
        ``within`` seconds. Other stores' commits wake the wait; without wake-ups it
        polls ``PRAGMA data_version`` (a few microseconds, no lock, no disk): eagerly,
        or, ``patient``, seldom while the database is idle."""
        return await self._version_moves(lambda: self._claim_version, within, patient)

    async def _version_moves(
        self, baseline: Callable[[], int], within: float, patient: bool = True
    ) -> bool:
        """Whether ``data_version`` differs from ``baseline()`` within ``within`` seconds.
        With a bell it is checked at each wake-up and every ``wake.SAFETY_POLL``; else
        after pauses that grow from 0.5 ms to BUSY_POLL, and, when ``patient``, every
        IDLE_POLL while the database is not busy."""
        bell = self._bell_here()
        if bell is not None:
            return await bell.until(lambda: self._data_version() != baseline(), within)
        deadline = time.monotonic() + within
        pause = 0.0005
        while True:
            if self._data_version() != baseline():
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
        if not self._bell_tried and self._watch is not None:
            self._bell_tried = True
            self._bell = wake.Bell.open(self._file, loop)
            self._wakes.listen(self._bell)
        bell = self._bell
        return bell if bell is not None and bell.loop is loop else None

    def _data_version(self) -> int:
        if self._watch is None:
            return -1
        try:
            version = int(self._watch.execute("PRAGMA data_version").fetchone()[0])
        except sqlite3.OperationalError:
            return -2  # unknown: report a change and let the claim find out
        if version != self._seen_version:
            self._seen_version = version
            self._changes = (self._changes[1], time.monotonic())
        return version

    # -- reads and operator actions ---------------------------------------------

    async def job_get(self, job_id: int) -> Job | None:
        return await self._call(self._read, lambda conn: _get(conn, job_id))

    async def prepare_dependencies(self) -> None:
        """Nothing to do: SQLite's trigger (migration 0011) costs nothing unused."""

    async def job_dependencies(self, job_id: int) -> Dependencies:
        def edges(conn: sqlite3.Connection) -> list[sqlite3.Row]:
            return conn.execute(Q["job_dependencies"], {"id": job_id}).fetchall()

        return dependencies_from_rows(await self._call(self._read, edges))

    async def job_dependency_results(self, job_id: int) -> list[str | None]:
        def results(conn: sqlite3.Connection) -> list[str | None]:
            rows = conn.execute(Q["job_dependency_results"], {"id": job_id})
            return [result if state == "succeeded" else None for _, state, result in rows]

        return await self._call(self._read, results)

    async def job_list(self, where: JobFilter) -> list[Job]:
        return await self._call(self._read, lambda conn: _list(conn, where))

    async def job_cancel(self, job_id: int, now: float) -> Job:
        return await self._call(
            self._write, lambda conn: drive(flows.cancel(_Session(conn), job_id, now))
        )

    async def job_respawn(
        self,
        job_ids: Sequence[int],
        now: float,
        expires_at: float | None = None,
        max_tries: int | None = None,
    ) -> list[int]:
        def respawn(conn: sqlite3.Connection) -> list[int]:
            moved = []
            for job_id in job_ids:
                params = {"id": job_id, "now": now, "expires_at": expires_at,
                          "max_tries": max_tries}  # fmt: skip
                if conn.execute(Q["job_respawn"], params).rowcount:
                    conn.execute(Q["history_delete"], {"id": job_id})
                    moved.append(job_id)
            # A job in a lane comes back waiting, ahead of the later jobs by its id; the
            # one that halted its lane resumes at once.
            back = {
                (r[1], r[2]) for r in conn.execute(Q["lane_of_jobs"], {"ids": json.dumps(moved)})
            }
            released = _release(conn, moved)
            if released:  # it goes first and keeps its place, as a retry does
                resumed = json.dumps(list(released.values()))
                conn.execute(Q["lane_admit_due"], {"ids": resumed, "now": now})
            _settle(conn, back | released.keys(), now)
            return moved

        return await self._call(self._write, respawn)

    async def job_purge(self, job_ids: Sequence[int], now: float) -> int:
        def purge(conn: sqlite3.Connection) -> int:
            purged = [i for i in job_ids if conn.execute(Q["job_purge"], {"id": i}).rowcount]
            _settle(conn, set(_release(conn, purged)), now)
            return len(purged)

        return await self._call(self._write, purge)

    async def job_counts(self, namespace: str | None) -> dict[tuple[str, str, str], int]:
        return await self._call(
            self._read, lambda conn: drive(flows.job_counts(_Session(conn), namespace))
        )

    # -- queues as the HTTP API sees them ----------------------------------------

    async def job_take(
        self, namespace: str, queue: str, limit: int, worker: str, ttr: float, now: float
    ) -> list[Job]:
        if limit <= 0:
            return []
        # As job_finish_and_claim: what commits after this point wakes wait_for_change.
        self._claim_version = self._data_version()
        params = {"namespace": namespace, "queue": queue, "limit": limit, "worker": worker,
                  "ttr": ttr, "now": now}  # fmt: skip

        def take(conn: sqlite3.Connection) -> list[Job]:
            _promote(conn, namespace, [queue], now)
            if _rated(conn, namespace):
                ids = _gate(conn, namespace, _pick_ready(conn, namespace, [queue], limit, now), now)
                rows = conn.execute(Q["job_take_ids"], {**params, "ids": json.dumps(ids)})
            else:
                rows = conn.execute(Q["job_take"], params)
            taken = [job_from_row(row) for row in rows]
            return sorted(taken, key=lambda job: (job.order_time, job.id))

        return await self._call(self._write, take)

    async def job_ack(
        self, namespace: str, queue: str, job_ids: Sequence[int], now: float
    ) -> list[int]:
        params = {"namespace": namespace, "queue": queue, "ids": json.dumps(list(job_ids)),
                  "state": State.SUCCEEDED.value, "now": now}  # fmt: skip

        def ack(conn: sqlite3.Connection) -> list[int]:
            moved = _move_to_history(conn, "job_ack", params)
            return [job_id for job_id in dict.fromkeys(job_ids) if job_id in moved]

        return await self._call(self._write, ack) if job_ids else []

    async def queue_peek(self, namespace: str, queue: str, now: float) -> Job | None:
        params = {"namespace": namespace, "queue": queue, "now": now}

        def peek(conn: sqlite3.Connection) -> Job | None:
            row = conn.execute(Q["queue_peek"], params).fetchone()
            return None if row is None else job_from_row(row)

        return await self._call(self._read, peek)

    async def queue_size(self, namespace: str, queue: str, state: State) -> int:
        name = "queue_size_history" if State(state).terminal else "queue_size_hot"
        params = {"namespace": namespace, "queue": queue, "state": State(state).value}
        return await self._call(
            self._read, lambda conn: int(conn.execute(Q[name], params).fetchone()[0])
        )

    async def queue_clear(self, namespace: str, queue: str, now: float) -> int:
        params = {"namespace": namespace, "queue": queue, "state": State.CANCELLED.value,
                  "now": now}  # fmt: skip
        return await self._call(
            self._write, lambda conn: len(_move_to_history(conn, "queue_clear", params))
        )

    async def dead_oldest(self, namespace: str, queue: str, limit: int) -> list[int]:
        params = {"namespace": namespace, "queue": queue, "limit": limit}
        return await self._call(
            self._read, lambda conn: [r[0] for r in conn.execute(Q["dead_oldest"], params)]
        )

    # -- tokens ------------------------------------------------------------------

    async def token_create(self, token: base.Token) -> bool:
        params = {column: getattr(token, column) for column in TOKEN_COLUMNS}
        return await self._writes_a_row("token_create", params)

    async def token_get(self, digest: str) -> base.Token | None:
        def get(conn: sqlite3.Connection) -> base.Token | None:
            row = conn.execute(Q["token_get"], {"digest": digest}).fetchone()
            return None if row is None else base.Token(*row)

        return await self._call(self._read, get)

    async def token_list(self, namespace: str | None) -> list[base.Token]:
        name = "token_list_all" if namespace is None else "token_list"

        def listing(conn: sqlite3.Connection) -> list[base.Token]:
            return [base.Token(*row) for row in conn.execute(Q[name], {"namespace": namespace})]

        return await self._call(self._read, listing)

    async def token_delete(self, namespace: str, digest: str) -> bool:
        params = {"namespace": namespace, "digest": digest}
        return await self._writes_a_row("token_delete", params)

    async def token_limit_set(
        self, digest: str, read: int | None, write: int | None, interval: float | None
    ) -> bool:
        params = {"digest": digest, "limit_read": read, "limit_write": write,
                  "limit_interval": interval}  # fmt: skip
        return await self._writes_a_row("token_limit_set", params)

    async def _writes_a_row(self, statement: str, params: dict[str, Any]) -> bool:
        """Run a write that returns a row when it changed something."""
        return await self._call(
            self._write, lambda conn: bool(conn.execute(Q[statement], params).fetchall())
        )

    # -- lanes -------------------------------------------------------------------

    async def lane_rules(self, namespace: str) -> list[LaneRule]:
        return await self._call(self._read, lambda conn: _rules(conn, namespace))

    async def lane_rule_set(self, namespace: str, rule: LaneRule, now: float) -> None:
        def set_rule(conn: sqlite3.Connection) -> None:
            params = {"namespace": namespace, "now": now, **rule_params(rule)}
            conn.execute(Q["lane_rule_set"], params)
            _settle(conn, _matching(conn, namespace, rule.pattern), now, limits_changed=True)

        await self._call(self._write, set_rule)

    async def lane_rule_delete(self, namespace: str, pattern: str, now: float) -> bool:
        def delete(conn: sqlite3.Connection) -> bool:
            params = {"namespace": namespace, "pattern": pattern}
            if not conn.execute(Q["lane_rule_delete"], params).rowcount:
                return False
            _settle(conn, _matching(conn, namespace, pattern), now, limits_changed=True)
            return True

        return await self._call(self._write, delete)

    async def lane_window(self, namespace: str, lane: str) -> LaneWindow:
        def window(conn: sqlite3.Connection) -> LaneWindow:
            row = conn.execute(Q["lane_window"], {"namespace": namespace, "lane": lane}).fetchone()
            return lane_window(row)

        return await self._call(self._read, window)

    async def lane_view(self, namespace: str, lane: str) -> LaneView:
        def view(conn: sqlite3.Connection) -> LaneView:
            return _view(conn, namespace, lane, lanes.rule_for(_rules(conn, namespace), lane))

        return await self._call(self._read, view)

    async def lane_ahead(self, namespace: str, lane: str, job_id: int) -> int:
        params = {"namespace": namespace, "lane": lane, "id": job_id}
        return await self._call(
            self._read, lambda conn: int(conn.execute(Q["lane_ahead"], params).fetchone()[0])
        )

    async def lane_list(self, namespace: str, limit: int) -> list[LaneInfo]:
        return await self._call(
            self._read, lambda conn: drive(flows.lane_list(_Session(conn), namespace, limit))
        )

    # -- maintenance -------------------------------------------------------------

    async def job_promote_due(self, now: float, limit: int) -> int:
        def promote(conn: sqlite3.Connection) -> int:
            return conn.execute(Q["job_promote_due"], {"now": now, "limit": limit}).rowcount

        return await self._call(self._write, promote)

    async def job_expired_leases(self, now: float, limit: int) -> list[Claimed]:
        def expired(conn: sqlite3.Connection) -> list[Claimed]:
            rows = conn.execute(Q["job_expired_leases"], {"now": now, "limit": limit})
            return [Claimed(*row) for row in rows]

        return await self._call(self._read, expired)

    async def job_expire(self, now: float, limit: int) -> list[int]:
        def expire(conn: sqlite3.Connection) -> list[int]:
            ids = [r[0] for r in conn.execute(Q["job_expire_ids"], {"now": now, "limit": limit})]
            for job_id in ids:
                _move_terminal(conn, job_id, State.EXPIRED, now)
            return ids

        return await self._call(self._write, expire)

    async def history_prune(self, before: float, limit: int) -> int:
        def prune(conn: sqlite3.Connection) -> int:
            pruned = conn.execute(Q["history_prune"], {"before": before, "limit": limit}).rowcount
            if pruned:
                conn.execute(Q["deps_prune"])
            conn.execute(Q["lane_windows_prune"], {"before": before})
            return pruned

        return await self._call(self._write, prune)

    async def history_fold(self, now: float) -> int:
        def fold(conn: sqlite3.Connection) -> int:
            mark, until = conn.execute(Q["history_fold_range"], {"limit": FOLD_ROWS}).fetchone()
            if until <= mark:
                return 0
            groups = conn.execute(Q["history_fold"], {"until": until}).fetchall()
            conn.executemany(Q["history_count_add"], [
                {"namespace": ns, "queue": queue, "state": state, "n": n}
                for ns, queue, state, n in groups
            ])  # fmt: skip
            conn.execute(Q["history_fold_mark"], {"until": until})
            return sum(n for *_, n in groups)

        return await self._call(self._write, fold)

    async def leader_acquire(self, name: str, holder: str, ttl: float, now: float) -> bool:
        def acquire(conn: sqlite3.Connection) -> bool:
            params = {"name": name, "holder": holder, "expires_at": now + ttl, "now": now}
            return conn.execute(Q["leader_acquire"], params).rowcount == 1

        return await self._call(self._write, acquire)

    async def leader_release(self, name: str, holder: str) -> None:
        def release(conn: sqlite3.Connection) -> None:
            conn.execute(Q["leader_release"], {"name": name, "holder": holder})

        await self._call(self._write, release)

    # -- periodic tasks ----------------------------------------------------------

    async def periodic_sync(
        self, namespace: str, entries: Sequence[base.PeriodicEntry], now: float
    ) -> list[base.PeriodicState]:
        def sync(conn: sqlite3.Connection) -> list[base.PeriodicState]:
            for entry in entries:
                params = {"namespace": namespace, "task": entry.task, "schedule": entry.schedule,
                          "queue": entry.queue, "catch_up": entry.catch_up, "now": now}  # fmt: skip
                conn.execute(Q["periodic_upsert"], params)
            return _periodic(conn, namespace)

        return await self._call(self._write, sync)

    async def periodic_advance(
        self, namespace: str, task: str, checked_from: float, advance: base.PeriodicAdvance
    ) -> bool:
        params = {"namespace": namespace, "task": task, "checked_from": checked_from,
                  "checked_until": advance.checked_until, "next_tick": advance.next_tick,
                  "now": advance.updated_at, "last_tick": advance.last_tick,
                  "last_job": advance.last_job}  # fmt: skip
        return await self._call(
            self._write, lambda conn: conn.execute(Q["periodic_advance"], params).rowcount == 1
        )

    async def periodic_list(self, namespace: str) -> list[base.PeriodicState]:
        return await self._call(self._read, lambda conn: _periodic(conn, namespace))

    # -- workers -----------------------------------------------------------------

    async def worker_beat(self, worker: WorkerInfo) -> None:
        params = {
            "id": worker.id, "namespace": worker.namespace, "queues": json.dumps(worker.queues),
            "host": worker.host, "pid": worker.pid, "concurrency": worker.concurrency,
            "started_at": worker.started_at, "heartbeat_at": worker.heartbeat_at,
            "running": json.dumps(worker.running), "stats": json.dumps(worker.stats),
        }  # fmt: skip
        await self._call(self._write, lambda conn: conn.execute(Q["worker_beat"], params))

    async def worker_remove(self, worker_id: str) -> None:
        await self._call(
            self._write, lambda conn: conn.execute(Q["worker_remove"], {"id": worker_id})
        )

    async def worker_list(self, alive_since: float | None = None) -> list[WorkerInfo]:
        def workers(conn: sqlite3.Connection) -> list[WorkerInfo]:
            rows = conn.execute(Q["worker_list"], {"since": alive_since or 0.0})
            return [worker_from_row(r) for r in rows]

        return await self._call(self._read, workers)

    async def worker_prune(self, dead_before: float) -> int:
        def prune(conn: sqlite3.Connection) -> int:
            return conn.execute(Q["worker_prune"], {"before": dead_before}).rowcount

        return await self._call(self._write, prune)


def _quiet(write: Callable[..., Any]) -> bool:
    """Whether a write wakes no other store (see QUIET_WRITES)."""
    return getattr(write, "__qualname__", "").startswith(QUIET_WRITES)


# -- errors and space ----------------------------------------------------------


def _primary(error: sqlite3.Error) -> int:
    """The primary result code of a SQLite error (SQLITE_IOERR for SQLITE_IOERR_WRITE)."""
    return getattr(error, "sqlite_errorcode", 0) & 0xFF


def _failure(file: Path, error: sqlite3.Error, doing: str) -> StoreError:
    """The ferryq error for SQLite's ``error``, met while ``doing`` (opening, reading,
    writing) the database ``file``: one line saying what is wrong."""
    code = _primary(error)
    name = f"SQLite database {file}"
    if code == sqlite3.SQLITE_FULL or (
        code == sqlite3.SQLITE_IOERR and _free_space(file.parent) < NEARLY_FULL
    ):
        return DiskFull(f"{name}: the disk is full ({doing}: {error})")
    if code in _CANNOT_WRITE and (why := _why_read_only(file)) is not None:
        return _read_only(file, why)
    if code == sqlite3.SQLITE_IOERR:
        return StoreError(f"{name}: a disk I/O error ({doing}: {error})")
    return StoreError(f"{name}: {error} ({doing})")


def _read_only(file: Path, why: str) -> DatabaseReadOnly:
    if not file.exists():
        return DatabaseReadOnly(f"cannot create SQLite database {file} ({why})")
    return DatabaseReadOnly(
        f"SQLite database {file} is read-only ({why}): commands that write need write access"
    )


def _why_read_only(file: Path) -> str | None:
    """What keeps this process from writing ``file`` (and the -wal and -shm files that
    SQLite keeps beside it), if the file system says."""
    folder = file.parent
    try:
        if os.statvfs(folder).f_flag & os.ST_RDONLY:
            return "its file system is mounted read-only"
    except OSError:
        return None
    if file.exists() and not os.access(file, os.W_OK):
        return "the file is not writable"
    for side in (Path(f"{file}-wal"), Path(f"{file}-shm")):
        if side.exists() and not os.access(side, os.W_OK):
            return f"{side.name} is not writable"
    if not os.access(folder, os.W_OK | os.X_OK):
        return "its folder is not writable, and SQLite makes its -wal and -shm files there"
    return None


def _free_space(folder: Path) -> float:
    """Bytes free for this process on the disk of ``folder`` (infinite if unknown)."""
    try:
        found = os.statvfs(folder)
    except OSError:
        return math.inf
    return float(found.f_bavail * found.f_frsize)


def _truncate_wal(conn: sqlite3.Connection) -> bool:
    """Checkpoint the whole WAL and cut its file to nothing; whether that worked."""
    try:
        busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    except sqlite3.Error:
        return False  # still no room to move the WAL's pages into the database
    return int(busy) == 0


def _uri(file: Path, query: str) -> str:
    return f"{file.as_uri()}?{query}"


# -- statements run on the store's thread --------------------------------------


class _Call:
    """A call run on the store's thread; ``gone`` once its caller stopped waiting."""

    __slots__ = ("gone",)

    def __init__(self) -> None:
        self.gone = False


class _Session:
    """The session of the flows written once (ferryq.store.flows) on the store's
    connection, in the transaction the caller began. Every statement is a sync call,
    so a flow never suspends here: ``drive`` runs it. No lock is taken: a write holds
    the database's write lock from its BEGIN IMMEDIATE."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    async def rows(self, name: str, params: Mapping[str, Any]) -> list[sqlite3.Row]:
        cursor = self.conn.cursor()
        cursor.row_factory = sqlite3.Row  # by column name, for this cursor only
        return cursor.execute(Q[name], params).fetchall()

    async def value(self, name: str, params: Mapping[str, Any]) -> Any:
        row = self.conn.execute(Q[name], params).fetchone()
        return None if row is None else row[0]

    async def execute(self, name: str, params: Mapping[str, Any]) -> None:
        self.conn.execute(Q[name], params)

    async def script(self, sql: str) -> None:
        self.conn.execute(sql)

    async def lock_lanes(self, keys: Collection[tuple[str, str]]) -> None:
        pass  # the write lock is held

    async def settle_lanes(self, keys: Collection[tuple[str, str]], now: float) -> None:
        _settle(self.conn, set(keys), now)

    async def lane_rules(self, namespace: str) -> list[LaneRule]:
        return _rules(self.conn, namespace)


def _migrate(conn: sqlite3.Connection) -> list[int]:
    return drive(flows.migrate(_Session(conn), MIGRATIONS, time.time()))


def _schema_version(conn: sqlite3.Connection) -> int:
    return drive(flows.schema_version(_Session(conn)))


def _insert_many(conn: sqlite3.Connection, job: NewJob, args: Sequence[str]) -> list[Inserted]:
    if job.after:

        async def insert(held: NewJob, rest: Sequence[str]) -> list[Inserted]:
            return _insert_jobs(conn, held, rest)

        return drive(flows.insert_after(_Session(conn), job, args, insert))
    return _insert_jobs(conn, job, args)


def _insert_jobs(conn: sqlite3.Connection, job: NewJob, args: Sequence[str]) -> list[Inserted]:
    if job.unique_key is not None:

        async def insert(first: Sequence[str]) -> int:
            return _insert_rows(conn, job, first)[0]

        return drive(flows.insert_unique(_Session(conn), job, args, insert))
    if len(args) == 1 and job.lane is None:
        return [Inserted(_insert_one(conn, job, args[0]), True)]
    return [Inserted(i, True) for i in _insert_rows(conn, job, args)]


def _insert_rows(conn: sqlite3.Connection, job: NewJob, args: Sequence[str]) -> range:
    """Jobs of a lane, with a unique key, or many at once: their ids."""
    params = {
        "namespace": job.namespace, "queue": job.queue, "task": job.task,
        "args": args[0] if len(args) == 1 else json.dumps(list(args)),
        "state": job.state.value, "lane": job.lane,
        "priority": job.priority, "run_at": job.run_at, "order_time": job.order_time,
        "expires_at": job.expires_at, "ttr": job.ttr, "max_tries": job.max_tries,
        "retry": job.retry, "unique_key": job.unique_key, "stage": job.stage,
        "context": job.context, "meta": job.meta, "created_at": job.created_at,
        "timeout": job.timeout,
    }  # fmt: skip
    if len(args) == 1:
        first = last = conn.execute(Q["job_insert_one"], params).lastrowid or 0
    else:
        count = conn.execute(Q["job_insert"], params).rowcount
        last = conn.execute("SELECT last_insert_rowid()").fetchone()[0]
        first = last - count + 1
    if job.lane is not None:  # inserted waiting: the lane admits what it has room for
        _settle(conn, {(job.namespace, job.lane)}, job.created_at)
    return range(first, last + 1)


#: One job's insert with positional parameters: binding by name cost a fifth of the
#: statement here. _insert_one passes the values in the order of the named ones.
_INSERT_ONE = re.sub(r":(\w+)", "?", Q["job_insert_one"])
if re.findall(r":(\w+)", Q["job_insert_one"]) != [
    "namespace", "queue", "task", "args", "state", "lane", "priority", "run_at",
    "order_time", "expires_at", "ttr", "max_tries", "retry", "unique_key", "stage",
    "context", "meta", "created_at", "timeout",
]:  # fmt: skip
    raise RuntimeError("job_insert_one's parameters are not in _insert_one's order")


def _insert_one(conn: sqlite3.Connection, job: NewJob, args: str) -> int:
    """A plain job (no lane, no unique key): its id."""
    row = (job.namespace, job.queue, job.task, args, job.state.value, job.lane,
           job.priority, job.run_at, job.order_time, job.expires_at, job.ttr,
           job.max_tries, job.retry, job.unique_key, job.stage, job.context, job.meta,
           job.created_at, job.timeout)  # fmt: skip
    return conn.execute(_INSERT_ONE, row).lastrowid or 0


def _inserting(pending: PendingInsert) -> Callable[[sqlite3.Connection], list[Inserted]]:
    return lambda conn: _insert_many(conn, pending.job, pending.args)


def _claim(
    conn: sqlite3.Connection,
    namespace: str,
    queues: Sequence[str],
    limit: int,
    worker: str,
    now: float,
) -> list[Claimed]:
    _promote(conn, namespace, queues, now)
    rated = _rated(conn, namespace)
    if len(queues) == 1 and not rated:
        params = {"namespace": namespace, "queue": queues[0], "limit": limit,
                  "now": now, "worker": worker}  # fmt: skip
        rows = conn.execute(Q["job_claim_queue"], params).fetchall()
    else:
        picked = _pick_ready(conn, namespace, queues, limit, now)
        ids = _gate(conn, namespace, picked, now) if rated else [row[0] for row in picked]
        if not ids:
            return []
        params = {"ids": json.dumps(ids), "now": now, "worker": worker}
        rows = conn.execute(Q["job_claim"], params).fetchall()
    return sorted((Claimed(*row) for row in rows), key=lambda c: (c.order_time, c.id))


def _rated(conn: sqlite3.Connection, namespace: str) -> bool:
    """Whether a rule of the namespace has a rate, so its claims pass the gate."""
    return bool(conn.execute(Q["lane_rated"], {"namespace": namespace}).fetchone()[0])


def _gate(
    conn: sqlite3.Connection, namespace: str, picked: list[tuple[int, str | None, bool]], now: float
) -> list[int]:
    """Of the picked ready jobs, those their lanes' rates let start now (the rest are
    deferred: see ``flows.rate_gate``)."""
    if not picked:
        return []
    return drive(flows.rate_gate(_Session(conn), namespace, picked, now))[0]


def _promote(conn: sqlite3.Connection, namespace: str, queues: Sequence[str], now: float) -> None:
    """Make the due jobs of these queues ready (up to a thousand each)."""
    for queue in queues:
        params = {"namespace": namespace, "queue": queue, "now": now, "limit": 1000}
        conn.execute(Q["job_promote_due_queue"], params)


def _pick_ready(
    conn: sqlite3.Connection, namespace: str, queues: Sequence[str], limit: int, now: float
) -> list[tuple[int, str | None, bool]]:
    """The first ``limit`` ready jobs across ``queues``, in claim order: (id, lane,
    started), as the rate gate reads them.

    One index range per queue, merged here: a single query over ``queue IN (…)`` would
    make SQLite sort the whole backlog.
    """
    candidates: list[tuple[float, int, str | None, bool]] = []
    for queue in queues:
        params = {"namespace": namespace, "queue": queue, "now": now, "limit": limit}
        candidates.extend(conn.execute(Q["job_claim_ids"], params))
    if len(queues) > 1:
        candidates.sort(key=lambda row: (row[0], row[1]))
    return [(job_id, lane, bool(started)) for _, job_id, lane, started in candidates[:limit]]


def _finish_many(
    conn: sqlite3.Connection, finishes: Sequence[Finish], taker: lanes.Taker | None = None
) -> tuple[FinishReport, list[Claimed]]:
    accepted: list[int] = []
    stale: list[int] = []
    in_lanes: dict[int, tuple[str, str]] = {}  # the jobs that left a lane's hold
    to_history = sorted((f for f in finishes if f.kind in _TO_HISTORY), key=_by_id)
    if to_history:
        batch = json.dumps([_history_row(f) for f in to_history])
        conn.execute("SAVEPOINT batch")
        moved = conn.execute(Q["job_finish_batch_to_history"], {"batch": batch}).fetchall()
        if len(moved) == len(to_history):  # the usual case: every token still current
            conn.execute(Q["job_delete_batch"], {"batch": batch})
            accepted.extend(f.id for f in to_history)
            in_lanes.update((job_id, (ns, lane)) for job_id, ns, lane in moved if lane)
        else:  # rare: some tokens are stale, so find out which, one by one
            conn.execute("ROLLBACK TO batch")
            ids = json.dumps([f.id for f in to_history])
            in_lanes.update(
                (r[0], (r[1], r[2])) for r in conn.execute(Q["lane_of_jobs"], {"ids": ids})
            )
            _finish_one_by_one(conn, [_history_params(f) for f in to_history], accepted, stale)
        conn.execute("RELEASE batch")
    for finish in finishes:
        if finish.kind in _TO_HISTORY:
            continue
        cancel = {"id": finish.id, "fence": finish.fence, "state": "cancelled",
                  "now": finish.finished_at}  # fmt: skip
        if cancelled := conn.execute(Q["job_cancel_if_requested"], cancel).fetchone():
            conn.execute(Q["job_delete"], {"id": finish.id})
            accepted.append(finish.id)
            if cancelled[2] is not None:
                in_lanes[finish.id] = (cancelled[1], cancelled[2])
            continue
        statement, params = requeue_statement(finish)
        (accepted if conn.execute(Q[statement], params).rowcount else stale).append(finish.id)
    taken = _settle_finished(conn, finishes, set(accepted), in_lanes, taker) if in_lanes else []
    return FinishReport(accepted, stale), taken


def _settle_finished(
    conn: sqlite3.Connection,
    finishes: Sequence[Finish],
    accepted: set[int],
    in_lanes: dict[int, tuple[str, str]],
    taker: lanes.Taker | None,
) -> list[Claimed]:
    """Lanes whose jobs ended make room; a death may halt its lane."""
    ended: set[tuple[str, str]] = set()
    dead: dict[tuple[str, str], list[int]] = {}
    now = 0.0
    for finish in finishes:
        key = in_lanes.get(finish.id)
        if key is None or finish.id not in accepted:
            continue
        now = max(now, finish.finished_at)
        ended.add(key)  # a requeued job keeps its place: settling changes nothing then
        if finish.kind == "dead":
            dead.setdefault(key, []).append(finish.id)
    return _settle(conn, ended, now, dead, taker)


def _finish_one_by_one(
    conn: sqlite3.Connection,
    rows: Sequence[dict[str, Any]],
    accepted: list[int],
    stale: list[int],
) -> None:
    for params in rows:
        if conn.execute(Q["job_finish_to_history"], params).rowcount:
            conn.execute(Q["job_delete"], {"id": params["id"]})
            accepted.append(params["id"])
        else:
            stale.append(params["id"])


def _history_row(finish: Finish) -> list[Any]:
    error = None if finish.error is None else json.dumps(finish.error)
    return [finish.id, finish.fence, finish.kind, finish.result, error,
            finish.started_at, finish.finished_at]  # fmt: skip


def _history_params(finish: Finish) -> dict[str, Any]:
    return {
        "id": finish.id, "fence": finish.fence, "state": finish.kind, "result": finish.result,
        "error": None if finish.error is None else json.dumps(finish.error),
        "started_at": finish.started_at, "finished_at": finish.finished_at,
    }  # fmt: skip


def _move_terminal(conn: sqlite3.Connection, job_id: int, state: State, now: float) -> bool:
    params = {"id": job_id, "state": state.value, "now": now}
    in_lane = conn.execute(Q["lane_of_jobs"], {"ids": f"[{job_id}]"}).fetchone()
    if conn.execute(Q["job_move_terminal"], params).rowcount:
        conn.execute(Q["job_delete"], {"id": job_id})
        if in_lane is not None:
            _settle(conn, {(in_lane[1], in_lane[2])}, now)
        return True
    return False


def _move_to_history(conn: sqlite3.Connection, statement: str, params: dict[str, Any]) -> set[int]:
    """Move the jobs that ``statement`` copies to history out of the hot table, and
    settle the lanes they leave (a lane frees the place a job held as a finish does)."""
    rows = conn.execute(Q[statement], params).fetchall()
    if not rows:
        return set()
    moved = [row[0] for row in rows]
    conn.execute(Q["job_delete_ids"], {"ids": json.dumps(moved)})
    _settle(conn, {(row[1], row[2]) for row in rows if row[2] is not None}, params["now"])
    return set(moved)


# -- lanes ---------------------------------------------------------------------


def _settle(
    conn: sqlite3.Connection,
    keys: set[tuple[str, str]],
    now: float,
    dead: dict[tuple[str, str], list[int]] | None = None,
    taker: lanes.Taker | None = None,
    *,
    limits_changed: bool = False,
) -> list[Claimed]:
    """Bring each lane to what its rule allows (see ferryq.lanes): halt it behind a
    new dead job if its policy says so, demote, admit; return what ``taker`` took.

    Lanes of limit 1 take the plain path unless a job of theirs just died or their
    limit just changed (see ``_next_of_single``). ``lanes.plan`` decides for the
    others, each read by a glance (see ``_views``), and ``lanes.hand_over`` what
    goes to ``taker``; their admissions go in a write or two for all, one for those
    that keep their own times and one for those handed over.
    """
    if not keys:
        return []
    rule = _RuleBook(conn)
    dead = dead or {}
    for (namespace, lane), ids in sorted(dead.items()):
        if ids and rule(namespace, lane).on_dead == "halt":
            params = {"namespace": namespace, "lane": lane, "job_id": min(ids), "now": now}
            conn.execute(Q["lane_halt"], params)
    single = set() if limits_changed else {k for k in keys - dead.keys() if rule(*k).limit == 1}
    taken = _next_of_single(conn, single, now, taker, rule) if single else []
    admit: list[int] = []  # admitted with their own times: due now or scheduled
    take: list[int] = []
    for view in _views(conn, keys - single, rule):
        plan = lanes.plan(view, now)
        if not plan:
            continue
        for job_id in plan.demote:
            conn.execute(Q["lane_demote"], {"id": job_id})
        handed = lanes.hand_over(view, plan, taker, now)
        for admitted, waiting in zip(plan.admit, view.waiting, strict=False):
            if admitted.id == handed:
                take.append(handed)
            elif (admitted.run_at, admitted.order_time) == (waiting.run_at, waiting.order_time):
                admit.append(admitted.id)
            else:  # behind a job that has not started: its times raised to that job's
                params = {"id": admitted.id, "state": admitted.state.value,
                          "run_at": admitted.run_at, "order_time": admitted.order_time}  # fmt: skip
                conn.execute(Q["lane_admit"], params)
    if admit:
        conn.execute(Q["lane_admit_due"], {"ids": json.dumps(admit), "now": now})
    if not take:
        return taken
    assert taker is not None
    params = {"ids": json.dumps(take), "now": now, "worker": taker.worker}
    return taken + [Claimed(*row) for row in conn.execute(Q["lane_take"], params)]


def _next_of_single(
    conn: sqlite3.Connection,
    keys: set[tuple[str, str]],
    now: float,
    taker: lanes.Taker | None,
    rule: _RuleBook,
) -> list[Claimed]:
    """Settle lanes of limit 1, in a write or two per namespace: a lane that holds
    nothing now and is not halted admits its first waiting job, or hands it to
    ``taker`` unless it has a rate. A lane that holds a job has no room and nothing to
    step back: no job of it just died (a halt steps back what has not started), and any
    it holds over its limit have started (the settle after a limit change stepped back
    the others)."""
    taken: list[Claimed] = []
    for namespace, names in _by_namespace(keys).items():
        left = names
        unrated = [name for name in names if rule(namespace, name).rate is None]
        if taker is not None and taker.budget > 0 and namespace == taker.namespace and unrated:
            params = {"namespace": namespace, "lanes": json.dumps(unrated), "now": now,
                      "queues": json.dumps(list(taker.queues)), "worker": taker.worker,
                      "budget": taker.budget}  # fmt: skip
            claimed = [Claimed(*row) for row in conn.execute(Q["lane_take_next"], params)]
            taker.budget -= len(claimed)
            taken += claimed
            if claimed:
                done = {c.lane for c in claimed}
                left = [name for name in names if name not in done]
        if left:
            params = {"namespace": namespace, "lanes": json.dumps(left), "now": now}
            conn.execute(Q["lane_admit_next"], params)
    return taken


def _views(conn: sqlite3.Connection, keys: set[tuple[str, str]], rule: _RuleBook) -> list[LaneView]:
    """The lanes as ``lanes.plan`` reads them. One glance per namespace reads, for every
    lane, how many jobs it holds and how many of those have not started, the job that
    halts it and its first waiting job: index seeks only. That is the whole lane as a
    plan reads it when every job it holds has started (a plan reads no more of them:
    ``lanes.STARTED``) and it has room for one job at most; any other lane is read in
    full, its held jobs and its first ``limit`` waiting ones."""
    found: list[LaneView] = []
    for namespace, names in _by_namespace(keys).items():
        params = {"namespace": namespace, "lanes": json.dumps(names)}
        for lane, held, unstarted, halted_by, *first in conn.execute(
            Q["lane_glance"], params
        ).fetchall():
            lane_rule = rule(namespace, lane)
            if unstarted or (lane_rule.limit - held > 1 and first[0] is not None):
                found.append(_view(conn, namespace, lane, lane_rule))
                continue
            waiting = [] if first[0] is None else [Candidate(*first)]
            found.append(
                LaneView(namespace, lane, lane_rule, halted_by, [lanes.STARTED] * held, waiting)
            )
    return found


def _by_namespace(keys: set[tuple[str, str]]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for namespace, lane in sorted(keys):
        found.setdefault(namespace, []).append(lane)
    return found


class _RuleBook:
    """The rule of a lane, reading each namespace's rules once."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.rules: dict[str, list[LaneRule]] = {}

    def __call__(self, namespace: str, lane: str) -> LaneRule:
        if namespace not in self.rules:
            self.rules[namespace] = _rules(self.conn, namespace)
        return lanes.rule_for(self.rules[namespace], lane)


def _rules(conn: sqlite3.Connection, namespace: str) -> list[LaneRule]:
    rows = conn.execute(Q["lane_rules"], {"namespace": namespace})
    return [lane_rule(*row) for row in rows]


def _view(conn: sqlite3.Connection, namespace: str, lane: str, rule: LaneRule) -> LaneView:
    key = {"namespace": namespace, "lane": lane}
    halted = conn.execute(Q["lane_halted_by"], key).fetchone()
    held = [
        Held(i, State(state), bool(started), run_at, order, queue)
        for i, state, started, run_at, order, queue in conn.execute(Q["lane_held"], key)
    ]
    waiting_rows = conn.execute(Q["lane_waiting"], {**key, "limit": rule.limit})
    waiting = [Candidate(*row) for row in waiting_rows]
    return LaneView(namespace, lane, rule, None if halted is None else halted[0], held, waiting)


def _apply(conn: sqlite3.Connection, plan: lanes.Plan) -> None:
    for job_id in plan.demote:
        conn.execute(Q["lane_demote"], {"id": job_id})
    for admit in plan.admit:
        params = {"id": admit.id, "state": admit.state.value, "run_at": admit.run_at,
                  "order_time": admit.order_time}  # fmt: skip
        conn.execute(Q["lane_admit"], params)


def _matching(conn: sqlite3.Connection, namespace: str, pattern: str) -> set[tuple[str, str]]:
    """The lanes with hot jobs that a rule's pattern names."""
    if not pattern.endswith("*"):
        return {(namespace, pattern)}
    params = {"namespace": namespace, "prefix": pattern[:-1]}
    return {(namespace, row[0]) for row in conn.execute(Q["lane_names"], params)}


def _release(conn: sqlite3.Connection, job_ids: Sequence[int]) -> dict[tuple[str, str], int]:
    """Lift the halts these dead jobs put on their lanes: each lane, with its job."""
    rows = conn.execute(Q["lane_release"], {"ids": json.dumps(list(job_ids))}).fetchall()
    return {(r[0], r[1]): r[2] for r in rows}


def _get(conn: sqlite3.Connection, job_id: int) -> Job | None:
    row = conn.execute(Q["job_get_hot"], {"id": job_id}).fetchone()
    if row is None:
        row = conn.execute(Q["job_get_history"], {"id": job_id}).fetchone()
    return None if row is None else job_from_row(row)


def _periodic(conn: sqlite3.Connection, namespace: str) -> list[base.PeriodicState]:
    rows = conn.execute(Q["periodic_list"], {"namespace": namespace})
    return [base.PeriodicState(*row) for row in rows]


def _list(conn: sqlite3.Connection, where: JobFilter) -> list[Job]:
    sql, params = list_query(where)
    return [job_from_row(row) for row in conn.execute(sql, params)]


def _by_id(finish: Finish) -> int:
    return finish.id
