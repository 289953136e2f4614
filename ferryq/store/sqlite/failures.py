"""What SQLite's errors mean for the store: a refusal of the values written, a full
disk, a database this process cannot write, or anything else, each said in one line
naming the file; and the looks at the disk that tell them apart."""

from __future__ import annotations

import math
import os
import sqlite3
from pathlib import Path

from ferryq.errors import DatabaseReadOnly, DiskFull, StoreError

#: Free bytes under which a disk I/O error is taken for a full disk (SQLite reports
#: some writes that found no space, such as growing the -shm file, as I/O errors).
NEARLY_FULL = 1 << 20

#: Result codes that refuse the values written, whatever the moment: a write that got
#: them would get them again (where busy, locked, I/O, full and read-only may pass).
REFUSALS = frozenset(
    (
        sqlite3.SQLITE_TOOBIG,
        sqlite3.SQLITE_CONSTRAINT,
        sqlite3.SQLITE_MISMATCH,
        sqlite3.SQLITE_RANGE,
    )
)
#: Result codes of a write that found no space (see NEARLY_FULL for I/O errors).
NO_SPACE = frozenset((sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR))
#: Result codes of a database this process may not write, or whose -wal and -shm files
#: it cannot make.
CANNOT_WRITE = frozenset((sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_PERM))
#: A store that only reads falls back to opening the file to read on these.
READ_INSTEAD = CANNOT_WRITE | NO_SPACE


def primary(error: sqlite3.Error) -> int:
    """The primary result code of a SQLite error (SQLITE_IOERR for SQLITE_IOERR_WRITE)."""
    return getattr(error, "sqlite_errorcode", 0) & 0xFF


def failure(file: Path, error: sqlite3.Error, doing: str) -> StoreError:
    """The ferryq error for SQLite's ``error``, met while ``doing`` (opening, reading,
    writing) the database ``file``: one line saying what is wrong."""
    code = primary(error)
    name = f"SQLite database {file}"
    if code == sqlite3.SQLITE_FULL or (
        code == sqlite3.SQLITE_IOERR and free_space(file.parent) < NEARLY_FULL
    ):
        return DiskFull(f"{name}: the disk is full ({doing}: {error})")
    if code in CANNOT_WRITE and (why := why_read_only(file)) is not None:
        return read_only(file, why)
    if code == sqlite3.SQLITE_IOERR:
        return StoreError(f"{name}: a disk I/O error ({doing}: {error})")
    return StoreError(f"{name}: {error} ({doing})")


def read_only(file: Path, why: str) -> DatabaseReadOnly:
    if not file.exists():
        return DatabaseReadOnly(f"cannot create SQLite database {file} ({why})")
    return DatabaseReadOnly(
        f"SQLite database {file} is read-only ({why}): commands that write need write access"
    )


def why_read_only(file: Path) -> str | None:
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


def free_space(folder: Path) -> float:
    """Bytes free for this process on the disk of ``folder`` (infinite if unknown)."""
    try:
        found = os.statvfs(folder)
    except OSError:
        return math.inf
    return float(found.f_bavail * found.f_frsize)


def truncate_wal(conn: sqlite3.Connection) -> bool:
    """Checkpoint the whole WAL and cut its file to nothing; whether that worked."""
    try:
        busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    except sqlite3.Error:
        return False  # still no room to move the WAL's pages into the database
    return int(busy) == 0
