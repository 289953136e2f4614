"""How the dashboard presents a job: its timeline, its progress, and values made short
and readable. The data of whole pages (counts, activity, lanes) are read models in
``ferryq.ops.views``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ferryq import insights
from ferryq.job import Job, State


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
    if job.held_by_dependencies:
        parts.append("due once its dependencies end")
    elif job.run_at > job.created_at + 0.5 and job.attempts == 0:
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
