"""Terminal views shared by the command line and the demo: tables, job pages, JSON.

Job data (args, errors, task names) is shown as plain :class:`rich.text.Text`, never
parsed as markup, so a job cannot restyle or hide parts of the operator's terminal.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

from rich import box
from rich.console import Console, ConsoleDimensions, Group, RenderableType
from rich.table import Table
from rich.text import Text

from ferryq.insights import (
    Explanation,
    Stats,
    error_line,
    progress_text,
    timed_out,
    unix_time,
    utc_moment,
    when,
)
from ferryq.job import Job, State
from ferryq.lanes import LaneRule
from ferryq.ops import LaneInfo, PeriodicState, Token

STATE_STYLES: dict[State, str] = {
    State.SCHEDULED: "cyan",
    State.WAITING: "magenta",
    State.READY: "blue",
    State.RUNNING: "yellow",
    State.SUCCEEDED: "green",
    State.DEAD: "bold red",
    State.CANCELLED: "dim",
    State.EXPIRED: "dim red",
}

#: The width of output that is not a terminal: no row of a table is ever this long, so
#: piped into ``grep`` or a file every row is one whole line.
PIPE_WIDTH = 1_000_000


class Output(Console):
    """A console that prints whole lines where its output is not a terminal.

    Rich would wrap and fold text at 80 columns there (or at the width of a terminal
    that another stream is attached to), cutting a long task name or lane in two, so
    ``ferryq jobs ls | grep NAME`` would miss rows. COLUMNS is not read for a pipe.
    """

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        return size if self.is_terminal else ConsoleDimensions(PIPE_WIDTH, size.height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        self._width, self._height = new_size


def console(*, stderr: bool = False) -> Console:
    """The console the command line and the demo print through."""
    return Output(stderr=stderr, highlight=False)


# -- JSON ----------------------------------------------------------------------


def plain(value: Any) -> Any:
    """``value`` with only JSON types left: enums by value, non-finite floats as null."""
    if isinstance(value, enum.Enum):
        return plain(value.value)
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, str | int | float):
        return value
    return str(value)


def to_json(value: Any) -> str:
    return json.dumps(plain(value), indent=2, ensure_ascii=False, allow_nan=False)


# -- small pieces --------------------------------------------------------------


def state_text(state: State) -> Text:
    return Text(state.value, style=STATE_STYLES.get(state, ""))


def text(value: Any) -> Text:
    """Untrusted data as a table cell: no markup, ``-`` for nothing."""
    if value is None or value == "":
        return Text("-", style="dim")
    if isinstance(value, str):
        return Text(value)
    return Text(json.dumps(plain(value), ensure_ascii=False))


def short_when(ts: float | None, now: float) -> str:
    """A UTC time for lists: the time of day if it is today, else the date and minute."""
    if ts is None:
        return "-"
    moment = utc_moment(ts)
    if moment is None:
        return unix_time(ts)
    today = utc_moment(now)
    if today is not None and moment.date() == today.date():
        return moment.strftime("%H:%M:%S")
    return moment.strftime("%Y-%m-%d %H:%M")


def retry_text(policy: Mapping[str, Any]) -> str:
    if not policy:
        return "default (exponential, capped at 1 h)"
    values = "/".join(f"{s:g}" for s in policy.get("seconds", []))
    jitter = f", jitter {policy['jitter']:g}" if policy.get("jitter") else ""
    return f"{policy.get('kind', '?')} {values} s{jitter}"


def seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if abs(value) < 1:
        return f"{value * 1000:.0f} ms"
    return f"{value:.1f} s" if abs(value) < 1e6 else f"{value:.3g} s"  # no 300 digits


def _table(title: str | None = None) -> Table:
    return Table(
        box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True, title=title,
        title_justify="left", title_style="bold",
    )  # fmt: skip


def _pretty_json(value: Any) -> Text:
    return Text(json.dumps(plain(value), indent=2, ensure_ascii=False))


def _section(title: str) -> Text:
    return Text(f"\n{title}", style="bold")


# -- job lists -----------------------------------------------------------------


def jobs_table(jobs: Iterable[Job], now: float) -> Table:
    table = _table()
    table.add_column("id", justify="right", no_wrap=True)
    table.add_column("state", no_wrap=True)
    table.add_column("queue")
    table.add_column("task", overflow="fold")
    table.add_column("tries", justify="right", no_wrap=True)
    table.add_column("created (UTC)", no_wrap=True)
    table.add_column("note", overflow="fold")
    for job in jobs:
        table.add_row(
            str(job.id), state_text(job.state), text(job.queue), text(job.task),
            f"{job.attempts}/{job.max_tries}", short_when(job.created_at, now),
            job_note(job, now),
        )  # fmt: skip
    return table


def job_note(job: Job, now: float) -> Text:
    """The one thing worth knowing about a job in a list."""
    if job.held_by_dependencies:
        return Text("after its dependencies")
    if job.state in (State.DEAD, State.SCHEDULED) and job.error:
        message = error_line(job.error, job.timeout)
        if job.state == State.SCHEDULED and timed_out(job.error):
            message = f"{message}, retry {short_when(job.run_at, now)}"
        elif job.state == State.SCHEDULED:
            message = f"retry {short_when(job.run_at, now)} after {message}"
        return Text(message, style="red" if job.state == State.DEAD else "")
    if job.state == State.SCHEDULED:
        return Text(f"due {short_when(job.run_at, now)}")
    if job.state == State.RUNNING:
        if job.progress:
            return Text(f"on {job.worker}: {progress_text(job.progress, note=False)}")
        return Text(f"on {job.worker}")
    if job.state == State.SUCCEEDED and job.started_at and job.finished_at:
        return Text(f"took {seconds(job.finished_at - job.started_at)}")
    if job.lane:
        return Text(f"lane {job.lane}")
    return Text("")


# -- one job -------------------------------------------------------------------

_FIELDS = (
    "namespace", "queue", "task", "lane", "stage", "priority", "ttr", "timeout", "retry",
    "unique_key", "worker", "fence", "cancel_requested",
)  # fmt: skip
_TIMES = (
    "created_at", "run_at", "claimed_at", "started_at", "finished_at", "lease_until",
    "expires_at",
)  # fmt: skip


def job_page(job: Job, now: float) -> Group:
    """Everything stored about a job, for ``jobs show``."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    grid.add_row("id", str(job.id))
    grid.add_row("state", state_text(job.state))
    grid.add_row("attempts", f"{job.attempts} of {job.max_tries}")
    if job.state == State.RUNNING:
        grid.add_row("progress", progress_cell(job.progress, now))
    for name in _FIELDS:
        grid.add_row(name.replace("_", " "), _field(job, name))
    for name in _TIMES:
        grid.add_row(name.replace("_", " "), when(getattr(job, name)))
    if job.state != State.RUNNING and job.progress:
        # What the last attempt said before it ended (a claim clears it).
        grid.add_row("last progress report", progress_cell(job.progress, now, last=True))
    parts: list[RenderableType] = [grid, _section("args"), _pretty_json(job.args)]
    if job.context is not None:
        parts += [_section("context"), _pretty_json(job.context)]
    if job.state == State.SUCCEEDED or job.result is not None:
        parts += [_section("result"), _pretty_json(job.result)]
    if job.error:
        parts += [_section("error"), error_text(job.error, job.timeout)]
    if job.errors:
        parts += [_section(f"errors ({len(job.errors)})"), errors_table(job.errors, job.timeout)]
    if job.stages:
        parts += [_section(f"stages ({len(job.stages)})"), stages_table(job.stages)]
    return Group(*parts)


def _field(job: Job, name: str) -> Text:
    if name == "retry":
        return text(retry_text(job.retry))
    if name == "timeout":
        return text(None if job.timeout is None else f"{job.timeout:g} s per attempt")
    return text(getattr(job, name))


def progress_cell(progress: Mapping[str, Any] | None, now: float, *, last: bool = False) -> Text:
    """A progress report: ``4,000 / 10,000 (40%) — resizing, 3 s ago``; the ``last``
    report of an attempt that ended says when it was made."""
    if not progress:
        return Text("none reported", style="dim")
    shown = Text(progress_text(progress))
    at = progress.get("at")
    if not isinstance(at, int | float) or isinstance(at, bool):
        return shown
    if last:
        shown.append(f", reported at {when(at)}", style="dim")
    else:
        age = max(now - at, 0.0)
        shown.append(f", {age:.0f} s ago" if age < 60 else f", {seconds(age)} ago", style="dim")
    return shown


def error_text(error: Mapping[str, Any], timeout: float | None = None) -> Text:
    line = Text(error_line(error, timeout), style="red")
    if timed_out(error):  # stopped by the worker: no traceback, the type named once
        line.append(f" ({error.get('type')})", style="dim red")
    details = [f"{k} {error[k]}" for k in ("attempt", "stage", "worker") if error.get(k)]
    if error.get("at"):
        details.append(f"at {when(error['at'])}")
    if details:
        line.append(f"  ({', '.join(details)})", style="dim")
    traceback = error.get("traceback")
    if traceback:
        line.append("\n" + str(traceback).rstrip(), style="")
    return line


def errors_table(errors: Iterable[Mapping[str, Any]], timeout: float | None = None) -> Table:
    table = _table()
    for name in ("attempt", "at", "worker", "error"):
        table.add_column(name, overflow="fold")
    for error in errors:
        table.add_row(
            text(error.get("attempt")), when(error.get("at")), text(error.get("worker")),
            Text(error_line(error, timeout)),
        )  # fmt: skip
    return table


def stages_table(stages: Iterable[Mapping[str, Any]]) -> Table:
    """The stages a job went through, each with how it ended; the current stage, if
    the job is not finished, is not among them yet."""
    table = _table()
    for name in ("#", "stage", "outcome", "tries", "last try started", "finished"):
        table.add_column(name, overflow="fold", justify="right" if name == "#" else "left")
    for number, stage in enumerate(stages, 1):
        table.add_row(
            str(number), text(stage.get("stage")), text(stage.get("outcome")),
            text(stage.get("attempts")), when(stage.get("started_at")),
            when(stage.get("finished_at")),
        )  # fmt: skip
    return table


def stages_text(stages: Iterable[Mapping[str, Any]]) -> str:
    """A stage history on one line: ``audit: next (1 try); transcode: dead (3 tries)``."""
    parts = []
    for stage in stages:
        tries = stage.get("attempts")
        count = "" if tries is None else f" ({tries} {'try' if tries == 1 else 'tries'})"
        parts.append(f"{stage.get('stage') or 'first stage'}: {stage.get('outcome')}{count}")
    return "; ".join(parts)


# -- explain and stats ---------------------------------------------------------


def explanation_text(explanation: Explanation) -> Text:
    out = Text(explanation.message)
    out.append(f"\nreason: {explanation.reason}", style="dim")
    for key, value in explanation.data.items():
        if key == "error" and isinstance(value, Mapping):
            value = f"{value.get('type', 'error')}: {value.get('message', '')}"
        elif key == "stages" and isinstance(value, list):
            value = stages_text(value) or "-"
        elif key == "progress" and isinstance(value, Mapping):
            value = f"{progress_text(value)}, reported at {when(value.get('at'))}"
        elif key == "timeout" and isinstance(value, int | float):
            value = f"{value:g} s"
        elif key.endswith(("_at", "_until")) or key == "deadline":
            value = when(value) if isinstance(value, int | float) else value
        shown = value if isinstance(value, str) else json.dumps(plain(value), ensure_ascii=False)
        out.append(f"\n{key}: {shown}", style="dim")
    return out


def counts_table(counts: Mapping[str, Mapping[str, int]], title: str | None = None) -> Table:
    """Jobs by queue (rows) and state (columns), with totals.

    A state with no job in any queue gets no column (ready and running always do), so
    the table fits a terminal; ``--json`` has every state.
    """
    rows = {queue: [by_state.get(s.value, 0) for s in State] for queue, by_state in counts.items()}
    totals = [sum(column) for column in zip(*rows.values(), strict=True)] or [0] * len(State)
    shown = [i for i, s in enumerate(State) if totals[i] or s in (State.READY, State.RUNNING)]
    table = _table(title)
    table.add_column("queue")
    for i in shown:
        state = list(State)[i]
        table.add_column(Text(state.value, style=STATE_STYLES[state]), justify="right")
    table.add_column("total", justify="right", style="bold")
    for queue, row in sorted(rows.items()):
        table.add_row(Text(queue), *(_count(row[i]) for i in shown), str(sum(row)))
    if len(rows) != 1:
        table.add_section()
        table.add_row(
            Text("all", style="bold"), *(_count(totals[i]) for i in shown), str(sum(totals))
        )
    return table


def _count(n: int) -> Text:
    return Text(str(n), style="" if n else "dim")


def workers_table(stats: Stats, now: float) -> Table:
    table = _table("live workers")
    for name in ("worker", "queues", "slots", "running", "heartbeat"):
        table.add_column(name, overflow="fold")
    for worker in stats.workers:
        table.add_row(
            Text(worker.id), Text(",".join(worker.queues)), str(worker.concurrency),
            str(len(worker.running)), f"{seconds(now - worker.heartbeat_at)} ago",
        )  # fmt: skip
    return table


def stats_view(stats: Stats, now: float) -> Group:
    parts: list[RenderableType] = [
        counts_table(stats.counts, title="jobs") if stats.counts else Text("no jobs", style="dim")
    ]
    if stats.workers:
        parts.append(workers_table(stats, now))
    else:
        parts.append(Text("no live workers", style="yellow"))
    if stats.periodic:
        parts.append(periodic_table(stats.periodic, now))
    return Group(*parts)


def periodic_table(periodic: Iterable[PeriodicState], now: float) -> Table:
    table = _table("periodic tasks")
    for name in ("task", "schedule", "queue", "last tick (UTC)", "last job", "next tick (UTC)"):
        table.add_column(name, overflow="fold")
    for entry in periodic:
        last_job = Text("-", style="dim")
        if entry.last_job is not None:
            last_job = Text(f"{entry.last_job} ")
            if entry.last_state is not None:
                last_job.append_text(state_text(State(entry.last_state)))
        table.add_row(
            Text(entry.task), Text(entry.schedule), Text(entry.queue),
            short_when(entry.last_tick, now), last_job, short_when(entry.next_tick, now),
        )  # fmt: skip
    return table


# -- lanes ---------------------------------------------------------------------


def rule_text(rule: LaneRule) -> str:
    rate = "" if rule.rate is None else f", rate {rule.rate}"
    return f"limit {rule.limit}, on dead {rule.on_dead}{rate}"


def lanes_table(lanes: Iterable[LaneInfo]) -> Table:
    table = _table()
    table.add_column("lane", overflow="fold")
    for name in ("waiting", "admitted", "running", "limit"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("rule", overflow="fold")
    table.add_column("halted by", justify="right", no_wrap=True)
    for info in lanes:
        rule = "default" if info.rule.pattern == "*" else info.rule.pattern
        halted = Text(str(info.halted_by), style="bold red") if info.halted_by else text(None)
        table.add_row(
            Text(info.lane), _count(info.waiting), _count(info.admitted), _count(info.running),
            str(info.rule.limit), Text(rule), halted,
        )  # fmt: skip
    return table


def rules_table(rules: Iterable[LaneRule]) -> Table:
    table = _table()
    table.add_column("pattern", overflow="fold")
    table.add_column("limit", justify="right")
    table.add_column("on dead")
    table.add_column("rate", justify="right")
    for rule in rules:
        style = "bold red" if rule.on_dead == "halt" else ""
        table.add_row(
            Text(rule.pattern),
            str(rule.limit),
            Text(rule.on_dead, style=style),
            str(rule.rate or "-"),
        )
    return table


def tokens_table(tokens: Iterable[Token]) -> Table:
    table = _table()
    table.add_column("namespace")
    table.add_column("token")
    table.add_column("description", overflow="fold")
    table.add_column("created")
    table.add_column("limit")
    for token in tokens:
        limit = (
            "-"
            if token.limit_interval is None
            else (
                f"{token.limit_read} reads, {token.limit_write} writes / {token.limit_interval:g} s"
            )
        )
        table.add_row(Text(token.namespace), Text(token.hint), Text(token.description),
                      when(token.created_at), limit)  # fmt: skip
    return table
