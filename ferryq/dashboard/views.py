"""What the dashboard's pages show, read through the Store protocol and ``insights``.

Nothing here writes SQL or renders HTML: each function gathers one page's data into
plain records that the templates lay out.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ferryq import insights
from ferryq.job import Job, State
from ferryq.lanes import LaneRule
from ferryq.store.base import JobFilter, LaneInfo, Store, WorkerInfo
from ferryq.worker.executor import LeaseExpired

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
LEASE_EXPIRED = LeaseExpired.__name__  # the error type of an attempt whose lease ran out
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
class Event:
    """One line of a job's timeline."""

    at: float
    what: str
    detail: str = ""
    kind: str = "info"  # info, ok, fail, timeout, dead: how the line is marked
    traceback: str | None = None


def timeline(job: Job) -> list[Event]:
    """Enqueue, every failed attempt, every finished stage, and the current attempt."""
    events = [Event(job.created_at, "enqueued", _enqueue_detail(job))]
    for record in job.stages:
        finished = record.get("finished_at")
        # The last stage's own record repeats the job's end, which has a line below.
        if isinstance(finished, int | float) and record.get("outcome", "next") == "next":
            stage = record.get("stage") or "first stage"
            events.append(Event(finished, f"stage {stage} done", _span(record), "ok"))
    for number, error in enumerate(job.errors, 1):
        at = error.get("at")
        if not isinstance(at, int | float):
            continue
        final = job.state == State.DEAD and number == len(job.errors)
        attempt = error.get("attempt", "?")
        stage = f" (stage {error['stage']})" if error.get("stage") else ""
        stopped = insights.timed_out(error)
        ended = insights.error_line(error, job.timeout) if stopped else "failed"
        what = f"attempt {attempt}{stage} {ended}" + (", no tries left: dead" if final else "")
        detail = (f"{error.get('type')}: stopped at its time limit" if stopped
                  else f"{error.get('type', 'Error')}: {error.get('message', '')}")  # fmt: skip
        if error.get("worker"):
            detail += f" — worker {error['worker']}"
        kind = "dead" if final else "timeout" if stopped else "fail"
        events.append(Event(at, what, detail, kind, error.get("traceback")))
    if job.claimed_at is not None:
        who = f"worker {job.worker}" if job.worker else "a worker"
        events.append(Event(job.claimed_at, f"attempt {job.attempts} claimed",
                            f"by {who}, fencing token {job.fence}"))  # fmt: skip
    if job.started_at is not None:
        events.append(Event(job.started_at, f"attempt {job.attempts} started"))
    if job.state == State.RUNNING and job.lease_until is not None:
        events.append(Event(job.lease_until, "lease runs out", "unless the worker renews it"))
    if job.state == State.RUNNING and (deadline := insights.attempt_deadline(job)) is not None:
        events.append(Event(deadline, "time limit passes",
                            "the worker stops the attempt if it still runs"))  # fmt: skip
    if job.terminal and job.finished_at is not None and job.state != State.DEAD:
        kind = "ok" if job.state == State.SUCCEEDED else "dead"
        events.append(Event(job.finished_at, str(job.state), "", kind))
    if job.state == State.DEAD and job.finished_at is not None and not job.errors:
        events.append(Event(job.finished_at, "dead", "", "dead"))
    return sorted(events, key=lambda e: e.at)


@dataclass(slots=True)
class Progress:
    """A job's progress report as its page shows it: a bar when it has a total."""

    text: str  # "4,000 / 10,000 (40%)", the note apart
    note: str | None
    at: float | None
    fraction: float | None  # done / total, for the bar; None without a total
    last: bool  # the report of an attempt that ended, not of a running one


def progress(job: Job) -> Progress | None:
    report = job.progress
    if not report:
        return None
    at = report.get("at")
    note = report.get("note")
    fraction = insights.progress_fraction(report)
    return Progress(
        insights.progress_text(report, note=False), None if note is None else str(note),
        at if isinstance(at, int | float) and not isinstance(at, bool) else None,
        None if fraction is None else min(max(fraction, 0.0), 1.0),
        job.state != State.RUNNING,
    )  # fmt: skip


def _enqueue_detail(job: Job) -> str:
    parts = [f"queue {job.queue}"]
    if job.lane:
        parts.append(f"lane {job.lane}")
    if job.priority:
        parts.append(f"priority {job.priority:g} s")
    if job.run_at > job.created_at + 0.5 and job.attempts == 0:
        parts.append(f"due {insights.when(job.run_at)}")
    return ", ".join(parts)


def _span(record: dict[str, Any]) -> str:
    started, finished = record.get("started_at"), record.get("finished_at")
    if isinstance(started, int | float) and isinstance(finished, int | float):
        return f"ran {seconds(finished - started)}"
    return ""


def pretty(value: Any) -> str:
    """JSON as people read it: indented, non-ASCII kept."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False, default=str)


def brief(value: Any, width: int = 80) -> str:
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    return text if len(text) <= width else text[: width - 1] + "…"


def seconds(value: float) -> str:
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 120:
        return f"{value:.1f} s"
    if value < 7200:
        return f"{value / 60:.0f} min"
    hours = value / 3600
    return f"{hours:.1f} h" if hours < 1e6 else f"{hours:.3g} h"  # far off: no 300 digits


def ago(ts: float | None, now: float) -> str:
    if ts is None:
        return "-"
    delta = now - ts
    return f"{seconds(delta)} ago" if delta >= 0 else f"in {seconds(-delta)}"


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
