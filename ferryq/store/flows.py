"""Flows written once for every backend: cancel, dedup on insert, dependencies on
insert, the rate gate of a claim, the lane listing, the counts merge, migrate.

A flow is an async function over a ``Session``: one transaction (or read snapshot)
of one backend, which runs that backend's statement of a given name (its
``queries.sql``; the SQL may differ, the name and the meaning do not). PostgreSQL
awaits a flow on its connection. SQLite runs it on the store's thread, where every
statement is a plain sync call, so the flow never suspends and ``drive`` steps it
through without an event loop; a sync psycopg connection (an enqueue in the
application's own transaction) is driven the same way.

The hot paths (plain inserts, claims, finishes) are not flows: each backend keeps
its own, tuned to its driver.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Awaitable, Callable, Collection, Coroutine, Iterator, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from ferryq import lanes
from ferryq.errors import InvalidTransition, JobNotFound, UnknownDependency
from ferryq.job import HELD, Job, State
from ferryq.lanes import LaneKey, LaneRule
from ferryq.store.base import Inserted, LaneInfo, NewJob
from ferryq.store.sql import job_from_row, split_script

T = TypeVar("T")
Counts = dict[tuple[str, str, str], int]

#: The statements the flows run, by name: each backend's queries.sql has every one
#: (tests/unit/test_store_queries.py checks it). Some take nothing on SQLite, whose
#: write transaction holds the database's one write lock: their body is empty.
STATEMENTS = (
    "job_counts", "job_delete", "job_dependencies_add", "job_dependencies_ended",
    "job_dependencies_hot", "job_find_unique_hot", "job_find_unique_recent",
    "job_get_history", "job_get_hot", "job_hold", "job_lock", "job_lock_unique",
    "job_defer", "job_move_terminal", "job_request_cancel", "lane_halts", "lane_list",
    "lane_of_job", "lane_unstarted", "lane_windows_lock", "lane_windows_put",
    "migration_lock", "migration_record", "migration_table", "migration_versions",
    "schema_version",
)  # fmt: skip


class Row(Protocol):
    """A row read by column name (``row["lane"]``) or position: ``sqlite3.Row`` and
    asyncpg's ``Record`` both are."""

    def __getitem__(self, key: Any, /) -> Any: ...

    def __iter__(self) -> Iterator[Any]: ...

    def __len__(self) -> int: ...


class Session(Protocol):
    """One transaction of one backend, as a flow sees it: statements by name, and the
    lane rule's few steps, which each backend takes its own way."""

    async def rows(self, name: str, params: Mapping[str, Any]) -> Sequence[Row]:
        """The rows of statement ``name``."""

    async def value(self, name: str, params: Mapping[str, Any]) -> Any:
        """The first column of statement ``name``'s first row; None with no row."""

    async def execute(self, name: str, params: Mapping[str, Any]) -> None:
        """Run statement ``name``, for what it writes or locks."""

    async def lock_lanes(self, keys: Collection[LaneKey]) -> None:
        """Take these lanes' locks before any job row (PostgreSQL: see
        ferryq.store.postgres.lanes). SQLite takes none: the write lock is held."""

    async def settle_lanes(self, keys: Collection[LaneKey], now: float) -> None:
        """Bring these lanes to what their rules allow, after jobs left them."""

    async def lane_rules(self, namespace: str) -> list[LaneRule]:
        """A namespace's lane rules, in pattern order."""


class Migrating(Session, Protocol):
    """A session that can also run a migration's statements as written."""

    async def script(self, sql: str) -> None: ...


def drive(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends (its statements are sync calls), without an
    event loop: a flow on SQLite's connection, an insert on a sync psycopg one."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coro.close()
    raise RuntimeError("a flow driven without an event loop suspended")


async def job_get(session: Session, job_id: int) -> Job | None:
    """The job, hot or finished, in the session's snapshot."""
    rows = await session.rows("job_get_hot", {"id": job_id})
    if not rows:
        rows = await session.rows("job_get_history", {"id": job_id})
    return job_from_row(rows[0]) if rows else None


async def cancel(session: Session, job_id: int, now: float) -> Job:
    """Cancel a job (``Store.job_cancel``). A running job is asked to stop: its worker
    ends it. One not started moves to history as cancelled, and its lane makes room. A
    cancelled job is returned as it is; any other that has ended is refused."""
    key = {"id": job_id}
    in_lane = {(row["namespace"], row["lane"]) for row in await session.rows("lane_of_job", key)}
    await session.lock_lanes(in_lane)  # the lane before the row
    await session.execute("job_lock", key)
    job = await job_get(session, job_id)
    if job is None:
        raise JobNotFound(job_id)
    if job.state == State.RUNNING:
        await session.execute("job_request_cancel", key)
    elif not job.terminal:  # scheduled, waiting or ready: the locked row moves for sure
        params = {"id": job_id, "state": State.CANCELLED.value, "now": now}
        await session.execute("job_move_terminal", params)
        await session.execute("job_delete", key)
        await session.settle_lanes(in_lane, now)
    elif job.state != State.CANCELLED:
        raise InvalidTransition(f"job {job_id} is already {job.state}; it cannot be cancelled")
    found = await job_get(session, job_id)
    assert found is not None
    return found


async def insert_unique(
    session: Session,
    job: NewJob,
    args: Sequence[str],
    insert: Callable[[Sequence[str]], Awaitable[int]],
) -> list[Inserted]:
    """Jobs with a unique key (``job.unique_key``): while a job with the key is not
    finished, or, with ``unique_for``, was created within that many seconds, every one
    of ``args`` is that job; else ``insert`` (the backend's insert, which settles the
    job's lane) writes the first and returns its id, and the others are that job."""
    assert job.unique_key is not None
    if not args:
        return []
    if job.lane is not None:
        await session.lock_lanes({(job.namespace, job.lane)})  # before any row
    key = {"namespace": job.namespace, "unique_key": job.unique_key}
    await session.execute("job_lock_unique", key)  # enqueues of one key, one at a time
    existing = await session.value("job_find_unique_hot", key)
    if existing is None and job.unique_for is not None:
        since = job.created_at - job.unique_for
        existing = await session.value("job_find_unique_recent", {**key, "since": since})
    if existing is not None:
        return [Inserted(int(existing), False)] * len(args)
    first = await insert(args[:1])
    return [Inserted(first, True)] + [Inserted(first, False)] * (len(args) - 1)


async def insert_after(
    session: Session,
    job: NewJob,
    args: Sequence[str],
    insert: Callable[[NewJob, Sequence[str]], Awaitable[list[Inserted]]],
) -> list[Inserted]:
    """Jobs that wait for others (``job.after``), which must exist in the job's
    namespace. A job with a dependency not ended yet is held: its run_at is HELD until
    the history trigger (migration 0011) sees the last one end. A dependency that has
    ended already counts at once: a success is done with; any other end fails the job
    (unless ``after_failed`` is "run"), which is then not held but left to its worker
    to end dead. ``insert`` is the backend's insert (unique keys and lanes included);
    a job it did not create (a duplicate) keeps its own dependencies."""
    ids = {"ids": json.dumps(list(job.after))}
    # PostgreSQL locks the rows of those still running, so that none ends unseen
    # between this read and the commit; a job that ended meanwhile is in history.
    # Rows are read by position: a psycopg connection gives tuples.
    found = {r[0]: (r[1], State(r[2])) for r in await session.rows("job_dependencies_hot", ids)}
    for job_id, namespace, state in await session.rows("job_dependencies_ended", ids):
        found.setdefault(job_id, (namespace, State(state)))
    for job_id in job.after:
        if job_id not in found or found[job_id][0] != job.namespace:
            raise UnknownDependency(job_id, job.namespace)
    ended = {i: found[i][1] for i in job.after if found[i][1].terminal}
    left = len(job.after) - len(ended)
    failed = next((i for i, state in ended.items() if state != State.SUCCEEDED), None)
    fails = failed is not None and job.after_failed == "fail"
    if left and not fails:
        state = State.WAITING if job.lane is not None else State.SCHEDULED
        job = dataclasses.replace(job, run_at=HELD, state=state)
    inserted = await insert(job, args)
    created = json.dumps([row.id for row in inserted if row.created])
    if created == "[]":
        return inserted
    hold = {
        "ids": created, "deps_left": left,
        "after_failed": "run" if job.after_failed == "run" else None,
        "dep_failed": None if failed is None or not fails
        else json.dumps([failed, ended[failed].value]),
    }  # fmt: skip
    await session.execute("job_hold", hold)
    after = json.dumps(list(job.after))
    await session.execute("job_dependencies_add", {"ids": created, "after": after})
    return inserted


async def rate_gate(
    session: Session, namespace: str, picked: Sequence[Row], now: float
) -> tuple[list[int], bool | None]:
    """Of the ready jobs a claim picked (rows of id, lane, started, in claim order,
    locked against other claims), those that may start at ``now``, in that order, and
    whether the namespace still has a rate at all (None: not read, as no job picked
    is in a lane). Jobs of lanes without a rate all may. For each lane with one, its
    window is locked (PostgreSQL: its row, in key order, so claims on every machine
    decide one after another) and :func:`lanes.gate` decides; the jobs it defers go
    back to ``scheduled``, and the windows are written."""
    if all(row[1] is None for row in picked):  # no lane, no rate to keep
        return [row[0] for row in picked], None
    rules = await session.lane_rules(namespace)
    rates: dict[str, lanes.Rate] = {}
    for lane in {row[1] for row in picked} - {None}:
        if (rate := lanes.rule_for(rules, lane).rate) is not None:
            rates[lane] = rate
    if not rates:
        return [row[0] for row in picked], any(rule.rate for rule in rules)
    keys = {"namespace": namespace, "lanes": json.dumps(sorted(rates))}
    windows = {row[0]: row for row in await session.rows("lane_windows_lock", keys)}
    unstarted: dict[str, list[lanes.Unstarted]] = {}
    for lane, job_id, state, run_at in await session.rows("lane_unstarted", keys):
        unstarted.setdefault(lane, []).append(lanes.Unstarted(job_id, State(state), run_at))
    mine: dict[str, list[lanes.Picked]] = {}  # each lane's picked jobs, in claim order
    for job_id, lane, started in picked:
        if lane in rates:
            mine.setdefault(lane, []).append(lanes.Picked(job_id, bool(started)))
    allowed: set[int] = set()
    deferred: dict[int, float] = {}
    windows_after: list[list[Any]] = []  # [lane, starts, deferred_until, until]
    for lane, rate in sorted(rates.items()):
        ids = {job.id for job in mine[lane]}
        gated = lanes.gate(
            rate,
            json.loads(windows[lane][1]),
            mine[lane],
            [u for u in unstarted.get(lane, ()) if u.id not in ids],
            now,
        )
        allowed.update(gated.start)
        deferred.update(gated.defer)
        was = windows[lane][2]
        until = max([*gated.starts, now]) + rate.per
        deferred_until = max(
            (t for t in (was, gated.deferred_until) if t is not None), default=None
        )
        windows_after.append(
            [lane, json.dumps(gated.starts), deferred_until, max(until, deferred_until or 0.0)]
        )
    written = {"namespace": namespace, "windows": json.dumps(windows_after)}
    await session.execute("lane_windows_put", written)
    if deferred:
        defer = json.dumps([[job_id, due] for job_id, due in deferred.items()])
        await session.execute("job_defer", {"defer": defer})
    return [row[0] for row in picked if row[1] not in rates or row[0] in allowed], True


async def lane_list(session: Session, namespace: str, limit: int) -> list[LaneInfo]:
    """Lanes with hot jobs, busiest first, then halted lanes that have none."""
    rules = await session.lane_rules(namespace)
    rule = functools.partial(lanes.rule_for, rules)
    rows = await session.rows("lane_list", {"namespace": namespace, "limit": limit})
    found = [
        LaneInfo(
            r["lane"], r["waiting"], r["admitted"], r["running"], r["halted_by"], rule(r["lane"])
        )
        for r in rows
    ]
    listed = {info.lane for info in found}
    for r in await session.rows("lane_halts", {"namespace": namespace}):
        if r["lane"] not in listed:
            found.append(LaneInfo(r["lane"], 0, 0, 0, r["job_id"], rule(r["lane"])))
    return found


async def job_counts(session: Session, namespace: str | None) -> Counts:
    """Counts by (namespace, queue, state), hot and historical: ``job_counts`` gives
    them in parts (hot jobs, folded history, history not folded yet), added up here."""
    totals: Counts = {}
    for row in await session.rows("job_counts", {"namespace": namespace}):
        group = (row["namespace"], row["queue"], row["state"])
        totals[group] = totals.get(group, 0) + int(row["n"])
    return totals


async def migrate(
    session: Migrating, migrations: Sequence[tuple[int, str, str]], now: float
) -> list[int]:
    """Apply the migrations not recorded yet, in order, and record each at ``now``;
    return their versions. Runs in one write transaction, whose ``migration_lock``
    lets one migrator through at a time."""
    await session.execute("migration_lock", {})
    await session.execute("migration_table", {})
    done = {row["version"] for row in await session.rows("migration_versions", {})}
    applied = []
    for version, name, sql in migrations:
        if version in done:
            continue
        for statement in split_script(sql):
            await session.script(statement)
        params = {"version": version, "name": name, "applied_at": now}
        await session.execute("migration_record", params)
        applied.append(version)
    return applied


async def schema_version(session: Session) -> int:
    """The latest migration applied (0: none)."""
    return int(await session.value("schema_version", {}) or 0)
