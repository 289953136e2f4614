"""Read models: what the dashboard's pages and the metrics page show, gathered from
the store and ``insights`` into plain records.

Nothing here writes SQL or renders HTML. Each function reads one page's data; the
faces reach them through ``Operations`` (``overview``, ``lanes_page``), the
templates lay the records out.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from ferryq import insights
from ferryq.job import Job, State
from ferryq.lanes import LaneRule
from ferryq.store.base import JobFilter, LaneInfo, Store, WorkerInfo

#: The activity charts: one bar per minute over the last hour.
BUCKET_SECONDS = 60.0
BUCKETS = 60
#: Activity is computed from the newest jobs, read a page at a time, at most this many:
#: enough for every job of the hour up to about 1.4 jobs a second; above that the
#: charts cover the most recent part of the hour, and say so.
ACTIVITY_PAGE = 500
ACTIVITY_MAX_JOBS = 5000
#: A job that finished within the hour was enqueued within it or a little before it;
#: older jobs (long delays, long backoffs) are left out of the charts.
ACTIVITY_LOOKBACK_SLACK = 3600.0
#: The error type of an attempt whose lease ran out (``ferryq.worker.executor``'s
#: ``LeaseExpired``; named, not imported, so that reads do not load the worker).
LEASE_EXPIRED = "LeaseExpired"
STATES = [s.value for s in State]


@dataclass(slots=True)
class QueueRow:
    namespace: str
    queue: str
    counts: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.counts.values())


@dataclass(slots=True)
class Bucket:
    start: float
    succeeded: int = 0
    failed: int = 0  # attempts that failed and were retried
    dead: int = 0
    other: int = 0  # cancelled or expired
    waits: list[float] = field(default_factory=list)

    @property
    def finished(self) -> int:
        return self.succeeded + self.dead + self.other

    def wait(self, quantile: float) -> float | None:
        if not self.waits:
            return None
        if len(self.waits) == 1:
            return self.waits[0]
        cuts = statistics.quantiles(self.waits, n=100, method="inclusive")
        return cuts[min(98, max(0, round(quantile * 100) - 1))]


@dataclass(slots=True)
class Activity:
    """The last hour, minute by minute, from the jobs' own timestamps."""

    since: float
    now: float
    buckets: list[Bucket]
    lease_recoveries: int
    sampled: int
    covers_from: float  # the earliest moment the sample is complete for

    @property
    def complete(self) -> bool:
        return self.covers_from <= self.since

    @property
    def finished(self) -> int:
        return sum(b.finished for b in self.buckets)

    @property
    def dead(self) -> int:
        return sum(b.dead for b in self.buckets)

    @property
    def failed(self) -> int:
        return sum(b.failed for b in self.buckets)


@dataclass(slots=True)
class Overview:
    rows: list[QueueRow]
    totals: dict[str, int]
    activity: Activity
    recent_dead: list[Job]
    halted: list[tuple[str, LaneInfo]]  # (namespace, lane)
    workers: list[WorkerInfo]
    at: float  # when it was computed


def count_rows(counts: dict[tuple[str, str, str], int]) -> tuple[list[QueueRow], dict[str, int]]:
    rows: dict[tuple[str, str], QueueRow] = {}
    totals = dict.fromkeys(STATES, 0)
    for (namespace, queue, state), n in sorted(counts.items()):
        row = rows.setdefault(
            (namespace, queue), QueueRow(namespace, queue, dict.fromkeys(STATES, 0))
        )
        row.counts[state] = row.counts.get(state, 0) + n
        totals[state] = totals.get(state, 0) + n
    return list(rows.values()), totals


async def overview(store: Store, namespace: str | None, now: float) -> Overview:
    rows, totals = count_rows(await store.job_counts(namespace))
    dead = await store.job_list(JobFilter(namespace=namespace, state=State.DEAD, limit=5))
    namespaces = [namespace] if namespace is not None else sorted({r.namespace for r in rows})
    halted = [
        (ns, lane) for ns in namespaces for lane in await store.lane_list(ns, 20)
        if lane.halted_by is not None
    ]  # fmt: skip
    return Overview(
        rows, totals, await activity(store, namespace, now), dead, halted,
        await live_workers(store, namespace, now), now,
    )  # fmt: skip


async def activity(store: Store, namespace: str | None, now: float) -> Activity:
    """Throughput, failures, lag and lease recoveries over the last hour.

    Jobs are read newest first (by id, the enqueue order) until they were enqueued
    before the hour (less some slack) or the sample is full.
    """
    since = now - BUCKETS * BUCKET_SECONDS
    jobs: list[Job] = []
    after: int | None = None
    covers_from = since
    while True:
        page = await store.job_list(
            JobFilter(namespace=namespace, after_id=after, limit=ACTIVITY_PAGE)
        )
        jobs += page
        if len(page) < ACTIVITY_PAGE or page[-1].created_at < since - ACTIVITY_LOOKBACK_SLACK:
            break
        if len(jobs) >= ACTIVITY_MAX_JOBS:
            covers_from = max(since, page[-1].created_at)
            break
        after = page[-1].id
    return tally(jobs, since, now, covers_from)


def tally(jobs: Sequence[Job], since: float, now: float, covers_from: float) -> Activity:
    buckets = [Bucket(since + i * BUCKET_SECONDS) for i in range(BUCKETS)]

    def bucket(ts: float | None) -> Bucket | None:
        if ts is None or ts < since or ts >= since + BUCKETS * BUCKET_SECONDS:
            return None
        return buckets[int((ts - since) // BUCKET_SECONDS)]

    recoveries = 0
    for job in jobs:
        if job.terminal and (b := bucket(job.finished_at)) is not None:
            if job.state == State.SUCCEEDED:
                b.succeeded += 1
            elif job.state == State.DEAD:
                b.dead += 1
            else:
                b.other += 1
        for error in job.errors:
            at = error.get("at")
            if not isinstance(at, int | float) or (b := bucket(at)) is None:
                continue
            if error.get("type") == LEASE_EXPIRED:
                recoveries += 1
            last = job.state == State.DEAD and error is job.errors[-1]
            if not last:
                b.failed += 1
        if job.claimed_at is not None and (b := bucket(job.claimed_at)) is not None:
            b.waits.append(max(0.0, job.claimed_at - job.run_at))
    return Activity(since, now, buckets, recoveries, len(jobs), covers_from)


async def live_workers(store: Store, namespace: str | None, now: float) -> list[WorkerInfo]:
    alive = await store.worker_list(alive_since=now - insights.WORKER_ALIVE_SECONDS)
    return [w for w in alive if namespace is None or w.namespace == namespace]


@dataclass(slots=True)
class LanesPage:
    namespace: str
    lanes: list[LaneInfo]
    halted: list[LaneInfo]
    rules: list[LaneRule]


async def lanes_page(store: Store, namespace: str, limit: int = 50) -> LanesPage:
    listed = await store.lane_list(namespace, limit)
    halted = [lane for lane in listed if lane.halted_by is not None]
    busy = [lane for lane in listed if lane.waiting or lane.admitted or lane.running]
    return LanesPage(namespace, busy, halted, await store.lane_rules(namespace))
