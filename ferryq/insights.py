"""Read-only views shared by the Python API, the CLI, the HTTP API and the dashboard."""

from __future__ import annotations

import math
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ferryq import lanes
from ferryq.errors import JobNotFound
from ferryq.job import Job, State
from ferryq.store.base import PeriodicState, Store, WorkerInfo

#: A worker whose last heartbeat is older than this is not counted as live.
WORKER_ALIVE_SECONDS = 15.0
#: The task of jobs published through the lmstfy-compatible API: HTTP clients consume
#: them, not Python workers.
HTTP_TASK = "lmstfy"
#: How a server's id (the holder of the leases its HTTP consumers take) begins. A server
#: writes no heartbeat of its own: HTTP consumers answer for their leases by ack or ttr.
HTTP_HOLDER_PREFIX = "http:"
#: The error type of an attempt stopped at its time limit (``ferryq.TimedOut``).
TIMED_OUT = "TimedOut"
#: The most jobs an explanation names (of a fan-in's dependencies still running).
MAX_LISTED = 20
#: The stores on which this process takes part in maintenance (a server does), so that
#: expired leases are recovered whether or not a worker runs (see ``maintained_here``).
_MAINTAINED: weakref.WeakSet[Store] = weakref.WeakSet()


@dataclass(frozen=True, slots=True)
class Explanation:
    """Why a job is (not) running: a reason code, a sentence, and the data behind it."""

    job_id: int
    state: State
    reason: str
    message: str
    data: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.message

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "state": str(self.state),
            "reason": self.reason,
            "message": self.message,
            "data": self.data,
        }


def when(ts: float | None) -> str:
    """A timestamp as people read it in logs: ISO 8601, UTC, to the millisecond."""
    if ts is None:
        return "-"
    moment = utc_moment(ts)
    if moment is None:
        return unix_time(ts)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def utc_moment(ts: float) -> datetime | None:
    """``ts`` (Unix seconds) as a UTC datetime, or None beyond the years 1 to 9999.

    A stored time can be any float (a job enqueued with a huge delay before enqueue
    bounded it, say); showing it must not fail.
    """
    try:
        return datetime.fromtimestamp(ts, UTC)
    except (OverflowError, ValueError, OSError):
        return None


def unix_time(ts: float) -> str:
    """A time no calendar date can show, as its raw Unix seconds."""
    return f"Unix time {ts:g}"


def timed_out(error: Mapping[str, Any] | None) -> bool:
    """Whether ``error`` (an entry of ``Job.errors``) is an attempt stopped at its
    time limit."""
    return error is not None and error.get("type") == TIMED_OUT


def error_line(error: Mapping[str, Any], timeout: float | None) -> str:
    """An error on one line: ``Type: message``, or ``timed out after S s`` for an
    attempt stopped at its time limit (``timeout``, the job's)."""
    if timed_out(error):
        return "timed out" if timeout is None else f"timed out after {timeout:g} s"
    return f"{error.get('type', 'error')}: {error.get('message', '')}"


def amount(value: Any) -> str:
    """A number from a progress report as people read it: ``4,000``, ``2.5``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return printable(str(value))
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        value = int(value)
    return f"{value:,}" if isinstance(value, int) else f"{value:,.6g}"


def progress_fraction(progress: Mapping[str, Any] | None) -> float | None:
    """``done / total`` of a report that has a positive total, else None."""
    if not progress:
        return None
    done, total = progress.get("done"), progress.get("total")
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (done, total))
    if not numbers or not total or total <= 0 or not math.isfinite(done / total):
        return None
    return float(done / total)


def progress_text(progress: Mapping[str, Any], *, note: bool = True) -> str:
    """A progress report on one line: ``4,000 / 10,000 (40%) — resizing``; a report
    without a total is its count alone. ``at`` is left to the caller."""
    done, total = progress.get("done"), progress.get("total")
    text = amount(done) if total is None else f"{amount(done)} / {amount(total)}"
    fraction = progress_fraction(progress)
    if fraction is not None:
        text += f" ({math.floor(fraction * 100):d}%)"
    said = progress.get("note")
    if note and said:
        text += f" — {printable(str(said))}"
    return text


def printable(text: str) -> str:
    """``text`` with control characters (a newline, an escape sequence) written as
    escapes: a job's note stays on its line and cannot drive the operator's terminal."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def maintained_here(store: Store, maintained: bool = True) -> None:
    """Say that this process runs (or no longer runs) the maintenance duties on
    ``store``: explain then counts on it to recover expired leases."""
    if maintained:
        _MAINTAINED.add(store)
    else:
        _MAINTAINED.discard(store)


async def explain(store: Store, job_id: int, now: float) -> Explanation:
    job = await store.job_get(job_id)
    if job is None:
        raise JobNotFound(job_id)
    if job.terminal:
        return _explain_terminal(job)
    if job.state == State.RUNNING:
        return _explain_running(job, await _lease_keepers(store, job, now), now)
    if job.expires_at is not None and job.expires_at <= now:
        return _say(job, "expiring", f"passed its ttl at {when(job.expires_at)}; it will not run",
                    expires_at=job.expires_at)  # fmt: skip
    if job.state == State.WAITING and job.lane is not None:
        return await _explain_waiting(store, job)
    if job.held_by_dependencies:
        return await _explain_held(store, job)
    if job.lane is not None and (rated := await _explain_rated(store, job, now)) is not None:
        return rated
    if job.run_at > now:
        return _explain_not_due(job)
    return await _explain_ready(store, job, now)


async def _explain_rated(store: Store, job: Job, now: float) -> Explanation | None:
    """Explain "rate limited until T" for a job of a lane with a rate: due, but the
    window is full; or deferred by a claim for the window (not a delay or a backoff of
    its own)."""
    assert job.lane is not None
    rate = lanes.rule_for(await store.lane_rules(job.namespace), job.lane).rate
    if rate is None:
        return None
    window = await store.lane_window(job.namespace, job.lane)
    recent = lanes.in_window(window.starts, rate, now)
    free = lanes.next_start(recent, rate, now)
    if job.run_at > now:
        if job.error is not None or window.deferred_until is None:
            return None
        if job.run_at > window.deferred_until:
            return None
        until = job.run_at
    elif free > now:
        until = free
    else:
        return None
    return _say(job, "rate_limited",
                f"rate limited until {when(until)}: lane {job.lane!r} starts at most "
                f"{rate.n} job(s) in any {rate.per:g} s, and {len(recent)} started in the "
                f"last {rate.per:g} s", lane=job.lane, until=until, rate_n=rate.n,
                rate_per=rate.per, started_in_window=len(recent))  # fmt: skip


async def _explain_waiting(store: Store, job: Job) -> Explanation:
    assert job.lane is not None
    lane, view = job.lane, await store.lane_view(job.namespace, job.lane)
    if view.halted_by is not None:
        message = (f"lane {lane!r} is halted by dead job {view.halted_by}; respawn or purge "
                   "that job to release the lane")  # fmt: skip
        return _say(job, "lane_halted", message, lane=lane, halted_by=view.halted_by)
    position = await store.lane_ahead(job.namespace, lane, job.id) + 1
    held = [{"id": h.id, "state": str(h.state)} for h in view.held]
    data = {"lane": lane, "position": position, "limit": view.rule.limit, "held": held}
    if not view.held:
        return _say(job, "lane_waiting", f"waiting at position {position} in lane {lane!r}",
                    **data)  # fmt: skip
    if view.rule.limit == 1:
        ahead = view.held[0]
        return _say(job, "lane_order",
                    f"waiting behind job {ahead.id} ({ahead.state}) at position {position} in "
                    f"lane {lane!r}", waiting_for=ahead.id, **data)  # fmt: skip
    listed = ", ".join(f"{h.id} ({h.state})" for h in view.held)
    return _say(job, "lane_limit",
                f"lane {lane!r} is at its limit of {view.rule.limit} (held by: {listed}); "
                f"position {position} in the lane", **data)  # fmt: skip


async def _explain_held(store: Store, job: Job) -> Explanation:
    after = (await store.job_dependencies(job.id)).after
    running = [d.id for d in after if d.ended is None]
    if not running:  # released as this was read
        return _explain_not_due(job)
    shown = ", ".join(str(i) for i in running[:MAX_LISTED])
    more = f" and {len(running) - MAX_LISTED} more" if len(running) > MAX_LISTED else ""
    return _say(job, "dependencies",
                f"waiting for {len(running)} of its {len(after)} dependencies to end: "
                f"job(s) {shown}{more}", waiting_for=running[:MAX_LISTED],
                waiting=len(running), dependencies=len(after))  # fmt: skip


def _explain_terminal(job: Job) -> Explanation:
    finished = when(job.finished_at)
    if job.state == State.SUCCEEDED:
        return _say(job, "done", f"succeeded at {finished} after {job.attempts} attempt(s)")
    if job.state == State.CANCELLED:
        return _say(job, "cancelled", f"cancelled at {finished}")
    if job.state == State.EXPIRED:
        return _say(job, "expired", f"expired at {finished}: its ttl passed before it could run",
                    expires_at=job.expires_at)  # fmt: skip
    message = (job.error or {}).get("message", "unknown error")
    if timed_out(job.error):
        assert job.error is not None
        message = error_line(job.error, job.timeout)
    return _say(job, "dead", f"dead since {finished} after {job.attempts} attempt(s): {message}",
                error=job.error, timeout=job.timeout)  # fmt: skip


@dataclass(frozen=True, slots=True)
class _Keepers:
    """Who answers for a running job's lease: its holder's last heartbeat (None if it
    has none on record), and whether anyone will recover the lease once it runs out."""

    heartbeat_at: float | None
    holder_stopped: bool
    live_workers: int
    maintained: bool

    def data(self) -> dict[str, Any]:
        return {"worker_heartbeat_at": self.heartbeat_at, "worker_stopped": self.holder_stopped,
                "live_workers": self.live_workers, "maintained": self.maintained}  # fmt: skip


async def _lease_keepers(store: Store, job: Job, now: float) -> _Keepers:
    workers = await store.worker_list()
    live = [w for w in workers if w.heartbeat_at >= now - WORKER_ALIVE_SECONDS]
    holder = next((w for w in workers if w.id == job.worker), None)
    beat = None if holder is None else holder.heartbeat_at
    # An HTTP consumer's lease has no heartbeat behind it: it is never "stopped".
    by_http = (job.worker or "").startswith(HTTP_HOLDER_PREFIX)
    stopped = not by_http and (beat is None or beat < now - WORKER_ALIVE_SECONDS)
    maintained = bool(live) or store in _MAINTAINED
    return _Keepers(beat, stopped, len(live), maintained)


def _explain_running(job: Job, keepers: _Keepers, now: float) -> Explanation:
    deadline = attempt_deadline(job)
    data = {"worker": job.worker, "lease_until": job.lease_until, "fence": job.fence,
            **keepers.data(), "timeout": job.timeout, "deadline": deadline,
            "progress": job.progress}  # fmt: skip
    expired = job.lease_until is not None and job.lease_until < now
    # A holder that stopped heartbeating does not finish the job: its lease must run out.
    gone = _holder_gone(job, keepers, now)
    after = "" if expired else f" after {when(job.lease_until)}"
    fate = [gone, _recovery(keepers, after)] if gone else []
    if job.cancel_requested:
        doing = fate or [f"worker {job.worker} is stopping it"]
        return _say(job, "cancelling", "; ".join(["cancel requested", *doing]), **data)
    if expired:
        ran_out = f"lease of worker {job.worker} ran out at {when(job.lease_until)}"
        parts = [ran_out, *(fate or [_recovery(keepers, after)])]
        return _say(job, "lease_expired", "; ".join(parts), **data)
    attempt = f"(attempt {job.attempts} of {job.max_tries}, fence {job.fence})"
    leased = f"leased by worker {job.worker} until {when(job.lease_until)} {attempt}"
    if deadline is not None:
        leased = (f"{_time_limit(job, deadline, now)}; leased until {when(job.lease_until)} "
                  f"{attempt}")  # fmt: skip
    said = [leased]
    if job.progress:
        said.append(f"progress {_progress_report(job.progress, now)}")
    return _say(job, "running", "; ".join([*said, *fate]), **data)


def attempt_deadline(job: Job) -> float | None:
    """When a running attempt's time limit passes: its handler's start (the claim's
    time until the worker has written that) plus the job's timeout."""
    start = job.started_at if job.started_at is not None else job.claimed_at
    if job.timeout is None or start is None:
        return None
    return start + job.timeout


def _time_limit(job: Job, deadline: float, now: float) -> str:
    assert job.timeout is not None
    start = f"running on worker {job.worker} since {when(deadline - job.timeout)}"
    if deadline <= now:  # the handler has not stopped yet: a sync one in a C call, say
        return (f"{start}, time limit {job.timeout:g} s: passed at {when(deadline)}, the "
                "worker is stopping it")  # fmt: skip
    return f"{start}, time limit {job.timeout:g} s: stopped at {when(deadline)} if still running"


def _progress_report(progress: Mapping[str, Any], now: float) -> str:
    at = progress.get("at")
    if not isinstance(at, int | float) or isinstance(at, bool):
        return progress_text(progress)
    return f"{progress_text(progress)}, reported {max(now - at, 0.0):.0f} s ago"


def _holder_gone(job: Job, keepers: _Keepers, now: float) -> str:
    """Why the lease holder has probably stopped, or "" while it heartbeats."""
    if not keepers.holder_stopped:
        return ""
    if keepers.heartbeat_at is None:
        return f"worker {job.worker} has no heartbeat on record; it has probably stopped"
    ago = max(now - keepers.heartbeat_at, 0.0)
    return f"worker {job.worker} last heartbeat {ago:.0f} s ago; it has probably stopped"


def _recovery(keepers: _Keepers, after: str) -> str:
    """What recovers the lease (``after`` its end, if it has not run out yet): the
    maintenance leader, or nothing until a worker runs."""
    if not keepers.maintained:
        return (f"no worker is running: start one (ferryq worker ...) and the lease will be "
                f"recovered{after}")  # fmt: skip
    if after:
        return f"the maintenance leader will recover the lease{after}"
    return "the maintenance leader will recover it"


def _explain_not_due(job: Job) -> Explanation:
    if timed_out(job.error) and job.attempts > 0:
        limit = "" if job.timeout is None else f" (limit {job.timeout:g} s)"
        return _say(job, "backoff",
                    f"backing off until {when(job.run_at)} after it timed out{limit}: "
                    f"attempt {job.attempts} of {job.max_tries} failed",
                    run_at=job.run_at, error=job.error, timeout=job.timeout)  # fmt: skip
    if job.error is not None and job.attempts > 0:
        message = job.error.get("message", "")
        return _say(job, "backoff",
                    f"backing off until {when(job.run_at)} after error: {message} "
                    f"(attempt {job.attempts} of {job.max_tries} failed)",
                    run_at=job.run_at, error=job.error)  # fmt: skip
    return _say(job, "scheduled", f"scheduled until {when(job.run_at)}", run_at=job.run_at)


async def _explain_ready(store: Store, job: Job, now: float) -> Explanation:
    state = "ready" if job.state == State.READY else f"due since {when(job.run_at)}"
    if job.task == HTTP_TASK:
        return _say(job, "ready",
                    f"{state}; waiting for an HTTP consumer of queue {job.queue!r} "
                    f"in namespace {job.namespace!r}", queue=job.queue)  # fmt: skip
    workers = [
        w for w in await store.worker_list(alive_since=now - WORKER_ALIVE_SECONDS)
        if w.namespace == job.namespace and job.queue in w.queues
    ]  # fmt: skip
    if not workers:
        return _say(job, "no_worker",
                    f"{state}, but no live worker consumes queue {job.queue!r} "
                    f"in namespace {job.namespace!r}", queue=job.queue)  # fmt: skip
    names = [w.id for w in workers]
    return _say(job, "ready",
                f"{state}; waiting for a free slot among {len(workers)} worker(s) on queue "
                f"{job.queue!r}", workers=names)  # fmt: skip


def _say(job: Job, reason: str, message: str, **data: Any) -> Explanation:
    if job.stage is None and not job.stages:
        return Explanation(job.id, job.state, reason, f"job {job.id}: {message}", data)
    # A multi-stage job: which stage this is about, and how the earlier ones went.
    number = 1 + sum(1 for record in job.stages if record.get("outcome") == "next")
    name = "" if job.stage is None else f", {job.stage!r}"
    data.update(stage=job.stage, stage_number=number, stages=job.stages)
    return Explanation(job.id, job.state, reason, f"job {job.id} (stage {number}{name}): {message}",
                       data)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Stats:
    counts: dict[str, dict[str, int]]  # queue -> state -> count
    workers: list[WorkerInfo]
    periodic: list[PeriodicState] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "queues": self.counts,
            "workers": [
                {
                    "id": w.id,
                    "queues": w.queues,
                    "host": w.host,
                    "pid": w.pid,
                    "concurrency": w.concurrency,
                    "heartbeat_at": w.heartbeat_at,
                    "running": w.running,
                }
                for w in self.workers
            ],
            "periodic": [
                {
                    "task": p.task,
                    "schedule": p.schedule,
                    "queue": p.queue,
                    "catch_up": p.catch_up,
                    "last_tick": p.last_tick,
                    "last_job": p.last_job,
                    "last_state": p.last_state,
                    "next_tick": p.next_tick,
                    "updated_at": p.updated_at,
                }
                for p in self.periodic
            ],
        }


async def stats(store: Store, namespace: str, now: float) -> Stats:
    counts: dict[str, dict[str, int]] = {}
    for (_ns, queue, state), n in sorted((await store.job_counts(namespace)).items()):
        counts.setdefault(queue, {s.value: 0 for s in State})[state] = n
    workers = [
        w for w in await store.worker_list(alive_since=now - WORKER_ALIVE_SECONDS)
        if w.namespace == namespace
    ]  # fmt: skip
    return Stats(counts, workers, await store.periodic_list(namespace))
