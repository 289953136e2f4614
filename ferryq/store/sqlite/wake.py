"""Wake-ups between SQLite stores, across processes, without polling.

SQLite has no LISTEN/NOTIFY. A store that waits for other connections' writes binds
a Unix datagram socket in a folder beside the database, ``<database file>-wake/``
(next to SQLite's own ``-wal`` and ``-shm``); the socket file is its registration.
After each write transaction that changed rows, a store sends one byte, without
blocking, to every socket in that folder: the waiting stores wake, look at
``PRAGMA data_version`` and find out for themselves whether something is new. The
datagram carries no meaning, so a lost or extra one costs nothing but a look:

- a socket whose queue is full (EAGAIN) is already woken;
- a socket file no process listens on any more (its process died: ECONNREFUSED) is
  removed by the first store that finds it so;
- a writer that sends nothing (an older ferryq, another program) is still seen by a
  waiting store's check of ``data_version`` every ``SAFETY_POLL`` seconds.

A writer reads the folder once and again only when its modification time changes
(one ``stat`` per commit). File-system time stamps are coarse (a few ms), so a
listing made within ``SETTLE`` seconds of the folder's last change is read again at
the next commit: a socket bound in the same tick as an earlier change is never missed.

Sockets live in the folder, not in Linux's abstract namespace: a path is reachable
from every process that can reach the database file, including containers that
share the file but not a network namespace, where an abstract name would not be.
A path longer than a socket address allows is reached through the folder's file
descriptor (``/proc/self/fd/N/name``) on Linux. The folder and its sockets take the
database file's permission bits, as SQLite's ``-wal`` and ``-shm`` files do. Where a
socket cannot be made (no Unix sockets, a folder that cannot be made or written),
``Bell.open`` returns None and the store polls ``data_version`` instead, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import secrets
import socket
import stat
import sys
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("ferryq.store.sqlite")

#: The folder beside a database file in which waiting stores bind their sockets.
FOLDER_SUFFIX = "-wake"
#: Seconds between a waiting store's own looks at ``data_version``, for writers that
#: send no wake-ups (an older ferryq, another program writing the file).
SAFETY_POLL = 1.0
#: A folder listing made less than this long after the folder changed may miss a
#: socket bound within the same tick of the file system's clock: it is read again.
SETTLE = 0.05
_NAME = re.compile(r"\d+-[0-9a-f]{8}\.sock")
_MAX_ADDRESS = 107  # bytes of a socket path, leaving room for the final NUL
_RING = b"\x01"
_reported: set[str] = set()  # folders whose missing wake-ups were logged


def folder_of(database: str | os.PathLike[str]) -> Path:
    """The wake-up folder of a database file, beside the file SQLite opens."""
    return Path(f"{os.path.realpath(database)}{FOLDER_SUFFIX}")


class _Folder:
    """Addresses of sockets in the folder, by path, or through an open descriptor
    of the folder when the path is too long for a socket address (Linux)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._inode = -1

    def address(self, name: str, inode: int) -> str | None:
        full = os.path.join(self.path, name)
        if len(os.fsencode(full)) <= _MAX_ADDRESS:
            return full
        if not sys.platform.startswith("linux"):
            return None
        if self._fd is None or self._inode != inode:
            self.close()
            self._fd = os.open(self.path, os.O_PATH | os.O_DIRECTORY)
            self._inode = os.fstat(self._fd).st_ino
        return f"/proc/self/fd/{self._fd}/{name}"

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


class Notifier:
    """The sending side of a store: after a commit, a byte to every waiting store."""

    def __init__(self, folder: Path) -> None:
        self._folder = _Folder(folder)
        self._stamp: tuple[int, int] | None = None  # the folder's inode and mtime when read
        self._settled = False  # read SETTLE seconds after its last change or later
        self._targets: list[tuple[str, str]] = []  # (socket name, address)
        self._sock: socket.socket | None = None
        self._told: tuple[object, int] | None = None  # a connection and its total_changes
        # The store's own socket, if it waits: sent to only while one of its waits is
        # under way (other stores' sockets always, since their waits cannot be seen).
        self._own: Bell | None = None

    def listen(self, own: Bell | None) -> None:
        """The store's own bell (None once it stops listening)."""
        self._own, self._stamp = own, None  # the next commit lists the others again

    def committed(self, conn: object, total_changes: int, quiet: bool = False) -> None:
        """After a commit on ``conn``: wake the waiting stores, unless the commit
        changed no row (``total_changes`` as before: it told nobody anything) or is
        ``quiet`` (it wrote what no wait looks for)."""
        told = (conn, total_changes)
        if told == self._told:
            return
        self._told = told
        if quiet:
            return
        try:
            self._send()
        except OSError as exc:  # never fails a commit: waiters still look every second
            log.debug("SQLite wake-ups in %s failed: %s", self._folder.path, exc)

    def ring(self) -> None:
        """Wake the waiting stores, whatever wrote (an application's own commit)."""
        self._send()

    def _send(self) -> None:
        own = self._own
        targets = self._listeners()
        if own is not None and own.waiting:
            targets = [*targets, (own.name, own.address)]
        if not targets:
            return
        sock = self._sock
        if sock is None:
            sock = self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            sock.setblocking(False)
        gone: list[str] = []
        for name, address in targets:
            try:
                sock.sendto(_RING, address)
            except BlockingIOError:
                pass  # its queue is full: it is woken already
            except (ConnectionRefusedError, FileNotFoundError):
                gone.append(name)
            except OSError:
                pass  # not ours to wake (permissions): it looks every SAFETY_POLL
        if gone:
            self._forget(gone)

    def _listeners(self) -> list[tuple[str, str]]:
        try:
            found = os.stat(self._folder.path)
        except OSError:
            self._stamp, self._targets = None, []
            return []
        stamp = (found.st_ino, found.st_mtime_ns)
        if stamp != self._stamp or not self._settled:
            self._read(stamp)
        return self._targets

    def _read(self, stamp: tuple[int, int]) -> None:
        now = time.time_ns()
        own = self._own.name if self._own is not None else None
        targets = []
        with os.scandir(self._folder.path) as entries:
            for entry in entries:
                if _NAME.fullmatch(entry.name) and entry.name != own:
                    address = self._folder.address(entry.name, stamp[0])
                    if address is not None:
                        targets.append((entry.name, address))
        self._targets, self._stamp = targets, stamp
        self._settled = now - stamp[1] >= SETTLE * 1e9

    def _forget(self, names: list[str]) -> None:
        """Remove the sockets no process listens on any more."""
        for name in names:
            path = self._folder.path / name
            with contextlib.suppress(OSError):
                if stat.S_ISSOCK(os.lstat(path).st_mode):
                    path.unlink()
                    log.debug("removed the wake-up socket %s: its process is gone", path)
        self._targets = [t for t in self._targets if t[0] not in names]

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
        self._folder.close()
        self._stamp, self._targets, self._told = None, [], None


class Bell:
    """The receiving side of a waiting store: a socket in the folder, read by the
    store's event loop. ``until`` waits for a condition that only a write can make
    true, looking again at each wake-up and every SAFETY_POLL seconds."""

    def __init__(self, sock: socket.socket, folder: _Folder, name: str, address: str,
                 loop: asyncio.AbstractEventLoop) -> None:  # fmt: skip
        self._sock = sock
        self._folder = folder
        self.name = name
        self.address = address
        self.loop = loop
        self.waiting = 0  # waits under way (read by writers on other threads)
        self._rung: asyncio.Future[None] | None = None
        loop.add_reader(sock.fileno(), self._drain)

    @classmethod
    def open(cls, database: Path, loop: asyncio.AbstractEventLoop) -> Bell | None:
        """A bell for ``database`` on ``loop``; None where wake-ups cannot be had (said
        once per folder in the log), and the store then polls."""
        path = folder_of(database)
        folder = _Folder(path)
        name = f"{os.getpid()}-{secrets.token_hex(4)}.sock"
        sock: socket.socket | None = None
        try:
            mode = _folder_mode(os.stat(database).st_mode)
            with contextlib.suppress(FileExistsError):
                os.mkdir(path, mode)
                os.chmod(path, mode)  # not the umask's: every writer may send
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            sock.setblocking(False)
            address = folder.address(name, os.stat(path).st_ino)
            if address is None:
                raise OSError(f"the path {path / name} is too long for a socket")
            sock.bind(address)
            os.chmod(address, mode & 0o666)
            return cls(sock, folder, name, address, loop)
        except (OSError, AttributeError, NotImplementedError) as exc:
            if sock is not None:
                sock.close()
                with contextlib.suppress(OSError):
                    (path / name).unlink()
            folder.close()
            if str(path) not in _reported:
                _reported.add(str(path))
                log.info("SQLite database %s: no wake-ups between processes here (%s): "
                         "waits poll the database instead", database, exc)  # fmt: skip
            return None

    async def until(self, happened: Callable[[], bool], within: float) -> bool:
        """Whether ``happened()`` within ``within`` seconds. It is asked first, after
        each wake-up and every SAFETY_POLL seconds; a wake-up that comes between a
        look and the wait is not lost (the wait is set up before the look)."""
        deadline = time.monotonic() + within
        self.waiting += 1
        try:
            while True:
                if self._rung is None or self._rung.done():
                    self._rung = self.loop.create_future()
                rung = self._rung
                if happened():
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                await asyncio.wait((rung,), timeout=min(left, SAFETY_POLL))
        finally:
            self.waiting -= 1

    def _drain(self) -> None:
        with contextlib.suppress(OSError):
            while self._sock.recv(16):
                pass
        if self._rung is not None and not self._rung.done():
            self._rung.set_result(None)

    def close(self) -> None:
        """Stop listening and remove the socket; from any thread, even after the
        event loop closed."""
        with contextlib.suppress(OSError):
            os.unlink(self._folder.path / self.name)
        loop = self.loop
        if loop.is_closed():
            self._release()
            return
        try:
            current = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        if loop.is_running() and current is not loop:
            with contextlib.suppress(RuntimeError):  # closed meanwhile
                loop.call_soon_threadsafe(self._stop_reading)
                return
            self._release()
            return
        self._stop_reading()

    def _stop_reading(self) -> None:
        """On the loop's thread: waits under way look once more, and end (the store
        is closed, so its data version reads as unknown)."""
        if not self.loop.is_closed():
            self.loop.remove_reader(self._sock.fileno())
            if self._rung is not None and not self._rung.done():
                self._rung.set_result(None)
        self._release()

    def _release(self) -> None:
        self._sock.close()
        self._folder.close()


def _folder_mode(database_mode: int) -> int:
    """The folder's permission bits from the database file's: whoever may read the
    file may enter the folder, whoever may write it may add a socket."""
    readable = database_mode & 0o444
    return (database_mode & 0o666) | (readable >> 2)
