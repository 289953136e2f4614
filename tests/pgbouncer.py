"""A real PgBouncer in transaction mode in front of the tests' PostgreSQL.

``pgbouncer`` (session) starts the machine's ``pgbouncer`` (Debian's package, installed
by ``scripts/ensure-pgbouncer.sh``, or ``FERRYQ_TEST_PGBOUNCER``) in front of the
session's cluster (``pg_cluster``, tests/pg.py), configured as managed poolers run it:
``pool_mode = transaction``, ``default_pool_size = 10``, no startup parameters beyond
the usual few accepted. It listens on 127.0.0.1 on a free port, runs as the cluster's
unprivileged user when the tests run as root (PgBouncer refuses to run as root), and is
stopped when the session ends. Every database of the cluster is reachable through it
under its own name (a ``*`` entry), so any fresh database of tests/pg.py is too.

``pgbouncer_url`` (function) is a fresh migrated database (tests/pg.py), as a client
reaches it through the pooler. It carries no ``pooler=`` switch: a test of the store's
pooler mode adds ``?pooler=transaction`` itself, as a user would.

The admin console (``Bouncer.admin``: the ``pgbouncer`` database, simple query protocol
only) answers ``SHOW CONFIG``, ``SHOW POOLS`` and the like.

Without a pgbouncer binary the tests that use it are skipped, except under CI
(``CI=true``), where that is a failure.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urlsplit

import psycopg
import pytest
from psycopg.rows import TupleRow

from tests.pg import (
    PgCluster,
    _Account,  # who runs the server's programs: the same user runs the pooler
    _free_port,
    _temp_root,
    fresh_database,
    in_ci,
    orphans,
)

BINARY_ENV = "FERRYQ_TEST_PGBOUNCER"
DEBIAN_BINARY = Path("/usr/sbin/pgbouncer")  # not on a non-root user's PATH
DIR_PREFIX = "ferryq-pgbouncer-"
POOL_SIZE = 10
START_SECONDS = 60.0  # from exec to accepting: a bound for a hang, not a speed
STOP_SECONDS = 30.0
POLL = 0.01  # seconds between two looks at a condition (not a wait for anything)
BIND_ATTEMPTS = 5


class BouncerError(Exception):
    """The pooler could not be configured, started or stopped."""


def find_pgbouncer() -> Path | None:
    """``FERRYQ_TEST_PGBOUNCER``, else ``pgbouncer`` on the PATH, else Debian's place."""
    named = os.environ.get(BINARY_ENV, "").strip()
    if named:
        return Path(named) if os.access(named, os.X_OK) else None
    found = shutil.which("pgbouncer")
    if found is not None:
        return Path(found)
    return DEBIAN_BINARY if os.access(DEBIAN_BINARY, os.X_OK) else None


class Bouncer:
    """One PgBouncer process in a temporary directory, in front of the server at
    ``server_url``; ``start``/``stop``/``kill`` for tests of a pooler that goes away."""

    def __init__(self, binary: Path, server_url: str) -> None:
        self.binary = binary
        self.server = urlsplit(server_url)
        self.user = unquote(self.server.username or "postgres")
        self.account = _Account.for_server()
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self._destroyed = False
        root = _temp_root(self.account)
        if root is not None:
            _reap_orphans(Path(root), self.account)
        self.base = Path(tempfile.mkdtemp(prefix=DIR_PREFIX, dir=root))
        atexit.register(self.destroy)
        (self.base / "owner").write_text(f"{os.getpid()}\n")
        self.config = self.base / "pgbouncer.ini"
        self.log = self.base / "pgbouncer.log"
        self._write_users()
        self.account.give(self.base)

    @property
    def admin_url(self) -> str:
        return self.url("pgbouncer")

    def url(self, database: str) -> str:
        """The URL of ``database`` through the pooler, as the server's URL names its user."""
        userinfo = self.server.netloc.rpartition("@")[0]
        at = f"{userinfo}@" if userinfo else ""
        return f"postgresql://{at}127.0.0.1:{self.port}/{database}"

    def through(self, url: str) -> str:
        """``url`` (a database of the cluster) as reached through the pooler; query kept."""
        parts = urlsplit(url)
        rebuilt = self.url(parts.path.lstrip("/"))
        return f"{rebuilt}?{parts.query}" if parts.query else rebuilt

    def admin(self) -> psycopg.Connection[TupleRow]:
        """A connection to the admin console. It speaks only the simple query protocol:
        use ``ClientCursor`` (``conn.cursor()`` here) and no parameters."""
        return psycopg.connect(self.admin_url, autocommit=True, connect_timeout=10,
                               cursor_factory=psycopg.ClientCursor)  # fmt: skip

    def clients(self, database: str) -> int:
        """The pooler's clients of ``database`` (``SHOW CLIENTS``). A query's
        cancellation is a message on a socket of its own, which PgBouncer lists as a
        client while it passes it on (``…_cancel_req``): no connection, not counted."""
        with self.admin() as admin:
            cursor = admin.cursor()
            cursor.execute("SHOW CLIENTS")
            assert cursor.description is not None
            names = [column.name for column in cursor.description]
            rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
        return sum(1 for row in rows
                   if row["database"] == database and "cancel" not in row["state"])  # fmt: skip

    def create(self) -> None:
        """Choose a port and start; another port if one was taken meanwhile."""
        for attempt in range(BIND_ATTEMPTS):
            self.port = _free_port()
            self._write_config()
            try:
                self.start()
                return
            except BouncerError:
                if attempt == BIND_ATTEMPTS - 1 or "Address already in use" not in self._tail():
                    raise

    def start(self) -> None:
        """Start the pooler on its port and return once it accepts connections."""
        if self.running:
            return
        self.log.unlink(missing_ok=True)  # one start's log: a failure quotes only its own
        env = {key: value for key, value in os.environ.items() if not key.startswith("PG")}
        argv = [str(self.binary), str(self.config)]
        # The parent-death signal stops the pooler with this process even when it dies by
        # SIGKILL and atexit never runs. The kernel sends it when the starting *thread*
        # ends, so only the main thread (pytest's, which lasts the session) arms it.
        if shutil.which("setpriv") and threading.current_thread() is threading.main_thread():
            argv = ["setpriv", "--pdeathsig", "TERM", "--", *argv]
        self.process = subprocess.Popen(
            self.account.command(argv), cwd=self.base, env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self._wait_accepting()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        """SIGTERM (PgBouncer's immediate shutdown: clients are cut off), then reaped."""
        self._end(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL: the pooler dies as a crashed one does."""
        self._end(signal.SIGKILL)

    def destroy(self) -> None:
        """Stop the pooler however it is doing and delete its directory; safe to repeat."""
        if self._destroyed:
            return
        self._destroyed = True
        atexit.unregister(self.destroy)
        with contextlib.suppress(BouncerError):
            self.stop()
        shutil.rmtree(self.base, ignore_errors=True)

    def _end(self, sig: signal.Signals) -> None:
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.send_signal(sig)
        try:
            process.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            said = f"pgbouncer did not exit {STOP_SECONDS} s after {sig.name}"
            raise BouncerError(said) from None

    def _write_users(self) -> None:
        """PgBouncer's ``trust`` still wants the user listed; the password, if the
        server's URL has one, is what PgBouncer logs in to the server with."""
        password = unquote(self.server.password or "")
        users = self.base / "users.txt"
        users.write_text(f'"{_quoted(self.user)}" "{_quoted(password)}"\n')
        users.chmod(0o600)
        self.account.give(users)

    def _write_config(self) -> None:
        host = self.server.hostname or "127.0.0.1"
        server_port = self.server.port or 5432
        settings = {
            "listen_addr": "127.0.0.1",
            "listen_port": str(self.port),
            "unix_socket_dir": "",  # TCP only: no socket file in /tmp to collide on
            "auth_type": "trust",
            "auth_file": str(self.base / "users.txt"),
            "admin_users": self.user,
            "pool_mode": "transaction",
            "default_pool_size": str(POOL_SIZE),
            "max_client_conn": "1000",  # room for many worker processes' clients
            "server_login_retry": "1",  # a server restarted by a test is back at once
            "logfile": str(self.log),
            "log_connections": "0",
            "log_disconnections": "0",
        }
        lines = [
            "[databases]",
            f"* = host={host} port={server_port}",
            "",
            "[pgbouncer]",
            *(f"{key} = {value}" for key, value in settings.items()),
        ]
        self.config.write_text("\n".join(lines) + "\n")
        self.account.give(self.config)

    def _wait_accepting(self) -> None:
        """Poll the admin console until it answers; fail at once if the pooler exits."""
        deadline = time.monotonic() + START_SECONDS
        while True:
            assert self.process is not None
            if self.process.poll() is not None:
                code = self.process.returncode
                raise BouncerError(f"pgbouncer exited with {code}:\n{self._tail()}")
            try:
                with self.admin() as conn:
                    conn.execute("SHOW VERSION")
                return
            except psycopg.OperationalError as exc:
                if time.monotonic() > deadline:
                    self._end(signal.SIGKILL)
                    raise BouncerError(
                        f"pgbouncer does not accept connections after {START_SECONDS} s: "
                        f"{exc}\n{self._tail()}"
                    ) from exc
                time.sleep(POLL)

    def _tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def _quoted(text: str) -> str:
    """A value of PgBouncer's auth_file, whose quotes are doubled inside a field."""
    return text.replace('"', '""')


def _reap_orphans(root: Path, account: _Account) -> None:
    """Directories left by sessions that died without cleaning up (their poolers died
    with them: the parent-death signal)."""
    for base in orphans(root, DIR_PREFIX, account):
        shutil.rmtree(base, ignore_errors=True)


def _missing_message() -> str:
    return (
        f"pgbouncer was not found ({BINARY_ENV}, the PATH, {DEBIAN_BINARY}). Install it "
        "(Debian: apt-get install pgbouncer, or run scripts/ensure-pgbouncer.sh as root) "
        f"or set {BINARY_ENV} to a pgbouncer executable."
    )


@pytest.fixture(scope="session")
def pgbouncer(pg_cluster: PgCluster) -> Iterator[Bouncer]:
    """The session's PgBouncer, transaction mode, in front of ``pg_cluster``."""
    with local_bouncer(pg_cluster) as bouncer:
        yield bouncer


@contextlib.contextmanager
def local_bouncer(cluster: PgCluster) -> Iterator[Bouncer]:
    """A PgBouncer in front of ``cluster``, started; stopped and deleted on exit.
    Without the binary the test is skipped (a failure under CI)."""
    binary = find_pgbouncer()
    if binary is None:
        if in_ci():
            pytest.fail(f"CI=true and {_missing_message()}", pytrace=False)
        pytest.skip(_missing_message())
    try:
        bouncer = Bouncer(binary, cluster.url)
    except OSError as exc:
        pytest.fail(f"could not prepare a PgBouncer: {exc}", pytrace=False)
    try:
        bouncer.create()
    except (BouncerError, OSError) as exc:
        bouncer.destroy()
        pytest.fail(f"could not start a PgBouncer: {exc}", pytrace=False)
    try:
        yield bouncer
    finally:
        bouncer.destroy()


@pytest.fixture
def pgbouncer_url(pg_cluster: PgCluster, pgbouncer: Bouncer) -> Iterator[str]:
    """A new migrated database for this test alone, through the pooler; dropped after it."""
    with fresh_database(pg_cluster, made_ahead=True) as url:
        try:
            yield pgbouncer.through(url)
        finally:
            if not pgbouncer.running:
                pgbouncer.start()  # a test stopped it and did not start it again
