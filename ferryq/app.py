"""App: the facade users hold. Configuration, task registry, and every job operation.

Every operation is written once, async; the sync twin runs it through the portal.
"""

from __future__ import annotations

import asyncio
import math
import os
import threading
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, Protocol, TypeVar, overload

from ferryq import _json, insights, metrics, policy
from ferryq._portal import Portal
from ferryq.backoff import Backoff
from ferryq.clock import ServerClock
from ferryq.context import Context
from ferryq.errors import (
    ConfigurationError,
    JobCancelled,
    JobDead,
    JobExpired,
    JobFailed,
    JobNotFound,
    ResultTimeout,
    SerializationError,
)
from ferryq.handle import JobHandle
from ferryq.hooks import Enqueue, Hooks
from ferryq.job import MAX_JOB_ID, Job, State
from ferryq.lanes import LaneRule
from ferryq.ops import JobFilter, LaneInfo, Operations, Signals
from ferryq.own_connection import driver_connection, driver_connection_async
from ferryq.periodic import Periodic, Schedule, check_catch_up
from ferryq.policy import JobOptions
from ferryq.store import Store, insert_on_connection, insert_on_connection_async, open_store
from ferryq.store.base import Dependencies, Inserted, NewJob
from ferryq.task import ExceptionTypes, Failures, Task

if TYPE_CHECKING:
    from ferryq.insights import Explanation

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

DEFAULT_URL = "sqlite:///ferryq.db"
DEFAULT_TASK_OPTIONS = JobOptions(queue="default", ttr=60.0, max_tries=3, priority=0.0)


class TaskDecorator(Protocol):
    """What ``@app.task(...)`` returns: it registers the function it decorates."""

    @overload
    def __call__(self, fn: Callable[Concatenate[Context, P], R], /) -> Task[P, R]: ...

    @overload
    def __call__(self, fn: Callable[P, R], /) -> Task[P, R]: ...


_FAILURES: dict[State, type[JobFailed]] = {
    State.DEAD: JobDead,
    State.CANCELLED: JobCancelled,
    State.EXPIRED: JobExpired,
}


class App:
    """A ferryq application: a database URL, a namespace, and the tasks it knows.

    ``clock`` returns Unix seconds; tests pass a frozen one to control time. By default
    it is this host's clock set to the database server's (``ferryq.clock``): leases, due
    times and recovery then do not depend on hosts' clocks agreeing.
    ``read_only=True`` suits a program that only reads (the CLI's ``jobs ls``,
    ``stats``…): a SQLite file that does not exist is an error instead of a new empty
    database, and one this process cannot write is opened to read.
    ``direct_url`` (else ``FERRYQ_DIRECT_URL``): PostgreSQL behind a pooler, the same
    database reached without it, for wake-ups (docs/operations.md, "Behind a
    connection pooler").
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        namespace: str = "default",
        clock: Callable[[], float] | None = None,
        max_payload_bytes: int = 1 << 20,
        read_only: bool = False,
        direct_url: str | None = None,
    ) -> None:
        self.url = url or os.environ.get("FERRYQ_URL") or DEFAULT_URL
        self.direct_url = direct_url or os.environ.get("FERRYQ_DIRECT_URL") or None
        self.read_only = read_only
        JobOptions(namespace=namespace).validate()
        self.namespace = namespace
        if clock is None:  # a file on this host needs no offset (ferryq.clock)
            clock = ServerClock() if self._on_server else time.time
        self.clock = clock
        self.max_payload_bytes = max_payload_bytes
        self.tasks: dict[str, Task[Any, Any]] = {}
        self.schedules: dict[str, Periodic] = {}  # periodic tasks, by task name
        # One store per event loop: a connection pool belongs to the loop it was made on.
        self._stores: dict[asyncio.AbstractEventLoop, Store] = {}
        self._closers: dict[asyncio.AbstractEventLoop, AsyncGenerator[None]] = {}
        self._store_lock = threading.Lock()
        self._portal: Portal | None = None
        # The portal loop's store, for sync enqueues (see _insert_sync).
        self._portal_store: tuple[Portal, Store] | None = None
        # SQLite: the store of enqueues on the application's own connection, never
        # opened (see _file_store).
        self._file_store_made: Store | None = None
        #: Your code around every enqueue and every attempt: see ``ferryq.hooks``.
        self.hooks = Hooks()
        #: What this process hears about at once (see ``ferryq.ops.Signals``).
        self.signals = Signals()
        #: Asked at every enqueue given no connection of its own: the connection of a
        #: transaction open around the call, for the jobs to be written in it (as with
        #: ``task.using(connection)``), or None for the App's own connection, which
        #: commits at once. A framework sets it (``ferryq.contrib.django``: Django's
        #: connection inside ``transaction.atomic()``). Called on the enqueueing
        #: thread, and inside the event loop for ``enqueue_async``: a connection that
        #: async code must not use is refused there by the function itself.
        self.ambient_connection: Callable[[], object | None] | None = None

    def use(self, middleware: object) -> None:
        """Register the hook methods of ``middleware`` (``app.hooks.use``)."""
        self.hooks.use(middleware)

    def __repr__(self) -> str:
        return f"<ferryq.App {self.url} namespace={self.namespace} tasks={len(self.tasks)}>"

    # -- tasks -------------------------------------------------------------------

    @overload
    def task(self, fn: Callable[Concatenate[Context, P], R], /) -> Task[P, R]: ...

    @overload
    def task(self, fn: Callable[P, R], /) -> Task[P, R]: ...

    @overload
    def task(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        queue: str | None = None,
        max_tries: int | None = None,
        retry: Backoff | None = None,
        ttr: float | None = None,
        ttl: float | None = None,
        priority: float | None = None,
        timeout: float | None = None,
        retry_on: ExceptionTypes | None = None,
        fail_on: ExceptionTypes | None = None,
    ) -> TaskDecorator: ...

    def task(
        self,
        fn: Callable[..., Any] | None = None,
        /,
        *,
        name: str | None = None,
        retry_on: ExceptionTypes | None = None,
        fail_on: ExceptionTypes | None = None,
        **options: Any,
    ) -> Task[Any, Any] | TaskDecorator:
        """Register a handler: ``@app.task`` or ``@app.task(queue="mail", max_tries=5)``.

        A handler that takes a ``ferryq.Context`` gets it from the worker; put it first
        so that type checkers see the enqueue signature without it. ``timeout`` limits
        each attempt's run time (seconds). ``retry_on`` and ``fail_on`` choose which
        exceptions retry: one of ``fail_on``, or (when ``retry_on`` is given) one not
        of ``retry_on``, makes the job dead at once.
        """
        errors = Failures.of(retry_on, fail_on)

        def register(func: Callable[..., Any]) -> Task[Any, Any]:
            qualname = getattr(func, "__qualname__", None)
            if name is None and qualname is None:
                raise ConfigurationError(f"{func!r} has no name of its own: give it one, name=...")
            task_name = name or f"{func.__module__}.{qualname}"
            if task_name in self.tasks:
                raise ConfigurationError(f"task {task_name!r} is registered twice")
            task = Task(self, func, task_name, DEFAULT_TASK_OPTIONS.merged(**options), errors)
            self.tasks[task_name] = task
            return task

        return register(fn) if fn is not None else register

    def periodic(
        self,
        *,
        cron: str | None = None,
        every: float | None = None,
        timezone: str | None = None,
        catch_up: int = 1,
        name: str | None = None,
        queue: str | None = None,
        max_tries: int | None = None,
        retry: Backoff | None = None,
        ttr: float | None = None,
        ttl: float | None = None,
        priority: float | None = None,
        timeout: float | None = None,
    ) -> TaskDecorator:
        """Run a task on a schedule: ``@app.periodic(cron="*/5 * * * *")`` (UTC, or
        the wall clock of ``timezone``, such as ``"Europe/Paris"``) or
        ``@app.periodic(every=30)`` (seconds, counted from the Unix epoch).

        One job per tick, whatever the number of workers. Ticks missed while no
        worker ran are not all replayed: the latest ``catch_up`` of them run (0: none).
        The handler takes no arguments but an optional ``ferryq.Context``; decorate
        an existing task to give it a schedule too.
        """
        schedule = Schedule.of(cron=cron, every=every, timezone=timezone)
        check_catch_up(catch_up)  # now, before any task is registered
        register_task = self.task(name=name, queue=queue, max_tries=max_tries, retry=retry,
                                  ttr=ttr, ttl=ttl, priority=priority, timeout=timeout)  # fmt: skip

        def register(fn: Callable[..., Any]) -> Task[Any, Any]:
            task = fn if isinstance(fn, Task) else register_task(fn)
            if task.name in self.schedules:
                raise ConfigurationError(f"task {task.name!r} already has a schedule")
            if not task.callable_without_arguments():
                if fn is not task:
                    del self.tasks[task.name]
                raise ConfigurationError(
                    f"periodic task {task.name!r} must be callable without arguments: "
                    "its jobs have none"
                )
            self.schedules[task.name] = Periodic(task.name, task.queue, schedule, catch_up)
            return task

        return register

    # -- the store and the portal ------------------------------------------------

    async def store(self) -> Store:
        """This event loop's store, opened (and migrated) on first use."""
        loop = asyncio.get_running_loop()
        gone: list[Store] = []
        with self._store_lock:
            store = self._stores.get(loop)
            if store is None:
                # The stores of loops that ended without closing theirs go first: nothing
                # can use them again, and each holds connections and a thread.
                for ended in [other for other in self._stores if other.is_closed()]:
                    gone.append(self._stores.pop(ended))
                    self._closers.pop(ended, None)
                store = self._stores[loop] = open_store(
                    self.url, read_only=self.read_only, direct_url=self.direct_url
                )
                created = True
            else:
                created = False
        for left in gone:
            left.terminate()
        if created and (self._portal is None or loop is not self._portal.loop):
            # Closed on its own loop as the loop ends: asyncio.run() finalizes the async
            # generators still open (an asyncio.run() per call leaves nothing behind).
            # The portal's loop closes its store itself.
            closer = self._closers[loop] = _close_at_shutdown(store)
            await anext(closer)
        await store.open()
        if created and isinstance(self.clock, ServerClock):
            await self.clock.measure(store.server_time)
        return store

    async def operations(self) -> Operations:
        """The reads and operator actions on this event loop's store: what every face
        (these methods, the CLI, the HTTP server, the dashboard) goes through."""
        return Operations(await self.store(), self.clock, self.signals)

    async def migrate_async(self) -> tuple[list[int], int]:
        """Apply pending migrations: (versions applied now, schema version)."""
        store = open_store(self.url)
        await store.open(migrate=False)
        try:
            return await store.migrate(), await store.schema_version()
        finally:
            await store.close()

    def migrate(self) -> tuple[list[int], int]:
        return self.portal_call(self.migrate_async())

    def portal_call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` to completion from sync code."""
        return self._the_portal().call(coro)

    def _the_portal(self) -> Portal:
        with self._store_lock:
            if self._portal is None:
                self._portal = Portal()
            return self._portal

    def close(self) -> None:
        """Close every connection this App opened, and its portal thread.

        Stores of event loops that are gone are terminated without ceremony; call
        ``aclose()`` on a loop before it ends to close its store cleanly.
        """
        with self._store_lock:
            stores, self._stores = self._stores, {}
            self._closers = {}
            file_store, self._file_store_made = self._file_store_made, None
        portal, self._portal = self._portal, None
        self._portal_store = None
        if file_store is not None:
            file_store.terminate()
        for loop, store in stores.items():
            if portal is not None and loop is portal.loop:
                portal.call(store.close())
            else:
                store.terminate()
        if portal is not None:
            portal.close()

    async def aclose(self) -> None:
        """Close the store of the running event loop."""
        loop = asyncio.get_running_loop()
        with self._store_lock:
            store = self._stores.pop(loop, None)
            closer = self._closers.pop(loop, None)
            if self._portal_store is not None and self._portal_store[1] is store:
                self._portal_store = None
        if closer is not None:
            await closer.aclose()  # closes the store
        elif store is not None:
            await store.close()

    # -- enqueue -----------------------------------------------------------------

    async def enqueue_raw(
        self,
        task: str,
        encoded_args: Sequence[str],
        options: JobOptions,
        connection: object | None = None,
        payload_limit: int | None = None,
    ) -> list[JobHandle]:
        """Insert jobs whose args are already JSON; every option is validated first.

        With ``connection`` (asyncpg, or psycopg 3 async), the jobs are inserted on it,
        inside the caller's open transaction: they exist only if it commits.
        ``payload_limit`` replaces ``max_payload_bytes`` for callers that bound their
        input themselves (the HTTP API stores a 1 MiB binary body as base64).
        """
        job = self._new_job(task, encoded_args, options, payload_limit)
        if not encoded_args:
            return []
        if connection is None:
            connection = self._ambient()
        count = len(encoded_args)
        return await self._enqueue(
            task, options, job, count, lambda: self._insert(job, encoded_args, connection)
        )

    async def _enqueue(
        self,
        task: str,
        options: JobOptions,
        job: NewJob,
        count: int,
        insert: Callable[[], Awaitable[list[Inserted]]],
    ) -> list[JobHandle]:
        """``insert`` the jobs, between the enqueue hooks if there are any: every way
        of enqueueing (async or sync, on the store or on the caller's connection)
        comes through here. The hooks run in one task, so what ``before_enqueue`` puts
        in a context variable ``after_enqueue`` sees."""
        if not self.hooks.around_enqueue:
            return self._handles(job, await insert())
        call = Enqueue(task, options, count, dict(options.meta))
        try:
            await self.hooks.call(self.hooks.before_enqueue_hooks, call)
            job.meta = self._hooked_meta(call)
            handles = self._handles(job, await insert())
        except BaseException as exc:
            call.exception = exc
            raise
        else:
            call.ids = [handle.id for handle in handles]
            return handles
        finally:
            await self.hooks.call(self.hooks.after_enqueue_hooks, call)

    async def _insert(
        self, job: NewJob, encoded_args: Sequence[str], connection: object | None
    ) -> list[Inserted]:
        if connection is None:
            return await (await self.store()).job_insert_many(job, encoded_args)
        connection = await driver_connection_async(connection)
        if not self._on_server:  # the caller's sqlite3 connection, on its own thread
            return await self._file_store().insert_on_async(connection, job, encoded_args)
        if job.after:  # in a transaction of its own, not the caller's
            await self._prepare_dependencies()
        return await insert_on_connection_async(
            connection, job, encoded_args, self._database_identity
        )

    async def _database_identity(self, fresh: bool) -> tuple[str, ...]:
        return await (await self.store()).database_identity(fresh)

    def _ambient(self) -> object | None:
        """The connection of the transaction open around an enqueue, if one is found."""
        return None if self.ambient_connection is None else self.ambient_connection()

    @property
    def _on_server(self) -> bool:
        """Whether the database is PostgreSQL's, not a file."""
        return self.url.startswith(("postgresql:", "postgres:"))

    def _handles(self, job: NewJob, inserted: Sequence[Inserted]) -> list[JobHandle]:
        metrics.ENQUEUED.inc(sum(row.created for row in inserted), job.namespace, job.queue)
        return [JobHandle(self, row.id, row.created) for row in inserted]

    def enqueue_raw_sync(
        self, task: str, encoded_args: Sequence[str], options: JobOptions
    ) -> list[JobHandle]:
        """The sync twin of ``enqueue_raw``: the store commits on the caller's thread
        (``Store.job_insert_blocking``), with no hop through the portal's event loop.
        With enqueue hooks the call runs on the portal, as ``enqueue_raw``, so that
        they run in one task, in a copy of this thread's context. Inside a transaction
        that ``ambient_connection`` finds, the jobs are written in it."""
        connection = self._ambient()
        if connection is not None:
            return self.enqueue_raw_on(connection, task, encoded_args, options)
        if self.hooks.around_enqueue:
            return self.portal_call(self.enqueue_raw(task, encoded_args, options))
        job = self._new_job(task, encoded_args, options)
        if not encoded_args:
            return []
        return self._handles(job, self._insert_sync(job, encoded_args))

    def _insert_sync(self, job: NewJob, encoded_args: Sequence[str]) -> list[Inserted]:
        store = self._sync_store()
        if not store.inserts_blocking:
            return self.portal_call(self._insert(job, encoded_args, None))
        return store.job_insert_blocking(job, encoded_args)

    def _file_store(self) -> Store:
        """The SQLite store whose ``insert_on`` writes on the application's own
        connection. It is never opened: opening writes, and the application's
        transaction, open around the call, holds the file's write lock. The schema must
        be there already (any App or worker that opened the file, or ``ferryq
        migrate``)."""
        with self._store_lock:
            if self._file_store_made is None:
                self._file_store_made = open_store(self.url)
            return self._file_store_made

    def _sync_store(self) -> Store:
        """The portal loop's store, for calls on the caller's thread; kept with the
        portal it belongs to: a store kept from before close() would be closed, and the
        portal new."""
        portal = self._the_portal()
        kept = self._portal_store
        if kept is None or kept[0] is not portal:
            kept = self._portal_store = (portal, portal.call(self.store()))
        return kept[1]

    async def _prepare_dependencies(self) -> None:
        await (await self.store()).prepare_dependencies()

    def _hooked_meta(self, call: Enqueue) -> str:
        """The jobs' meta as the enqueue hooks left it, checked as the options were."""
        meta = _json.dumps_document(call.meta, "meta")
        self._check_size("meta", meta)
        return meta

    def enqueue_raw_on(
        self, connection: object, task: str, encoded_args: Sequence[str], options: JobOptions
    ) -> list[JobHandle]:
        """The sync twin of ``enqueue_raw`` on a sync driver connection (psycopg 3): the
        jobs are inserted on this thread, the connection's, in its open transaction;
        enqueue hooks, if any, run around it on the portal (see ``Portal.call_here``)."""
        job = self._new_job(task, encoded_args, options)
        if not encoded_args:
            return []

        def insert() -> list[Inserted]:
            conn = driver_connection(connection)
            if not self._on_server:
                return self._file_store().insert_on(conn, job, encoded_args)
            if job.after:  # in a transaction of its own, not the caller's
                self.portal_call(self._prepare_dependencies())

            def expected(fresh: bool) -> tuple[str, ...]:
                return self.portal_call(self._database_identity(fresh))

            return insert_on_connection(conn, job, encoded_args, expected)

        if not self.hooks.around_enqueue:
            return self._handles(job, insert())
        return self._the_portal().call_here(
            lambda here: self._enqueue(task, options, job, len(encoded_args), lambda: here(insert))
        )

    def check_enqueue(
        self,
        task: str,
        encoded_args: Sequence[str],
        options: JobOptions,
        payload_limit: int | None = None,
    ) -> None:
        """Raise what ``enqueue_raw`` would raise for these jobs, writing nothing."""
        self._new_job(task, encoded_args, options, payload_limit)

    def _new_job(
        self,
        task: str,
        encoded_args: Sequence[str],
        options: JobOptions,
        payload_limit: int | None = None,
    ) -> NewJob:
        now = self.clock()
        options.validate(now)
        policy.check_text("task", task)
        due = policy.due_time(now, options)
        priority = options.priority or 0.0
        limit = payload_limit or self.max_payload_bytes
        if any(len(args) * 4 > limit for args in encoded_args):
            for args in encoded_args:
                self._check_size(f"arguments of {task}", args, limit)
        job = NewJob(
            namespace=options.namespace or self.namespace,
            queue=options.queue or "default",
            task=task,
            # A lane's job waits until its lane admits it (see ferryq.lanes).
            state=State.WAITING
            if options.lane is not None
            else State.SCHEDULED
            if due > now
            else State.READY,
            run_at=due,
            order_time=policy.order_time(due, priority),
            created_at=now,
            priority=priority,
            lane=options.lane,
            expires_at=policy.expires_at(now, options.ttl),
            ttr=options.ttr or 60.0,
            max_tries=options.max_tries or 3,
            retry="{}" if options.retry is None else _json.dumps(options.retry.to_dict()),
            unique_key=options.unique_key,
            unique_for=options.unique_for,
            stage=options.stage,
            context="null" if options.context is None else _json.dumps(options.context, "context"),
            meta=_json.dumps_document(options.meta, "meta") if options.meta else "{}",
            timeout=options.timeout,
            after=options.after or (),
            after_failed=options.after_failed or "fail",
        )
        self._check_size("context", job.context)
        self._check_size("meta", job.meta)
        return job

    def _check_size(self, what: str, text: str, limit: int | None = None) -> None:
        # A character is at most 4 bytes in UTF-8: encode only texts that may be too big.
        limit = limit or self.max_payload_bytes
        if len(text) * 4 > limit and (size := len(text.encode())) > limit:
            raise SerializationError(f"{what}: {size} bytes, over the limit of {limit} bytes")

    def enqueue(self, task: str, args: Any = (), **options: Any) -> JobHandle:
        """Enqueue by task name (the task need not be registered here).

        ``args`` is a list of positional arguments or a dict of keyword arguments.
        The job's options are the task's as registered in this App, or the defaults
        (queue ``default``, ttr 60 s, 3 tries) if it is not, plus ``options``; the
        worker that runs it keeps them.
        """
        return self.enqueue_many(task, [args], **options)[0]

    async def enqueue_async(self, task: str, args: Any = (), **options: Any) -> JobHandle:
        return (await self.enqueue_many_async(task, [args], **options))[0]

    def enqueue_many(self, task: str, args: Sequence[Any], **options: Any) -> list[JobHandle]:
        """Enqueue one job per element of ``args``, in one transaction."""
        return self.enqueue_raw_sync(task, *self._by_name(task, args, options))

    async def enqueue_many_async(
        self, task: str, args: Sequence[Any], **options: Any
    ) -> list[JobHandle]:
        return await self.enqueue_raw(task, *self._by_name(task, args, options))

    def _by_name(
        self, task: str, args: Sequence[Any], options: dict[str, Any]
    ) -> tuple[list[str], JobOptions]:
        """The calls' args as JSON, and their options: the task's here, or defaults."""
        known = self.tasks.get(task)
        defaults = known.defaults if known else DEFAULT_TASK_OPTIONS
        return _json.dumps_many(args, f"arguments of {task}"), defaults.merged(**options)

    # -- reading and operating jobs ----------------------------------------------

    async def get_job_async(self, job_id: int) -> Job:
        return await (await self.operations()).get(_job_id(job_id))

    def get_job(self, job_id: int) -> Job:
        return self.portal_call(self.get_job_async(job_id))

    async def result_async(self, job_id: int, timeout: float | None = None) -> Any:
        """Wait until the job is terminal; its result, or :class:`JobFailed`."""
        if timeout is not None and math.isnan(timeout):
            raise ValueError("timeout must be a number of seconds or None, not nan")
        ops = await self.operations()
        job = await ops.wait_ended(await ops.get(_job_id(job_id)), timeout)
        if job is None:  # purged while we waited
            raise JobNotFound(job_id)
        if job.state == State.SUCCEEDED:
            return job.result
        if job.terminal:
            raise _FAILURES[job.state](job.id, job.state, job.error)
        raise ResultTimeout(f"job {job_id} is still {job.state} after {timeout} s")

    async def cancel_async(self, job_id: int) -> Job:
        return await (await self.operations()).cancel(_job_id(job_id))

    def cancel(self, job_id: int) -> Job:
        return self.portal_call(self.cancel_async(job_id))

    async def respawn_async(self, job_ids: Sequence[int], ttl: float | None = None) -> list[int]:
        """Queue dead, cancelled or expired jobs again with a fresh try count."""
        return await (await self.operations()).respawn(_job_ids(job_ids), ttl)

    def respawn(self, job_ids: Sequence[int], ttl: float | None = None) -> list[int]:
        return self.portal_call(self.respawn_async(job_ids, ttl))

    async def purge_async(self, job_ids: Sequence[int]) -> int:
        return await (await self.operations()).purge(_job_ids(job_ids))

    def purge(self, job_ids: Sequence[int]) -> int:
        return self.portal_call(self.purge_async(job_ids))

    async def list_jobs_async(self, **filters: Any) -> list[Job]:
        filters.setdefault("namespace", self.namespace)
        return await (await self.operations()).jobs(JobFilter(**filters))

    def list_jobs(self, **filters: Any) -> list[Job]:
        return self.portal_call(self.list_jobs_async(**filters))

    async def explain_async(self, job_id: int) -> Explanation:
        return await (await self.operations()).explain(_job_id(job_id))

    def explain(self, job_id: int) -> Explanation:
        return self.portal_call(self.explain_async(job_id))

    async def dependencies_async(self, job_id: int) -> Dependencies:
        """The jobs this one waits for (``after``, with how each ended) and those that
        wait for it."""
        return await (await self.operations()).dependencies(_job_id(job_id))

    def dependencies(self, job_id: int) -> Dependencies:
        return self.portal_call(self.dependencies_async(job_id))

    # -- lanes -------------------------------------------------------------------

    async def set_lane_limit_async(
        self, pattern: str, limit: int, on_dead: str | None = None
    ) -> LaneRule:
        """Limit a lane (``post:42``) or every lane under a prefix (``tenant:*``) to
        ``limit`` running jobs; ``on_dead="halt"`` stops the lane behind a dead job.
        Without ``on_dead`` an existing rule keeps its policy, a new one continues.
        Jobs not started yet follow the new rule at once."""
        ops = await self.operations()
        return await ops.set_lane_limit(self.namespace, pattern, limit, on_dead)

    def set_lane_limit(self, pattern: str, limit: int, on_dead: str | None = None) -> LaneRule:
        return self.portal_call(self.set_lane_limit_async(pattern, limit, on_dead))

    async def set_lane_rate_async(self, pattern: str, n: int, per: float = 1.0) -> LaneRule:
        """Let each lane ``pattern`` names (``api:acme``, or ``api:*``) start at most
        ``n`` jobs in any ``per`` seconds, across every worker (a sliding window: see
        docs/guarantees.md). The rule keeps its limit and policy; a new one has limit 1."""
        return await (await self.operations()).set_lane_rate(self.namespace, pattern, n, per)

    def set_lane_rate(self, pattern: str, n: int, per: float = 1.0) -> LaneRule:
        return self.portal_call(self.set_lane_rate_async(pattern, n, per))

    async def clear_lane_rate_async(self, pattern: str) -> LaneRule | None:
        """Take the rate off ``pattern``'s rule, keeping the rest; None if it has none."""
        return await (await self.operations()).clear_lane_rate(self.namespace, pattern)

    def clear_lane_rate(self, pattern: str) -> LaneRule | None:
        return self.portal_call(self.clear_lane_rate_async(pattern))

    async def clear_lane_limit_async(self, pattern: str) -> bool:
        """Drop a rule: its lanes fall back to the next matching rule, or limit 1."""
        return await (await self.operations()).clear_lane_limit(self.namespace, pattern)

    def clear_lane_limit(self, pattern: str) -> bool:
        return self.portal_call(self.clear_lane_limit_async(pattern))

    async def lane_limits_async(self) -> list[LaneRule]:
        return await (await self.operations()).lane_rules(self.namespace)

    def lane_limits(self) -> list[LaneRule]:
        return self.portal_call(self.lane_limits_async())

    async def lanes_async(self, limit: int = 50) -> list[LaneInfo]:
        """Lanes with unfinished jobs, busiest first, then halted lanes."""
        return await (await self.operations()).lanes(self.namespace, limit)

    def lanes(self, limit: int = 50) -> list[LaneInfo]:
        return self.portal_call(self.lanes_async(limit))

    async def stats_async(self) -> insights.Stats:
        return await (await self.operations()).stats(self.namespace)

    def stats(self) -> insights.Stats:
        return self.portal_call(self.stats_async())

    # -- workers -----------------------------------------------------------------

    def run_worker(self, **options: Any) -> None:
        """Run a worker in this thread until stopped (or, with ``burst=True``, drained)."""
        if _running_loop() is not None:
            raise RuntimeError("run_worker() blocks: in async code, await run_worker_async()")
        asyncio.run(self.run_worker_async(**options))

    async def run_worker_async(self, **options: Any) -> None:
        from ferryq.worker import Worker

        worker = Worker(self, **options)
        try:
            await worker.run()
        finally:
            await self.aclose()


async def _close_at_shutdown(store: Store) -> AsyncGenerator[None]:
    """Suspended until its loop shuts its async generators down, then closes ``store``."""
    try:
        yield
    finally:
        await store.close()


def _job_id(job_id: int) -> int:
    """A job id as the API takes it: an int; one no database holds is simply not found."""
    if isinstance(job_id, bool) or not isinstance(job_id, int):
        raise TypeError(f"a job id is an int, not {type(job_id).__name__}")
    if not 0 < job_id <= MAX_JOB_ID:
        raise JobNotFound(job_id)
    return job_id


def _job_ids(job_ids: Sequence[int]) -> list[int]:
    """The ids a database could hold; the others are not found, so nothing to do."""
    found = []
    for job_id in job_ids:
        try:
            found.append(_job_id(job_id))
        except JobNotFound:
            continue
    return found


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
