"""The PostgreSQL server as the store uses it: its pools, the settings of their
sessions, and calls that ride out a server restart.

Every call runs on a pooled connection through ``Database.session``: a connection
lost before the work began (a pooled connection the server closed, a server still
starting) is always tried again; one lost half-way only when the work is safe to run
twice. Enqueues have a pool of their own, with generic plans (see INSERT_SETTINGS),
and keep one of its connections out of the pool between commits. Behind a
transaction pooler (ferryq.store.postgres.pooler) every statement runs in an
explicit transaction (``PooledConn``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import asyncpg

from ferryq.errors import StoreError
from ferryq.faults import FaultLog, one_line
from ferryq.store import safe_url
from ferryq.store.postgres.pooler import assignments, pooling_of, set_statements
from ferryq.store.postgres.queries import Q, Statement

log = logging.getLogger("ferryq.store.postgres")
T = TypeVar("T")
Conn = Any  # asyncpg.Connection or a pooled proxy of one; asyncpg ships no types

#: A transaction of the store's lasts milliseconds. One left idle longer than this
#: (its process frozen: SIGSTOP, a debugger, a paused machine) is ended by the server,
#: so the lanes and rows it locked go free for every other worker; the frozen call,
#: once it runs again, finds its connection gone and starts over on another.
IDLE_IN_TRANSACTION_TIMEOUT = "10s"
#: Statements are prepared once per connection. A generic plan, which PostgreSQL
#: switches to after five runs, guesses batch sizes blindly and, once the tables are
#: large, can scan a whole table where the batch needs a few index lookups: every
#: run is planned for its own parameters instead (a fraction of a millisecond).
#: A setting given in the URL's query (``?idle_in_transaction_session_timeout=30s``)
#: takes the place of the one here.
SESSION_SETTINGS = {
    "plan_cache_mode": "force_custom_plan",
    "application_name": "ferryq",
    "idle_in_transaction_session_timeout": IDLE_IN_TRANSACTION_TIMEOUT,
}
GENERIC_PLANS = "plan_cache_mode = force_generic_plan"
#: The enqueues' connections: the insert has one good plan whatever its values.
INSERT_SETTINGS = {"plan_cache_mode": "force_generic_plan"}
#: Behind a transaction pooler, the settings each transaction begins with (``SET
#: LOCAL``). Of SESSION_SETTINGS only the idle timeout still matters: no statement is
#: kept prepared there, and an unnamed one is planned for its own parameters at its one
#: run whatever ``plan_cache_mode`` says (so the enqueues' generic plans, which pay
#: only when a plan is kept, go too); ``application_name`` is the pooler's business.
TRANSACTION_SETTINGS = {"idle_in_transaction_session_timeout": IDLE_IN_TRANSACTION_TIMEOUT}
#: Commits of enqueue calls under way at once. One: the calls that queue while it
#: waits for its fsync go in the next together (two at once made smaller batches,
#: and fewer calls a second). They share one connection (a commit whose caller was
#: cancelled goes on, and the next waits for it).
IN_FLIGHT = 1
#: How long a call keeps retrying while the server is unreachable (a restart).
RECONNECT_SECONDS = 30.0
CONNECTION_LOST = (
    OSError,
    asyncpg.exceptions.PostgresConnectionError,
    asyncpg.exceptions.CannotConnectNowError,
    asyncpg.exceptions.AdminShutdownError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,  # a connection left half-way through an operation
    asyncpg.exceptions.IdleInTransactionSessionTimeoutError,  # it ended a frozen session
    # Refused at connect, so nothing began: the server is full (max_connections) or
    # the role is at its own limit; both pass as other clients leave.
    asyncpg.exceptions.TooManyConnectionsError,
)
#: SQLSTATE classes that refuse the values written, whatever the moment: data
#: exceptions (22), integrity violations (23) and limits exceeded (54).
_REFUSALS = ("22", "23", "54")


@dataclass(frozen=True)
class Budget:
    """The most server connections a store holds, and what for: ``pool`` for its calls
    (claims, finishes, leases, reads), one for enqueues (``inserts``), and ``session``
    (1 or 0): LISTEN and leadership's advisory locks, on one connection (a store that
    neither waits nor leads never opens it). Each is opened when first needed, and
    the pool's kept while used (asyncpg closes one idle for five minutes)."""

    pool: int
    inserts: int
    session: int

    @property
    def total(self) -> int:
        return self.pool + self.inserts + self.session

    @property
    def least(self) -> int:
        """The fewest ``connections=`` a store like this one takes."""
        return self.session + 2

    @classmethod
    def of(cls, connections: int | None, *, session: bool) -> Budget:
        """``connections=N`` spent: one for the session connection if the store has
        one, one for enqueues, the rest for the pool. None: DEFAULT_CONNECTIONS."""
        spent = int(session) + 1
        if connections is None:
            connections = DEFAULT_CONNECTIONS
        elif connections < spent + 1:
            needs = "one to LISTEN and lead, " if session else ""
            raise StoreError(
                f"connections={connections} is too few: a store needs at least "
                f"{spent + 1} ({needs}one for enqueues and one for everything else); "
                f"give connections={spent + 1} or more"
            )
        return cls(connections - spent, 1, int(session))

    def refused(self, where: str, error: BaseException) -> StoreError:
        """The error of a server or pooler at ``where`` that refused a connection of
        this budget (``refuses_a_connection``), naming the two ways out."""
        return StoreError(
            f"PostgreSQL at {where} refused a connection ({one_line(error)}): this store "
            f"holds up to {self.total} (connections={self.total} in the URL); give fewer "
            f"(connections={self.least} at the least) or raise the server's "
            "max_connections (behind PgBouncer, its max_client_conn)"
        )


def refuses_a_connection(error: BaseException) -> bool:
    """Whether ``error`` is a server or a pooler refusing one connection more: the
    server's max_connections or a role's CONNECTION LIMIT (SQLSTATE 53300), PgBouncer's
    max_client_conn (which it says in words only)."""
    return isinstance(error, asyncpg.TooManyConnectionsError) or (
        isinstance(error, asyncpg.PostgresError) and "no more connections allowed" in str(error)
    )


#: A store's connections unless ``connections=`` says otherwise (docs/operations.md,
#: "Connections"): a worker whose handlers do not enqueue holds three of them.
DEFAULT_CONNECTIONS = 4


class Database:
    """The store's pools on one server. ``ready`` once the store has opened;
    ``budget`` how many connections each pool may hold (set before it opens)."""

    def __init__(self, url: str) -> None:
        self.pooling = pooling = pooling_of(url)
        self.url = pooling.url  # without ``pooler=``: the parameter is ferryq's
        self.safe_url = safe_url(url)
        # A transaction pooler's: what begins every transaction (see PooledConn).
        self.begin: str | None = None
        if pooling.transaction:
            self.begin = "BEGIN" + assignments({**TRANSACTION_SETTINGS, **pooling.settings})
        self.budget = Budget.of(pooling.connections, session=False)
        self.pool: asyncpg.Pool | None = None
        # Enqueues have a connection of their own, with generic plans: planning the
        # insert anew at every call cost more than running it.
        self.inserts_pool: asyncpg.Pool | None = None
        self._kept: Conn | None = None
        self._kept_lock = asyncio.Lock()
        self.ready = False
        self.opening = asyncio.Lock()
        self._faults = FaultLog(log)

    @property
    def settings(self) -> dict[str, str]:
        """The settings of the store's sessions (SESSION_SETTINGS, less the URL's own;
        behind a pooler, with the URL's own)."""
        if self.pooling.pooled:
            return {**SESSION_SETTINGS, **self.pooling.settings}
        return _session_settings(self.url)

    async def connect(self) -> None:
        """Make the pools; a wrong URL or a server out of reach is a StoreError now,
        as is a pooler that does not work as the URL's ``pooler=`` says."""
        try:
            self.pool = await asyncpg.create_pool(
                self.url, min_size=0, max_size=self.budget.pool, reset=_reset,
                **self._pool_options(self.settings),
            )  # fmt: skip
            async with self.pool.acquire() as conn:  # a wrong URL says so now, once
                if self.pooling.mode == "session":
                    await self._check_session_pooler(conn)
                else:
                    await conn.execute("SELECT 1")
            self.inserts_pool = await asyncpg.create_pool(
                self.url, min_size=0, max_size=self.budget.inserts, reset=_reset,
                **self._pool_options({**self.settings, **INSERT_SETTINGS}),
            )  # fmt: skip
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError,
                asyncpg.InternalClientError) as exc:  # fmt: skip
            # (A server going away as the first query runs may leave asyncpg's protocol
            # half-way: an InternalClientError, one line like any other here.)
            await self.close()
            raise self._not_connected(exc) from exc
        except StoreError:
            await self.close()
            raise

    def _not_connected(self, error: BaseException) -> StoreError:
        if refuses_a_connection(error):
            return self.budget.refused(self.safe_url, error)
        if "unsupported startup parameter" in str(error) and not self.pooling.pooled:
            # PgBouncer's answer to the settings a store sends when it starts a session.
            return StoreError(
                f"cannot connect to PostgreSQL at {self.safe_url}: a pooler refused the "
                f"session's settings ({one_line(error)}): add pooler=transaction to the "
                "URL (PgBouncer's transaction mode, RDS Proxy, Supabase's and Neon's "
                "poolers) or pooler=session (a pooler in session mode)"
            )
        return StoreError(f"cannot connect to PostgreSQL at {self.safe_url}: {error}")

    async def _check_session_pooler(self, conn: Conn) -> None:
        """``pooler=session``: a StoreError if the pooler gives one client's statements
        to more than one server connection (a transaction pooler), which would lose the
        LISTENs and leadership's locks between two statements. A second client takes a
        server connection in a transaction while the first has just used one: a
        transaction pooler gives it the first's (PgBouncer reuses the one freed last),
        or moves the first to another, where the statement it prepared is not."""
        try:
            first = await _backend(conn)
            try:  # a pooler with no server connection free makes the other wait
                async with asyncio.timeout(PROBE_SECONDS):
                    other = await asyncpg.connect(self.url)
            except TimeoutError:
                return  # nothing known: the pooler is busy, or slow
            try:  # its transaction ends with it
                try:
                    async with asyncio.timeout(PROBE_SECONDS):
                        await other.execute("BEGIN")
                        second = await other.fetchval(BACKEND)
                except TimeoutError:
                    return  # nothing known: no server connection free for it
                # A session client has its own server connection: only a transaction
                # pooler's, the other's now, makes this one wait.
                async with asyncio.timeout(PROBE_SECONDS):
                    again = await _backend(conn)
            finally:
                other.terminate()
            if second != first and again == first:
                return
        except asyncpg.InvalidSQLStatementNameError:
            pass  # prepared on one server connection, run on another
        except TimeoutError:
            pass  # the first waited for the server connection the other holds
        raise StoreError(
            f"{self.safe_url} says pooler=session, but its pooler runs each transaction "
            "on whichever server connection is free (a transaction pooler): give "
            "pooler=transaction instead"
        )

    async def reserve(self) -> None:
        """Open every connection of the pool, then leave them to it (kept until idle for
        five minutes): a server or pooler that refuses the budget says so now."""
        pool = self.pool
        if pool is None:
            raise StoreError("the store is not open")
        held: list[Conn] = []
        try:
            for _ in range(self.budget.pool):  # each taken while the others are held
                held.append(await pool.acquire())
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise self._not_connected(exc) from exc
        finally:
            for conn in held:
                await pool.release(conn)

    def _pool_options(self, settings: dict[str, str]) -> dict[str, Any]:
        """How a pool's connections get ``settings``: in the startup packet; behind a
        session pooler, which refuses settings there, by a ``SET`` on each new
        connection; behind a transaction pooler, by each transaction (``begin``), with
        no statement kept prepared (the next transaction may be on another server
        connection)."""
        if self.pooling.transaction:
            return {"statement_cache_size": 0}
        if self.pooling.pooled:
            statements = set_statements(settings)

            async def init(conn: Conn) -> None:
                await conn.execute(statements)

            return {"init": init}
        return {"server_settings": settings}

    async def give_back_kept(self) -> None:
        """The enqueues' kept connection goes back to its pool, unless a commit uses it."""
        if self.inserts_pool is not None and not self._kept_lock.locked():
            kept, self._kept = self._kept, None
            if kept is not None:
                await _give_back(self.inserts_pool, kept)

    async def close(self) -> None:
        pools, self.pool, self.inserts_pool = (self.pool, self.inserts_pool), None, None
        for pool in pools:
            if pool is not None:
                await pool.close()

    def terminate(self) -> None:
        self._kept = None  # the pool's terminate ends it
        pools, self.pool, self.inserts_pool = (self.pool, self.inserts_pool), None, None
        for pool in pools:
            # Its event loop may be gone already: closing is then best effort.
            with contextlib.suppress(RuntimeError):
                if pool is not None:
                    pool.terminate()

    def refuses(self, error: BaseException) -> bool:
        """See ``Store.refuses``."""
        if isinstance(error, ValueError | TypeError | OverflowError):
            return True  # not even encoded: a text no codec takes, an integer past 64 bits
        # asyncpg's errors, or psycopg's (a sync enqueue's, see on_thread).
        if not isinstance(error, asyncpg.PostgresError) and not _of_psycopg(error):
            return False
        return str(getattr(error, "sqlstate", None) or "")[:2] in _REFUSALS

    # -- calls ---------------------------------------------------------------------

    async def session(
        self,
        op: Callable[..., Awaitable[T]],
        *args: Any,
        transaction: bool = True,
        idempotent: bool = True,
        isolation: str | None = None,
        settings: str | None = None,
        inserts: bool = False,
    ) -> T:
        """Run ``op(conn, *args)`` on a pooled connection, riding out a server restart.
        ``settings`` (``SET LOCAL`` assignments) apply to ``op``'s transaction, set as
        it begins. ``inserts``: on a connection of the enqueues' own pool.

        A connection lost before the work began (a pooled connection the server
        closed, a server still starting) is always retried; one lost half-way only
        when ``op`` is safe to run twice. RECONNECT_SECONDS after the first loss it is a
        StoreError (counted from the loss: a call may have been frozen long before).
        """
        delay = 0.05
        deadline: float | None = None  # set at the first loss
        while True:
            begun = False
            try:
                async with self._acquire(inserts) as conn:
                    if self.begin is not None:  # a transaction pooler: its own settings
                        conn, settings = PooledConn(conn, self.begin), None
                    if not transaction:
                        begun = True
                        result = await op(conn, *args)
                    else:
                        transaction_of_op = (
                            conn.transaction(isolation=isolation)
                            if settings is None
                            else transaction_with(conn, settings)
                        )
                        async with transaction_of_op:
                            begun = True
                            result = await op(conn, *args)
            except CONNECTION_LOST as exc:
                if isinstance(exc, ValueError):  # asyncpg's DataError: a value not encoded
                    raise
                deadline = deadline or time.monotonic() + RECONNECT_SECONDS
                if (begun and not idempotent) or time.monotonic() > deadline:
                    raise StoreError(
                        f"lost the connection to PostgreSQL at {self.safe_url}: {one_line(exc)}"
                    ) from exc
                self._faults.failed("PostgreSQL connection", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
            self._faults.succeeded("PostgreSQL connection")
            return result

    async def fetch(self, name: str, **params: Any) -> list[Any]:
        """The rows of statement ``name``, in a statement of its own."""
        statement = Q[name]
        return await self.session(lambda conn: run(conn, statement, **params), transaction=False)

    async def execute(self, name: str, **params: Any) -> str:
        """The status of statement ``name`` (``UPDATE 3``), in a statement of its own."""
        statement = Q[name]

        async def execute(conn: Conn) -> str:
            return str(await conn.execute(statement.sql, *statement.args(params)))

        return await self.session(execute, transaction=False)

    def _acquire(self, inserts: bool = False) -> Any:
        pool = self.inserts_pool if inserts else self.pool
        if pool is None:
            raise StoreError("the store is not open")
        return self._kept_for_inserts(pool) if inserts else pool.acquire()

    @contextlib.asynccontextmanager
    async def _kept_for_inserts(self, pool: asyncpg.Pool) -> AsyncIterator[Conn]:
        """The enqueues' connection, kept out of the pool between commits: taking one
        from the pool and giving it back cost a tenth of a one-job enqueue. A second
        commit at once (its leader's caller was cancelled) waits for the first. A store
        closing meanwhile gets it back as the commit ends."""
        async with self._kept_lock:
            try:
                conn = self._kept
                if conn is None or not _usable(conn):  # the server ended it: another
                    self._kept = None
                    if conn is not None:
                        await _give_back(pool, conn)
                    conn = self._kept = await pool.acquire()
                try:
                    yield conn
                except BaseException:  # the pool resets or drops it; the next takes another
                    self._kept = None
                    await _give_back(pool, conn)
                    raise
            finally:
                if not self.ready and (kept := self._kept) is not None:
                    self._kept = None
                    await _give_back(pool, kept)


BACKEND = "SELECT pg_backend_pid()"
#: How long the check of a session pooler waits for a step (``_check_session_pooler``).
PROBE_SECONDS = 5.0


async def _backend(conn: Conn) -> int:
    """The server process of ``conn``'s next transaction (in one: a statement outside
    may go to two server connections behind a transaction pooler)."""
    async with conn.transaction():
        return int(await conn.fetchval(BACKEND))


async def run(conn: Conn, statement: Statement, **params: Any) -> list[Any]:
    """The rows of ``statement`` on ``conn``."""
    return list(await conn.fetch(statement.sql, *statement.args(params)))


def runner(conn: Conn) -> Callable[[Statement, dict[str, Any]], Awaitable[list[Any]]]:
    """``run`` on ``conn``, as the lanes' steps and the flows' sessions take it."""
    return lambda statement, params: run(conn, statement, **params)


def transaction_with(conn: Conn, settings: str) -> contextlib.AbstractAsyncContextManager[None]:
    """A transaction begun together with ``SET LOCAL settings``, in one round trip
    (asyncpg's ``transaction()`` sends BEGIN alone)."""
    return transaction_begun(conn, f"BEGIN; SET LOCAL {settings}")


@contextlib.asynccontextmanager
async def transaction_begun(conn: Conn, begin: str) -> AsyncIterator[None]:
    """A transaction begun by the simple query ``begin``: committed if the block ends
    normally, else rolled back. A lost connection cannot be; its server ends the
    transaction, and the pool's ``_reset`` catches any other left open. The ``begin``
    is inside: cancelled while it runs (a worker stopping), it may have begun the
    transaction all the same, and asyncpg would complain of it (an error in the log)
    as it gives the connection back; a ROLLBACK with none begun does nothing."""
    try:
        await conn.execute(begin)
        yield
    except BaseException:
        with contextlib.suppress(*CONNECTION_LOST):
            await conn.execute("ROLLBACK")
        raise
    await conn.execute("COMMIT")


class PooledConn:
    """A pooled connection through a transaction pooler, which may give each of its
    transactions another server connection. asyncpg sends a statement with parameters
    in two round trips (an unnamed Parse, then Bind and Execute): only a transaction
    keeps both on one server connection. So a statement sent outside a transaction runs
    in one of its own, and every transaction begins with ``begin`` (``BEGIN; SET LOCAL
    …``, one round trip). A ``transaction()`` inside one is a savepoint (asyncpg's own
    refuses to nest in a transaction it did not begin). A simple query (no
    parameters) is one round trip, its own implicit transaction: sent as it is."""

    def __init__(self, conn: Conn, begin: str) -> None:
        self._conn = conn
        self._begin = begin
        self._savepoints = 0

    async def fetch(self, sql: str, *args: Any) -> list[Any]:
        async with self._alone():
            return list(await self._conn.fetch(sql, *args))

    async def fetchval(self, sql: str, *args: Any) -> Any:
        async with self._alone():
            return await self._conn.fetchval(sql, *args)

    async def fetchrow(self, sql: str, *args: Any) -> Any:
        async with self._alone():
            return await self._conn.fetchrow(sql, *args)

    async def execute(self, sql: str, *args: Any) -> str:
        if not args:
            return str(await self._conn.execute(sql))
        async with self._alone():
            return str(await self._conn.execute(sql, *args))

    def transaction(self, isolation: str | None = None) -> Any:
        if self._conn.is_in_transaction():
            return self._savepoint()
        begin = self._begin
        if isolation is not None:
            level = isolation.replace("_", " ").upper()
            begin = begin.replace("BEGIN", f"BEGIN ISOLATION LEVEL {level}", 1)
        return transaction_begun(self._conn, begin)

    async def copy_from_query(self, sql: str, *, output: Any) -> str:
        """Without parameters: one simple query, as ``execute``'s."""
        return str(await self._conn.copy_from_query(sql, output=output))

    def is_in_transaction(self) -> bool:
        return bool(self._conn.is_in_transaction())

    def is_closed(self) -> bool:
        return bool(self._conn.is_closed())

    def _alone(self) -> contextlib.AbstractAsyncContextManager[Any]:
        if self._conn.is_in_transaction():
            return contextlib.nullcontext()
        return transaction_begun(self._conn, self._begin)

    @contextlib.asynccontextmanager
    async def _savepoint(self) -> AsyncIterator[None]:
        self._savepoints += 1
        name = f"ferryq_{self._savepoints}"
        await self._conn.execute(f"SAVEPOINT {name}")
        try:
            yield
        except BaseException:
            with contextlib.suppress(*CONNECTION_LOST):
                await self._conn.execute(f"ROLLBACK TO SAVEPOINT {name}; RELEASE SAVEPOINT {name}")
            raise
        await self._conn.execute(f"RELEASE SAVEPOINT {name}")


def _usable(conn: Conn) -> bool:
    """Whether a connection kept out of the pool still works: asyncpg gives the
    pool back a connection the server ended, and its proxy then refuses every call."""
    try:
        return not conn.is_closed()
    except asyncpg.InterfaceError:
        return False


async def _give_back(pool: asyncpg.Pool, conn: Conn) -> None:
    with contextlib.suppress(Exception):  # given back already, with its connection gone
        await pool.release(conn)


def _of_psycopg(error: BaseException) -> bool:
    return type(error).__module__.startswith("psycopg")


def _session_settings(url: str) -> dict[str, str]:
    """SESSION_SETTINGS, less those the URL's query sets: asyncpg sends a query
    parameter it does not know to the server as a setting, unless told otherwise."""
    given = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)
    return {name: value for name, value in SESSION_SETTINGS.items() if name not in given}


async def _reset(conn: Conn) -> None:
    """What a connection needs on its way back to the pool: nothing, but for a
    transaction an operation was cut off in. Pooled connections hold no session state
    (locks are transaction-scoped; LISTEN and leadership have connections of their own),
    so the driver's default reset, a round trip on every release, is skipped."""
    if conn.is_in_transaction():
        await conn.execute("ROLLBACK")
