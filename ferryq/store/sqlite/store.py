"""The embedded SQLite backend: the Store, laid out in rooms.

- ``connection``: the file, its connections and thread, the write lock, the disk;
- ``inserts``: enqueues, committed together when calls come at once;
- ``claims``: the worker's cycle (finishes, hand-overs, claims), leases, HTTP takes;
- ``lanes``: settling lanes after a change;
- ``waits`` (and ``wake``, the sockets): hearing of other processes' writes;
- ``operations``: reads and operator actions; ``maintenance``: the leader's duties;
- ``session``: the flows written once for both backends (ferryq.store.flows).

PostgreSQL's backend has the same rooms (ferryq/store/postgres/), so a behaviour can
be read side by side. This class only routes each call to its room, on the store's
thread (``Database.read`` and ``Database.write``).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence

from ferryq.job import Job, State
from ferryq.lanes import LaneRule, LaneView
from ferryq.store import base
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
from ferryq.store.sqlite import claims, external, lanes, maintenance, operations, session
from ferryq.store.sqlite.connection import Database, parse_url
from ferryq.store.sqlite.inserts import Inserts
from ferryq.store.sqlite.waits import Waits


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
        self._db = db = Database(
            path, synchronous=synchronous, busy_timeout=busy_timeout, read_only=read_only
        )
        self.path = path
        self.url = f"sqlite:///{path}"
        self.read_only = read_only
        self._inserts = Inserts(db)
        self._waits = Waits(db)
        self._commits: external.CommitWatch | None = None  # made by the first insert_on
        self._commits_lock = threading.Lock()
        self._commits_ended = False  # closed: no watch is made any more

    @classmethod
    def from_url(cls, url: str, *, read_only: bool = False) -> SQLiteStore:
        path, options = parse_url(url)
        return cls(path, synchronous=options.get("synchronous", "NORMAL"), read_only=read_only)

    # -- lifecycle ---------------------------------------------------------------

    async def open(self, migrate: bool = True) -> None:
        await self._db.open(migrate)

    async def close(self) -> None:
        self._end_commit_watch()
        await self._db.close()

    def terminate(self) -> None:
        self._end_commit_watch()
        self._db.terminate()

    def _end_commit_watch(self) -> None:
        with self._commits_lock:
            commits, self._commits = self._commits, None
            self._commits_ended = True
        if commits is not None:
            commits.close()

    def refuses(self, error: BaseException) -> bool:
        return self._db.refuses(error)

    async def migrate(self) -> list[int]:
        return await self._db.write(session.migrate)

    async def schema_version(self) -> int:
        return await self._db.read(session.schema_version)

    # -- the hot path: enqueue, claim, finish, leases ------------------------------

    async def job_insert_many(self, job: NewJob, args: Sequence[str]) -> list[Inserted]:
        return await self._inserts.insert_async(job, args)

    inserts_blocking: bool = True

    def insert_on(self, connection: object, job: NewJob, args: Sequence[str]) -> list[Inserted]:
        inserted = external.insert(connection, self._db.file, job, args)
        with self._commits_lock:
            if self._commits is None and not self._commits_ended:
                self._commits = external.CommitWatch(self._db.file)
            commits = self._commits
        if commits is not None:  # else the store closed: the workers' own looks find it
            commits.written()
        return inserted

    async def insert_on_async(
        self, connection: object, job: NewJob, args: Sequence[str]
    ) -> list[Inserted]:
        if external.is_aiosqlite(connection):
            return await external.on_thread_of(
                connection, lambda conn: self.insert_on(conn, job, args)
            )
        return self.insert_on(connection, job, args)

    def job_insert_blocking(self, job: NewJob, args: Sequence[str]) -> list[Inserted]:
        return self._inserts.insert_blocking(job, args)

    async def job_claim(
        self, namespace: str, queues: Sequence[str], limit: int, worker: str, now: float
    ) -> list[Claimed]:
        return (await self.job_finish_and_claim((), namespace, queues, limit, worker, now))[1]

    async def job_finish_many(self, finishes: Sequence[Finish]) -> FinishReport:
        return (await self._db.write(claims.finish_many, finishes))[0]

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
            self._waits.claiming()
        return await self._db.write(claims.cycle, finishes, namespace, queues, limit, worker, now)

    async def job_leases(
        self,
        held: Sequence[tuple[int, int]],
        extend: Sequence[int],
        now: float,
        started: Mapping[int, float] | None = None,
        progress: Mapping[int, str] | None = None,
    ) -> Leases:
        args = (dict(held), extend, now, started or {}, progress or {})
        if extend:  # renewals wake no other store: no wait looks for them
            return await self._db.write(claims.leases, *args, wakes=False)
        return await self._db.read(claims.leases, *args)

    async def job_next_due(self, namespace: str, queues: Sequence[str]) -> float | None:
        return await self._db.read(claims.next_due, namespace, queues)

    async def wait_for_finish(self, within: float, poll: float) -> None:
        await self._waits.wait_for_finish(within, poll)

    async def wait_for_change(self, within: float, *, patient: bool = False) -> bool:
        return await self._waits.wait_for_change(within, patient=patient)

    # -- reads and operator actions ---------------------------------------------

    async def job_get(self, job_id: int) -> Job | None:
        return await self._db.read(operations.get, job_id)

    async def prepare_dependencies(self) -> None:
        """Nothing to do: SQLite's trigger (migration 0011) costs nothing unused."""

    async def job_dependencies(self, job_id: int) -> Dependencies:
        return await self._db.read(operations.dependencies, job_id)

    async def job_dependency_results(self, job_id: int) -> list[str | None]:
        return await self._db.read(operations.dependency_results, job_id)

    async def job_list(self, where: JobFilter) -> list[Job]:
        return await self._db.read(operations.job_list, where)

    async def job_cancel(self, job_id: int, now: float) -> Job:
        return await self._db.write(operations.cancel, job_id, now)

    async def job_respawn(
        self,
        job_ids: Sequence[int],
        now: float,
        expires_at: float | None = None,
        max_tries: int | None = None,
    ) -> list[int]:
        return await self._db.write(operations.respawn, job_ids, now, expires_at, max_tries)

    async def job_purge(self, job_ids: Sequence[int], now: float) -> int:
        return await self._db.write(operations.purge, job_ids, now)

    async def job_counts(self, namespace: str | None) -> dict[tuple[str, str, str], int]:
        return await self._db.read(operations.counts, namespace)

    # -- queues as the HTTP API sees them ----------------------------------------

    async def job_take(
        self, namespace: str, queue: str, limit: int, worker: str, ttr: float, now: float
    ) -> list[Job]:
        if limit <= 0:
            return []
        # As job_finish_and_claim: what commits after this point wakes wait_for_change.
        self._waits.claiming()
        return await self._db.write(claims.take, namespace, queue, limit, worker, ttr, now)

    async def job_ack(
        self, namespace: str, queue: str, job_ids: Sequence[int], now: float
    ) -> list[int]:
        return await self._db.write(claims.ack, namespace, queue, job_ids, now) if job_ids else []

    async def queue_peek(self, namespace: str, queue: str, now: float) -> Job | None:
        return await self._db.read(operations.queue_peek, namespace, queue, now)

    async def queue_size(self, namespace: str, queue: str, state: State) -> int:
        return await self._db.read(operations.queue_size, namespace, queue, State(state))

    async def queue_clear(self, namespace: str, queue: str, now: float) -> int:
        return await self._db.write(operations.queue_clear, namespace, queue, now)

    async def dead_oldest(self, namespace: str, queue: str, limit: int) -> list[int]:
        return await self._db.read(operations.dead_oldest, namespace, queue, limit)

    # -- tokens ------------------------------------------------------------------

    async def token_create(self, token: base.Token) -> bool:
        return await self._db.write(operations.token_create, token)

    async def token_get(self, digest: str) -> base.Token | None:
        return await self._db.read(operations.token_get, digest)

    async def token_list(self, namespace: str | None) -> list[base.Token]:
        return await self._db.read(operations.token_list, namespace)

    async def token_delete(self, namespace: str, digest: str) -> bool:
        return await self._db.write(operations.token_delete, namespace, digest)

    async def token_limit_set(
        self, digest: str, read: int | None, write: int | None, interval: float | None
    ) -> bool:
        return await self._db.write(operations.token_limit_set, digest, read, write, interval)

    # -- lanes -------------------------------------------------------------------

    async def lane_rules(self, namespace: str) -> list[LaneRule]:
        return await self._db.read(lanes.rules, namespace)

    async def lane_rule_set(self, namespace: str, rule: LaneRule, now: float) -> None:
        await self._db.write(operations.lane_rule_set, namespace, rule, now)

    async def lane_rule_delete(self, namespace: str, pattern: str, now: float) -> bool:
        return await self._db.write(operations.lane_rule_delete, namespace, pattern, now)

    async def lane_window(self, namespace: str, lane: str) -> LaneWindow:
        return await self._db.read(operations.lane_window_of, namespace, lane)

    async def lane_view(self, namespace: str, lane: str) -> LaneView:
        return await self._db.read(operations.lane_view, namespace, lane)

    async def lane_ahead(self, namespace: str, lane: str, job_id: int) -> int:
        return await self._db.read(operations.lane_ahead, namespace, lane, job_id)

    async def lane_list(self, namespace: str, limit: int) -> list[LaneInfo]:
        return await self._db.read(operations.lane_list, namespace, limit)

    # -- maintenance -------------------------------------------------------------

    async def job_promote_due(self, now: float, limit: int) -> int:
        return await self._db.write(maintenance.promote_due, now, limit)

    async def job_expired_leases(self, now: float, limit: int) -> list[Claimed]:
        return await self._db.read(maintenance.expired_leases, now, limit)

    async def job_expire(self, now: float, limit: int) -> list[int]:
        return await self._db.write(maintenance.expire, now, limit)

    async def history_prune(self, before: float, limit: int) -> int:
        return await self._db.write(maintenance.history_prune, before, limit)

    async def history_fold(self, now: float) -> int:
        return await self._db.write(maintenance.history_fold)

    # Leadership, heartbeats and worker clean-up wake no other store: no wait looks
    # for them, and an idle worker writes them all the time.

    async def leader_acquire(self, name: str, holder: str, ttl: float, now: float) -> bool:
        return await self._db.write(maintenance.leader_acquire, name, holder, ttl, now,
                                    wakes=False)  # fmt: skip

    async def leader_release(self, name: str, holder: str) -> None:
        await self._db.write(maintenance.leader_release, name, holder, wakes=False)

    # -- periodic tasks ----------------------------------------------------------

    async def periodic_sync(
        self, namespace: str, entries: Sequence[base.PeriodicEntry], now: float
    ) -> list[base.PeriodicState]:
        return await self._db.write(operations.periodic_sync, namespace, entries, now)

    async def periodic_advance(
        self, namespace: str, task: str, checked_from: float, advance: base.PeriodicAdvance
    ) -> bool:
        return await self._db.write(
            operations.periodic_advance, namespace, task, checked_from, advance
        )

    async def periodic_list(self, namespace: str) -> list[base.PeriodicState]:
        return await self._db.read(operations.periodic_list, namespace)

    # -- workers -----------------------------------------------------------------

    async def worker_beat(self, worker: WorkerInfo) -> None:
        await self._db.write(operations.worker_beat, worker, wakes=False)

    async def worker_remove(self, worker_id: str) -> None:
        await self._db.write(operations.worker_remove, worker_id, wakes=False)

    async def worker_list(self, alive_since: float | None = None) -> list[WorkerInfo]:
        return await self._db.read(operations.worker_list, alive_since)

    async def worker_prune(self, dead_before: float) -> int:
        return await self._db.write(operations.worker_prune, dead_before, wakes=False)
