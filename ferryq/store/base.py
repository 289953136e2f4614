"""The Store protocol: the only seam between ferryq and a database.

A method that depends on time takes it from the caller: ``now`` (Unix seconds), or
the times inside ``NewJob`` and ``Finish``; so tests can freeze time and every
backend sees the same clock. The stores read no clock for job data (only for their
own upkeep: when a migration was applied, which history partitions PostgreSQL makes).
Methods that finish an attempt carry the attempt's fencing token; a write with a
stale token changes nothing and is reported back, never raised, because a late
worker is an expected event, not an error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from ferryq.errors import ConfigurationError
from ferryq.job import Job, State
from ferryq.lanes import LaneRule, LaneView


@dataclass(slots=True)
class NewJob:
    """Jobs to insert, all alike but for their args (see ``Store.job_insert_many``).

    JSON fields are already encoded, so bad input fails before anything is written.
    """

    namespace: str
    queue: str
    task: str
    state: State
    run_at: float
    order_time: float
    created_at: float
    priority: float = 0.0
    lane: str | None = None
    expires_at: float | None = None
    ttr: float = 60.0
    max_tries: int = 3
    retry: str = "{}"
    unique_key: str | None = None
    unique_for: float | None = None
    stage: str | None = None
    context: str = "null"
    meta: str = "{}"
    timeout: float | None = None
    after: tuple[int, ...] = ()  # jobs that must end first (flows.insert_after)
    after_failed: str = "fail"  # or "run": when one of them does not succeed


@dataclass(frozen=True, slots=True)
class Dependency:
    """One edge of the dependency graph, seen from one of its jobs: the other job, and
    the state the depended-on job ended in (None while it has not ended)."""

    id: int
    ended: str | None


@dataclass(frozen=True, slots=True)
class Dependencies:
    """The jobs a job waits for, in the order given, and the jobs that wait for it."""

    after: list[Dependency]
    dependents: list[Dependency]


@dataclass(slots=True)
class Inserted:
    id: int
    created: bool  # False: an existing job with the same unique_key was returned


@dataclass(slots=True)
class Claimed:
    """A job as a worker receives it: just what running an attempt needs."""

    id: int
    namespace: str
    queue: str
    task: str
    args: str
    attempts: int
    max_tries: int
    fence: int
    ttr: float
    retry: str
    priority: float
    run_at: float
    order_time: float
    lease_until: float
    stage: str | None
    context: str
    created_at: float
    expires_at: float | None
    lane: str | None
    timeout: float | None = None  # the attempt's time limit, apart from the lease
    meta: str = "{}"  # JSON: metadata set at enqueue, the trace context among it
    #: JSON [id, state] of a dependency that ended without success and so fails this
    #: job: its worker ends it dead without running the handler.
    dep_failed: str | None = None


FinishKind = Literal["succeeded", "dead", "cancelled", "retry", "next", "returned"]
#: The kinds of finish that end the job: it moves from the hot table to history.
TO_HISTORY: frozenset[FinishKind] = frozenset(("succeeded", "dead", "cancelled"))


@dataclass(slots=True)
class Finish:
    """The end of one attempt, as the completer writes it.

    ``succeeded``, ``dead`` and ``cancelled`` move the job to history; ``retry`` and
    ``next`` queue it again at ``run_at``/``order_time``; ``returned`` puts it back
    as ready without charging the try (graceful shutdown).
    """

    kind: FinishKind
    id: int
    fence: int
    finished_at: float
    started_at: float | None = None
    result: str = "null"
    error: dict[str, Any] | None = None
    run_at: float | None = None
    order_time: float | None = None
    stage: str | None = None
    context: str | None = None
    # The job's lane, as its worker knows it: PostgreSQL keeps that many slots of a
    # job_finish_and_claim for what the freed lanes hand over. The lanes the stores
    # settle are found from the jobs' rows, whatever this says.
    lane: str | None = None


@dataclass(frozen=True, slots=True)
class FinishReport:
    accepted: list[int]
    stale: list[int]  # rejected: the fencing token no longer matches


class CycleHalfDone(Exception):
    """One half of ``job_finish_and_claim`` failed and the other did not (a backend
    that runs them apart, as PostgreSQL does on two connections): ``report`` says
    how the finishes were written (None: not written), ``claimed`` holds the jobs
    claimed, which the worker must still run. The failure is the ``__cause__``."""

    def __init__(self, report: FinishReport | None, claimed: list[Claimed]) -> None:
        super().__init__("finishing written, claiming failed" if report is not None
                         else "claiming done, finishing failed")  # fmt: skip
        self.report = report
        self.claimed = claimed


@dataclass(frozen=True, slots=True)
class Leases:
    extended: list[int]  # renewed now
    lost: list[int]  # no longer held by this attempt: recovered, or claimed again
    cancel_requested: list[int]


@dataclass(slots=True)
class JobFilter:
    namespace: str | None = None
    queue: str | None = None
    state: State | None = None
    task: str | None = None
    lane: str | None = None
    text: str | None = None
    after_id: int | None = None  # keyset paging: ids below this one (newest first)
    limit: int = 50


@dataclass(slots=True)
class LaneInfo:
    """A lane with hot jobs, as operators see it."""

    lane: str
    waiting: int
    admitted: int  # scheduled or ready
    running: int
    halted_by: int | None
    rule: LaneRule


@dataclass(slots=True)
class WorkerInfo:
    id: str
    namespace: str
    queues: list[str]
    host: str
    pid: int
    concurrency: int
    started_at: float
    heartbeat_at: float
    running: list[int] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)  # ferryq.metrics snapshot


@dataclass(slots=True)
class Token:
    """A namespace's API token, as stored: never the token itself, only its digest.

    ``hint`` is the token's first characters, enough for people to tell tokens apart
    in listings. The ``limit_*`` fields are the optional rate limit: at most
    ``limit_read`` consumes and ``limit_write`` publishes per ``limit_interval``
    seconds (``None``: no limit).
    """

    namespace: str
    digest: str  # hex SHA-256 of the token
    description: str
    hint: str
    created_at: float
    limit_read: int | None = None
    limit_write: int | None = None
    limit_interval: float | None = None


@dataclass(slots=True)
class PeriodicEntry:
    """A periodic task as its leader declares it (see ``Store.periodic_sync``)."""

    task: str
    schedule: str  # ferryq.periodic.Schedule.spec
    queue: str
    catch_up: int


@dataclass(slots=True)
class PeriodicState:
    """A periodic task as stored: its schedule and how far it has been handled.

    Ticks up to ``checked_until`` have been enqueued or, as missed ticks beyond the
    catch-up, skipped. ``last_state`` is the state of the job of ``last_tick``.
    """

    namespace: str
    task: str
    schedule: str
    queue: str
    catch_up: int
    checked_until: float
    last_tick: float | None
    last_job: int | None
    next_tick: float | None
    updated_at: float
    last_state: str | None = None


@dataclass(frozen=True, slots=True)
class PeriodicAdvance:
    """How far a periodic task was handled: ``last_tick`` and ``last_job`` stay as
    stored when None."""

    checked_until: float
    next_tick: float | None
    updated_at: float
    last_tick: float | None = None
    last_job: int | None = None


@dataclass(frozen=True, slots=True)
class LaneWindow:
    """The last starts of a lane with a rate (oldest first), and the last due time a
    claim gave a job it deferred for the rate."""

    starts: list[float]
    deferred_until: float | None


class Store(Protocol):
    """Persistence for jobs, workers and leadership. See the module docstring."""

    url: str

    async def open(self, migrate: bool = True) -> None:
        """Connect and (unless told not to) apply pending migrations."""

    async def close(self) -> None: ...

    def terminate(self) -> None:
        """Close at once, from any thread, even when the store's event loop is gone."""

    async def migrate(self) -> list[int]:
        """Apply pending migrations; return the versions applied."""

    async def schema_version(self) -> int: ...

    # jobs: the hot path
    async def job_insert_many(self, job: NewJob, args: Sequence[str]) -> list[Inserted]:
        """Insert one job per element of ``args`` (JSON texts), in one transaction.

        Calls made at the same time may share a transaction (``ferryq.store.coalesce``);
        each returns once its own jobs are committed, and a job the database refuses
        fails its own call only.
        """

    #: Whether ``job_insert_blocking`` works: a sync caller then commits on its own
    #: thread, without a hop through an event loop.
    inserts_blocking: bool = False

    def job_insert_blocking(self, job: NewJob, args: Sequence[str]) -> list[Inserted]:
        """``job_insert_many`` for a thread that is not the store's event loop."""
        raise TypeError(f"{type(self).__name__} has no blocking insert")

    async def job_claim(
        self, namespace: str, queues: Sequence[str], limit: int, worker: str, now: float
    ) -> list[Claimed]: ...

    async def job_finish_many(self, finishes: Sequence[Finish]) -> FinishReport: ...

    def refuses(self, error: BaseException) -> bool:
        """Whether ``error``, raised by a write, says the database refused the values
        written (and would refuse them again): not that it was busy or out of reach."""

    async def job_finish_and_claim(
        self,
        finishes: Sequence[Finish],
        namespace: str,
        queues: Sequence[str],
        limit: int,
        worker: str,
        now: float,
    ) -> tuple[FinishReport, list[Claimed]]:
        """Write finished attempts and claim up to ``limit`` jobs: the worker's hot
        loop, one call instead of two. What the lanes these finishes free hand over
        goes to this worker first.

        SQLite does both in one write transaction, with one commit. PostgreSQL does
        them at once on two connections: the finishes in a transaction of their own,
        which also takes what freed lanes hand over, and the claim beside it (each of
        its statements commits by itself). When one half fails there and the other
        does not, ``CycleHalfDone`` says what was done.
        """

    async def job_leases(
        self,
        held: Sequence[tuple[int, int]],
        extend: Sequence[int],
        now: float,
        started: Mapping[int, float] | None = None,
        progress: Mapping[int, str] | None = None,
    ) -> Leases:
        """Renew the leases named in ``extend``; of all ``held`` (id, fence), report the
        ones lost and the ones whose cancellation was requested. ``started`` gives, for
        some of ``extend``, the time their handler began: their ``started_at``, which
        the claim set to the claim's time. ``progress`` gives, for some of ``extend``,
        what their attempt last reported (JSON text) to store with the lease."""

    async def job_next_due(self, namespace: str, queues: Sequence[str]) -> float | None: ...

    async def wait_for_finish(self, within: float, poll: float) -> None:
        """Wait until some job may have finished: a notification, or ``poll`` seconds.

        Never longer than ``within``; backends without notifications just sleep.
        """

    async def wait_for_change(self, within: float, *, patient: bool = False) -> bool:
        """Wait until another connection may have written, at most ``within`` seconds.
        ``patient``: the caller can hear of a write tens of milliseconds late (an HTTP
        server's blocking waits), so a backend that polls may poll less while idle."""

    # jobs: reads and operator actions
    async def job_get(self, job_id: int) -> Job | None: ...

    async def prepare_dependencies(self) -> None:
        """Make the database ready for jobs with dependencies, before the first is
        inserted (PostgreSQL creates the trigger that resolves them on first use)."""

    async def job_dependencies(self, job_id: int) -> Dependencies:
        """The job's dependencies and dependents (``after``), for explain and views."""

    async def job_dependency_results(self, job_id: int) -> list[str | None]:
        """The results (JSON text) of the job's dependencies, in its order: None for
        one that did not succeed."""

    async def job_list(self, where: JobFilter) -> list[Job]: ...

    async def job_cancel(self, job_id: int, now: float) -> Job: ...

    async def job_respawn(
        self,
        job_ids: Sequence[int],
        now: float,
        expires_at: float | None = None,
        max_tries: int | None = None,
    ) -> list[int]:
        """Queue terminal jobs again with a fresh try count (and, when given, a new
        ``max_tries``); return the ids moved."""

    async def job_purge(self, job_ids: Sequence[int], now: float) -> int:
        """Delete dead jobs from the dead letters (releasing lanes they halted)."""

    async def job_counts(self, namespace: str | None) -> dict[tuple[str, str, str], int]:
        """Counts by (namespace, queue, state), hot and historical."""

    # queues as the HTTP API sees them (lmstfy): consumers that lease jobs by queue
    async def job_take(
        self, namespace: str, queue: str, limit: int, worker: str, ttr: float, now: float
    ) -> list[Job]:
        """Claim up to ``limit`` ready jobs of one queue, in claim order, leasing each
        for ``ttr`` seconds (which becomes the job's ttr). Due jobs are promoted first,
        as ``job_claim`` does. Returns the jobs as stored after the claim."""

    async def job_ack(
        self, namespace: str, queue: str, job_ids: Sequence[int], now: float
    ) -> list[int]:
        """End each unfinished job of the queue as succeeded, whichever attempt holds
        it (an HTTP consumer has no fencing token); return the ids acknowledged."""

    async def queue_peek(self, namespace: str, queue: str, now: float) -> Job | None:
        """The ready job that the next consume of the queue would take, unchanged."""

    async def queue_size(self, namespace: str, queue: str, state: State) -> int:
        """How many jobs of the queue are in ``state`` (hot or, for terminal states,
        historical)."""

    async def queue_clear(self, namespace: str, queue: str, now: float) -> int:
        """Cancel every ready job of the queue; return how many."""

    async def dead_oldest(self, namespace: str, queue: str, limit: int) -> list[int]:
        """Ids of the queue's dead jobs, the longest dead first."""

    # tokens of the HTTP API
    async def token_create(self, token: Token) -> bool:
        """Store a token; False (and nothing written) when its digest exists."""

    async def token_get(self, digest: str) -> Token | None: ...

    async def token_list(self, namespace: str | None) -> list[Token]:
        """Tokens of a namespace (or of all, with ``None``), oldest first."""

    async def token_delete(self, namespace: str, digest: str) -> bool: ...

    async def token_limit_set(
        self, digest: str, read: int | None, write: int | None, interval: float | None
    ) -> bool:
        """Set (or, with all ``None``, clear) a token's rate limit; False if no token."""

    # lanes
    async def lane_rules(self, namespace: str) -> list[LaneRule]: ...

    async def lane_rule_set(self, namespace: str, rule: LaneRule, now: float) -> None:
        """Set a lane's or a prefix's rule; matching lanes follow it at once."""

    async def lane_rule_delete(self, namespace: str, pattern: str, now: float) -> bool: ...

    async def lane_view(self, namespace: str, lane: str) -> LaneView: ...

    async def lane_ahead(self, namespace: str, lane: str, job_id: int) -> int:
        """How many waiting jobs of the lane are ahead of ``job_id``."""

    async def lane_window(self, namespace: str, lane: str) -> LaneWindow:
        """A lane's rate window as the last claim left it (empty if it has none)."""

    async def lane_list(self, namespace: str, limit: int) -> list[LaneInfo]:
        """Lanes with hot jobs, busiest first, and halted lanes."""

    # maintenance (leader only)
    async def job_promote_due(self, now: float, limit: int) -> int: ...

    async def job_expired_leases(self, now: float, limit: int) -> list[Claimed]: ...

    async def job_expire(self, now: float, limit: int) -> list[int]: ...

    async def history_prune(self, before: float, limit: int) -> int: ...

    async def history_fold(self, now: float) -> int:
        """Count a step of the history into the stored counts that ``job_counts``
        reads, so that it need not read those rows again; return how many were
        folded (0 once there is nothing to fold)."""

    async def leader_acquire(self, name: str, holder: str, ttl: float, now: float) -> bool: ...

    async def leader_release(self, name: str, holder: str) -> None: ...

    # periodic tasks (their leader only, but for the listing)
    async def periodic_sync(
        self, namespace: str, entries: Sequence[PeriodicEntry], now: float
    ) -> list[PeriodicState]:
        """Record these periodic tasks (a new one is handled up to ``now``: its
        first tick is the next one) and return them as stored."""

    async def periodic_advance(
        self, namespace: str, task: str, checked_from: float, advance: PeriodicAdvance
    ) -> bool:
        """Move a periodic task on, if it is still at ``checked_from``; False when
        another leader moved it first (its enqueues were deduplicated, so nothing is
        lost or doubled)."""

    async def periodic_list(self, namespace: str) -> list[PeriodicState]: ...

    # workers
    async def worker_beat(self, worker: WorkerInfo) -> None: ...

    async def server_time(self) -> float | None:
        """The database server's clock, Unix seconds; None where the database is a file
        on this host (ferryq.clock)."""
        return None

    def insert_on(self, connection: object, job: NewJob, args: Sequence[str]) -> list[Inserted]:
        """Insert on the application's own connection to this store's database, in its
        open transaction (``task.using(conn)``), on the caller's thread: checked first,
        a ConfigurationError naming the fix for a connection that cannot be used."""
        raise ConfigurationError(
            f"cannot enqueue on a {type(connection).__qualname__} here: pass a "
            "connection to the App's database"
        )

    async def insert_on_async(
        self, connection: object, job: NewJob, args: Sequence[str]
    ) -> list[Inserted]:
        """``insert_on`` from a coroutine: on the loop's thread, or on the thread of an
        async driver's connection that runs the sync one (aiosqlite)."""
        return self.insert_on(connection, job, args)

    async def database_identity(self, fresh: bool = False) -> tuple[str, ...]:
        """What tells this store's database from another (PostgreSQL: its name and its
        server's), for checking that an application's own connection reaches it; read
        once, and again when ``fresh`` (a server restarted since has another)."""
        return ()

    async def reserve(self) -> None:
        """A worker's start: open the connections the store may hold while it claims,
        so that a server or pooler that refuses them says so now, once, rather than
        under load (a StoreError naming the fix). Nothing to do for a file."""
        return None

    async def worker_remove(self, worker_id: str) -> None: ...

    async def worker_list(self, alive_since: float | None = None) -> list[WorkerInfo]: ...

    async def worker_prune(self, dead_before: float) -> int: ...
