"""A throwaway PostgreSQL for the tests.

``pg_cluster`` (session) is a cluster of the suite's own: initdb in a temporary directory
from the machine's server binaries, listening on 127.0.0.1 only, tuned for speed over
durability, stopped and deleted when the session ends. With ``FERRYQ_TEST_PG_URL`` set,
that server is used as it is instead, and cannot be restarted.

``pg_url`` (function) is a fresh database on that cluster for one test, dropped after
it, already migrated: it is a copy (``CREATE DATABASE ... TEMPLATE``) of a template that
ferryq's migrations built once per cluster and session, which is much cheaper than
migrating every test's database. The cluster lives in memory when the machine has
room (``MEMORY_ROOT``), where a copy takes a few hundredths of a second; each copy is
still made ahead, in a thread of its own while the test before runs (``_Spare``), so
the test finds its database ready. ``pg_empty_url`` is a fresh database with no schema
at all, for tests of what happens before or during migrations.

Under pytest-xdist every worker process is a session of its own: it starts its own
cluster (or, with ``FERRYQ_TEST_PG_URL``, makes its own template database on the shared
server), and its databases are named after its process id, so workers never meet.

Without server binaries or a URL the PostgreSQL tests are skipped, except under CI
(``CI=true``), where that is a failure. ``scripts/ensure-postgres.sh`` installs the
binaries when run as root.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import itertools
import os
import pwd
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import TupleRow

URL_ENV = "FERRYQ_TEST_PG_URL"
SERVER_USER = "ferryq-pg"  # the OS user that runs the server when the tests run as root
SUPERUSER = "ferryq"  # the database role the tests connect as
DATABASE = "ferryq_test"
TEMPLATE_PREFIX = "ferryq_tpl_"  # then this process's id: one template per session
DIR_PREFIX = "ferryq-pg-"
SERVER_BINARIES = ("initdb", "pg_ctl", "postgres")
DEBIAN_ROOT = Path("/usr/lib/postgresql")
TIMEOUT = 60  # seconds for any one server command
SOCKET_NAME_ROOM = len(f"/{DIR_PREFIX}xxxxxxxx/sockets/.s.PGSQL.65535")

SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "200",
    "shared_buffers": "'256MB'",
}

#: A cluster in memory keeps less WAL: every test's database is a copy, written there.
IN_MEMORY_SETTINGS = {"max_wal_size": "'256MB'"}
#: The tests' clusters live in memory (a tmpfs) when it has this much room: a copy of
#: the migrated template, one per test, takes 0.03 s there against 0.3-0.5 s on disk,
#: where it waits for the disk although fsync is off. Nothing the tests check depends on
#: surviving the machine; the benchmarks' clusters stay on disk (bench/pg_cluster.py).
MEMORY_ROOT = Path("/dev/shm")
MEMORY_ROOM = 2 << 30


class ClusterError(Exception):
    """The throwaway cluster could not be created, started or stopped."""


class PgCluster(Protocol):
    """What a test may do with the session's PostgreSQL."""

    @property
    def url(self) -> str: ...

    @property
    def can_restart(self) -> bool: ...

    def restart(self) -> None: ...

    def stop(self) -> None: ...

    def start(self) -> None: ...


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1")


def find_server_bindir() -> Path | None:
    """``pg_config --bindir``, then Debian's /usr/lib/postgresql/<ver>/bin, newest first."""
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config is not None:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            found = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=True
            )
            if found.stdout.strip():
                candidates.append(Path(found.stdout.strip()))
    candidates.extend(sorted(DEBIAN_ROOT.glob("*/bin"), key=_version_key, reverse=True))
    for bindir in candidates:
        if all(os.access(bindir / name, os.X_OK) for name in SERVER_BINARIES):
            return bindir
    return None


def _version_key(bindir: Path) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in bindir.parent.name.split("."))
    except ValueError:
        return (-1,)


def with_database(url: str, name: str) -> str:
    """``url`` with its database replaced by ``name``; user, host and query are kept."""
    parts = urlsplit(url)
    rebuilt = f"{parts.scheme}://{parts.netloc}/{name}"
    if parts.query:
        rebuilt += f"?{parts.query}"
    return rebuilt


def _admin(url: str) -> psycopg.Connection[TupleRow]:
    return psycopg.connect(url, autocommit=True, connect_timeout=10)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass(frozen=True)
class _Account:
    """Who runs initdb, pg_ctl and postgres: this process's user, or SERVER_USER for root."""

    uid: int | None = None  # None: the current user, nothing to switch
    gid: int | None = None

    @classmethod
    def for_server(cls) -> _Account:
        if os.geteuid() != 0:
            return cls()
        entry = _server_user()
        return cls(entry.pw_uid, entry.pw_gid)

    def command(self, argv: Sequence[str]) -> list[str]:
        if self.uid is None:
            return list(argv)
        if shutil.which("setpriv"):
            ids = [f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups"]
            return ["setpriv", *ids, "--", *argv]
        if shutil.which("runuser"):
            return ["runuser", "-u", SERVER_USER, "--", *argv]
        return ["su", "-s", "/bin/sh", SERVER_USER, "-c", shlex.join(argv)]

    def give(self, path: Path) -> None:
        if self.uid is not None and self.gid is not None:
            os.chown(path, self.uid, self.gid)

    def owns(self, path: Path) -> bool:
        return path.stat().st_uid == (os.geteuid() if self.uid is None else self.uid)


def _server_user() -> pwd.struct_passwd:
    """SERVER_USER, created as a system user without a home on first use (initdb refuses root)."""
    with contextlib.suppress(KeyError):
        return pwd.getpwnam(SERVER_USER)
    useradd = shutil.which("useradd")
    if useradd is None:
        raise ClusterError(
            f"running as root, PostgreSQL needs an unprivileged user {SERVER_USER!r}, "
            "and useradd is not available to create it"
        )
    shell = "/usr/sbin/nologin" if os.path.exists("/usr/sbin/nologin") else "/bin/false"
    created = subprocess.run(
        [useradd, "--system", "--no-create-home", "--home-dir", "/nonexistent",
         "--shell", shell, "--user-group", SERVER_USER],
        capture_output=True, text=True, timeout=TIMEOUT, check=False,
    )  # fmt: skip
    try:
        return pwd.getpwnam(SERVER_USER)  # also fine when a parallel run created it first
    except KeyError:
        raise ClusterError(
            f"could not create the system user {SERVER_USER!r}: {created.stderr.strip()}"
        ) from None


def _temp_root(account: _Account, *, in_memory: bool = False) -> str | None:
    """A temporary directory the server's user can reach, short enough for socket paths;
    ``in_memory``: the machine's shared-memory tmpfs first, when it has room."""
    roots = [tempfile.gettempdir(), "/tmp"]
    if in_memory and _has_room(MEMORY_ROOT):
        roots.insert(0, str(MEMORY_ROOT))
    for root in roots:
        resolved = Path(root).resolve()
        if len(str(resolved)) + SOCKET_NAME_ROOM >= 100:
            continue
        if account.uid is not None and not all(
            p.stat().st_mode & stat.S_IXOTH for p in (resolved, *resolved.parents)
        ):
            continue
        return str(resolved)
    return None


def _has_room(root: Path) -> bool:
    try:
        return root.is_dir() and shutil.disk_usage(root).free >= MEMORY_ROOM
    except OSError:
        return False


class LocalCluster:
    """A cluster in a temporary directory, owned by this test session. ``in_memory``
    (the tests', never a benchmark's): in memory where the machine has room for it.
    ``settings`` take the place of SETTINGS' own (``{"max_connections": "100"}``)."""

    can_restart = True

    def __init__(
        self, bindir: Path, *, in_memory: bool = False, settings: Mapping[str, str] | None = None
    ) -> None:
        self.bindir = bindir
        self.account = _Account.for_server()
        self.port = 0
        self.startup_seconds = 0.0
        self.in_memory = in_memory
        self.settings = dict(settings or {})
        self._destroyed = False
        root = _temp_root(self.account, in_memory=in_memory)
        if root is not None:
            _reap_orphans(Path(root), self.account, bindir)
        self.base = Path(tempfile.mkdtemp(prefix=DIR_PREFIX, dir=root))
        atexit.register(self.destroy)
        self.data = self.base / "data"
        self.sockets = self.base / "sockets"
        self.log = self.base / "server.log"
        (self.base / "owner").write_text(f"{os.getpid()}\n")
        self.sockets.mkdir()
        for path in (self.base, self.sockets):
            self.account.give(path)

    @property
    def url(self) -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{DATABASE}"

    @property
    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def create(self) -> None:
        began = time.monotonic()
        self._run(
            "initdb", "-D", str(self.data), "-U", SUPERUSER, "--auth=trust",
            "--encoding=UTF8", "--locale=C", "--no-sync",
        )  # fmt: skip
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write("\ninclude 'ferryq.conf'\n")
        for attempt in range(5):
            self.port = _free_port()
            self._write_settings()
            try:
                self.start()
                break
            except ClusterError:
                # Another process may have taken the port between choosing and binding it.
                if attempt == 4 or "could not bind" not in _tail(self.log):
                    raise
        with _admin(with_database(self.url, "postgres")) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))
        self.startup_seconds = time.monotonic() - began

    def start(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w",
                  "-t", str(TIMEOUT), "-s", "start")  # fmt: skip
        self._wait_accepting()

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-w", "-t", str(TIMEOUT), "-s",
                  "-m", "fast", "stop")  # fmt: skip

    def restart(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w",
                  "-t", str(TIMEOUT), "-s", "-m", "fast", "restart")  # fmt: skip
        self._wait_accepting()

    def destroy(self) -> None:
        """Stop the server however it is doing and delete its directory; safe to repeat."""
        if self._destroyed:
            return
        self._destroyed = True
        atexit.unregister(self.destroy)
        _stop_and_delete(self.base, self.account, self.bindir)

    def _write_settings(self) -> None:
        settings = {
            **SETTINGS,
            **(IN_MEMORY_SETTINGS if self.in_memory else {}),
            **self.settings,
            "port": str(self.port),
            "unix_socket_directories": f"'{self.sockets}'",
        }
        conf = self.data / "ferryq.conf"
        conf.write_text("".join(f"{key} = {value}\n" for key, value in settings.items()))
        self.account.give(conf)

    def _wait_accepting(self) -> None:
        """pg_ctl -w has waited for the server; make sure TCP connections work too."""
        deadline = time.monotonic() + TIMEOUT
        while True:
            try:
                with _admin(with_database(self.url, "postgres")) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError as exc:
                if time.monotonic() > deadline:
                    raise ClusterError(f"PostgreSQL does not accept connections: {exc}") from exc
                time.sleep(0.05)

    def _run(self, program: str, *args: str) -> None:
        _run_as(self.account, self.bindir / program, args, cwd=self.base, log=self.log)


def _run_as(
    account: _Account, program: Path, args: Sequence[str], *, cwd: Path, log: Path | None
) -> None:
    env = {key: value for key, value in os.environ.items() if not key.startswith("PG")}
    env.update(LC_ALL="C", LANG="C")
    argv = account.command([str(program), *args])
    with tempfile.TemporaryFile() as output:
        try:
            done = subprocess.run(
                argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=output,
                stderr=subprocess.STDOUT, timeout=TIMEOUT + 30, check=False,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ClusterError(f"{shlex.join(argv)} failed: {exc}") from exc
        if done.returncode != 0:
            output.seek(0)
            said = output.read().decode(errors="replace").strip()
            server = f"\n--- server log ---\n{_tail(log)}" if log is not None else ""
            raise ClusterError(f"{shlex.join(argv)} exited with {done.returncode}:\n{said}{server}")


def _tail(path: Path | None, lines: int = 30) -> str:
    if path is None:
        return ""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _stop_and_delete(base: Path, account: _Account, bindir: Path) -> None:
    data = base / "data"
    pid_file = data / "postmaster.pid"
    if pid_file.exists():
        with contextlib.suppress(ClusterError):
            _run_as(account, bindir / "pg_ctl",
                    ["-D", str(data), "-w", "-t", "30", "-s", "-m", "immediate", "stop"],
                    cwd=base, log=None)  # fmt: skip
    if pid_file.exists():  # pg_ctl could not stop it: the postmaster's children follow it
        with contextlib.suppress(OSError, ValueError, IndexError):
            os.kill(int(pid_file.read_text().split()[0]), signal.SIGKILL)
    shutil.rmtree(base, ignore_errors=True)


def _reap_orphans(root: Path, account: _Account, bindir: Path) -> None:
    """Clusters left by sessions that died without cleaning up (SIGKILL, os._exit)."""
    for base in orphans(root, DIR_PREFIX, account):
        _stop_and_delete(base, account, bindir)


def orphans(root: Path, prefix: str, account: _Account) -> Iterator[Path]:
    """The directories ``prefix*`` of ``account`` under ``root`` whose session (the pid
    in their ``owner`` file) is gone."""
    for base in root.glob(f"{prefix}*"):
        try:
            if not account.owns(base):
                continue
            owner = int((base / "owner").read_text())
        except (OSError, ValueError):
            continue
        try:
            os.kill(owner, 0)
            continue  # its session is still running
        except ProcessLookupError:
            yield base
        except PermissionError:
            continue


class ExternalCluster:
    """The server at FERRYQ_TEST_PG_URL: used as it is, never stopped or restarted."""

    can_restart = False

    def __init__(self, url: str) -> None:
        self.url = url

    def restart(self) -> None:
        raise ClusterError(f"the server at {URL_ENV} is not the tests' own to restart")

    def stop(self) -> None:
        raise ClusterError(f"the server at {URL_ENV} is not the tests' own to stop")

    def start(self) -> None:
        raise ClusterError(f"the server at {URL_ENV} is not the tests' own to start")


def _external(url: str) -> ExternalCluster:
    try:
        with _admin(url) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        pytest.fail(f"{URL_ENV} is set, but its server cannot be used: {exc}", pytrace=False)
    return ExternalCluster(url)


def _missing_message() -> str:
    return (
        "PostgreSQL server binaries (initdb, pg_ctl, postgres) were not found via pg_config "
        f"or in {DEBIAN_ROOT}/*/bin, and {URL_ENV} is not set. Install them (Debian: "
        "apt-get install postgresql, or run scripts/ensure-postgres.sh as root) or set "
        f"{URL_ENV}=postgresql://user@host:port/dbname."
    )


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PgCluster]:
    url = os.environ.get(URL_ENV, "").strip()
    if url:
        external = _external(url)
        try:
            yield external
        finally:
            _drop_template(external)
        return
    with local_cluster() as cluster:
        yield cluster


@contextlib.contextmanager
def local_cluster(settings: Mapping[str, str] | None = None) -> Iterator[LocalCluster]:
    """A LocalCluster in memory, with ``settings`` over SETTINGS, started; stopped and
    deleted on exit. For the session's (``pg_cluster``), or a module's that needs a
    server set otherwise (tests/acceptance/test_forty_workers.py: max_connections).
    Without server binaries the test is skipped (a failure under CI)."""
    bindir = find_server_bindir()
    if bindir is None:
        if in_ci():
            pytest.fail(f"CI=true and {_missing_message()}", pytrace=False)
        pytest.skip(_missing_message())
    try:
        cluster = LocalCluster(bindir, in_memory=True, settings=settings)
    except (ClusterError, OSError) as exc:
        pytest.fail(f"could not prepare a throwaway PostgreSQL: {exc}", pytrace=False)
    try:
        cluster.create()
    except ClusterError as exc:
        cluster.destroy()
        pytest.fail(f"could not start a throwaway PostgreSQL: {exc}", pytrace=False)
    except BaseException:
        cluster.destroy()
        raise
    try:
        yield cluster
    finally:
        _drop_template(cluster)  # and the database made ahead: no copy left mid-way
        cluster.destroy()


_database_numbers = itertools.count(1)
#: The migrated template of each cluster this process used, by the cluster's URL.
_templates: dict[str, str] = {}
_templates_lock = threading.Lock()


@contextlib.contextmanager
def fresh_database(
    cluster: PgCluster, *, migrated: bool = True, made_ahead: bool = False
) -> Iterator[str]:
    """A new database on ``cluster``, dropped on exit; yields its URL. ``migrated``: a
    copy of the cluster's migrated template; otherwise empty (from template0).
    ``made_ahead`` (tests only, never a benchmark's: a copy in the background would
    weigh on what it measures): the copy made while the test before ran, if there is
    one, and the next one started now."""
    template = migrated_template(cluster) if migrated else "template0"
    name = _spares.pop(cluster.url).take() if made_ahead and cluster.url in _spares else None
    if name is None:
        name = _new_database_name()
        _create_database(cluster.url, name, template)
    if made_ahead:
        _spares[cluster.url] = _Spare(cluster.url, template)
    try:
        yield with_database(cluster.url, name)
    finally:
        if isinstance(cluster, LocalCluster) and not cluster.running:
            cluster.start()  # a test stopped it and did not start it again
        drop_database(cluster.url, name)


def _new_database_name() -> str:
    return f"ferryq_t_{os.getpid()}_{next(_database_numbers)}"


def _create_database(url: str, name: str, template: str) -> None:
    with _admin(url) as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template)
            )
        )


class _Spare:
    """The next test's database, copied from ``template`` in a thread of its own. A copy
    that fails (a test stopped or restarted the server meanwhile) is given up, and the
    next test has its copy made when it asks."""

    def __init__(self, url: str, template: str) -> None:
        self.url = url
        self.name = _new_database_name()
        self.failed = False
        self.thread = threading.Thread(target=self._make, args=(template,), daemon=True,
                                       name="pg-spare")  # fmt: skip
        self.thread.start()

    def _make(self, template: str) -> None:
        try:
            _create_database(self.url, self.name, template)
        except psycopg.Error:
            self.failed = True

    def take(self) -> str | None:
        """The database's name once it is made; None if it could not be."""
        self.thread.join()
        return None if self.failed else self.name

    def drop(self) -> None:
        if self.take() is not None:
            with contextlib.suppress(psycopg.Error):
                drop_database(self.url, self.name)


#: The database made ahead for the next test, by the cluster's URL.
_spares: dict[str, _Spare] = {}


def migrated_template(cluster: PgCluster) -> str:
    """The name of a database on ``cluster`` that ferryq's migrations have built, made on
    first use in this process. Nothing may connect to it afterwards: PostgreSQL copies a
    template only while no one else is connected to it."""
    with _templates_lock:
        found = _templates.get(cluster.url)
        if found is not None:
            return found
        name = f"{TEMPLATE_PREFIX}{os.getpid()}"
        drop_database(cluster.url, name)  # a template left by a process of this id
        with _admin(cluster.url) as conn:
            conn.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE template0").format(sql.Identifier(name))
            )
        try:
            _migrate(with_database(cluster.url, name))
        except BaseException:
            drop_database(cluster.url, name)
            raise
        _templates[cluster.url] = name
        return name


def _migrate(url: str) -> None:
    """Open (and so migrate) a store on ``url``, then close it: in a thread of its own,
    since a test's event loop may be running in this one."""
    from ferryq.store import open_store

    async def migrate() -> None:
        store = open_store(url)
        await store.open()
        await store.close()

    failures: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(migrate())
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=run, name="pg-template")
    thread.start()
    thread.join()
    if failures:
        raise ClusterError(f"could not migrate the template database: {failures[0]}") from (
            failures[0]
        )


def _drop_template(cluster: PgCluster) -> None:
    spare = _spares.pop(cluster.url, None)
    if spare is not None:
        spare.drop()
    with _templates_lock:
        name = _templates.pop(cluster.url, None)
    if name is not None:
        with contextlib.suppress(psycopg.Error):
            drop_database(cluster.url, name)


@pytest.fixture
def pg_url(pg_cluster: PgCluster) -> Iterator[str]:
    """A new database for this test alone, migrated, dropped after it."""
    with fresh_database(pg_cluster, made_ahead=True) as url:
        yield url


@pytest.fixture
def pg_empty_url(pg_cluster: PgCluster) -> Iterator[str]:
    """A new database for this test alone with nothing in it (not migrated), dropped after it."""
    with fresh_database(pg_cluster, migrated=False) as url:
        yield url


def drop_database(url: str, name: str) -> None:
    """Drop database ``name`` of the cluster at ``url``, closing its connections."""
    with _admin(url) as conn:
        if conn.info.server_version >= 130000:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
            return
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            (name,),
        )
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))
