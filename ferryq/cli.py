"""The ``ferryq`` command line (SPEC §15). ``python -m ferryq`` runs the same program.

Errors ferryq raises on purpose become one line on stderr: exit code 1 when a job does
not exist, 2 for anything else the user can fix (bad options, bad arguments, a state
that does not allow the operation, a database out of reach, read-only or on a full
disk). ``--json`` prints machine-readable JSON on stdout.

Commands that only read never create a SQLite database: they fail when the file does
not exist, and read one they cannot write. Commands that write create it.

The commands of the HTTP server (``server``, ``token``) live in ``ferryq.cli_server``,
imported only when one of them runs: the other commands start without loading the
server or the dashboard. What both modules share is in ``ferryq.cli_common``.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import math
import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from typing import Any

import click
from click.core import ParameterSource
from rich.text import Text

import ferryq
from ferryq import _render, backoff, logs
from ferryq import lanes as lanes_module
from ferryq.app import DEFAULT_URL, App
from ferryq.cli_common import (
    CliError,
    NotFoundError,
    Settings,
    configured,
    emit_json,
    err,
    get_app,
    json_option,
    load_app,
    log_format_option,
    log_level_option,
    out,
    settings,
    show,
)
from ferryq.errors import DatabaseReadOnly, DiskFull, FerryqError, JobNotFound, StoreError
from ferryq.job import MAX_JOB_ID, Job, State
from ferryq.ops import safe_url

#: Where the root command keeps the command line's arguments (``ctx.meta``).
ARGV = "ferryq.argv"
#: Jobs per page when an operation walks every dead job (``--all``).
PAGE = 500
#: A job id as both backends store it: a positive signed 64-bit integer.
JOB_ID = click.IntRange(1, MAX_JOB_ID)
# A worker process hands the interpreter from thread to thread every millisecond
# rather than Python's default five: the SQLite store writes from a thread of its own,
# and after each statement that thread must win the interpreter back from a busy
# event loop. Drains on SQLite run 3-12% faster (docs/operations.md); the HTTP server
# did not gain (bench.http) and keeps the default.
WORKER_SWITCH_INTERVAL = 0.001
#: Commands defined elsewhere, imported when one of them runs or is listed in the help:
#: ``ferryq.cli_server`` loads the HTTP server (starlette, uvicorn, the dashboard).
LAZY_COMMANDS = {"server": "ferryq.cli_server:server", "token": "ferryq.cli_server:token"}


class FiniteFloat(click.FloatRange):
    """A float option, optionally bounded, that refuses ``nan`` and ``inf``."""

    name = "float"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


class FerryqGroup(click.Group):
    """The root group: turns ferryq's own errors into one line on stderr, and imports
    the commands of ``LAZY_COMMANDS`` when asked for them."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *LAZY_COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in LAZY_COMMANDS and cmd_name not in self.commands:
            module, _, attribute = LAZY_COMMANDS[cmd_name].partition(":")
            self.add_command(getattr(importlib.import_module(module), attribute), cmd_name)
        return super().get_command(ctx, cmd_name)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta[ARGV] = list(args)  # as given: ``worker --processes`` passes them on
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except JobNotFound as exc:
            raise NotFoundError(str(exc)) from None
        except (FerryqError, ValueError) as exc:
            raise CliError(str(exc)) from None


def main() -> None:
    """Entry point of the ``ferryq`` script and of ``python -m ferryq``."""
    cli(prog_name="ferryq")


# -- the root ------------------------------------------------------------------


@click.group(cls=FerryqGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--url", envvar="FERRYQ_URL", default=DEFAULT_URL, show_default=True, show_envvar=True,
    help="Database URL: sqlite:///path/to.db or postgresql://…",
)  # fmt: skip
@click.option("--namespace", default="default", show_default=True, help="Job namespace.")
@click.version_option(ferryq.__version__, prog_name="ferryq")
@click.pass_context
def cli(ctx: click.Context, url: str, namespace: str) -> None:
    """ferryq: durable background jobs in SQL.

    Piped into another program or a file, tables print each row as one whole line
    (ferryq jobs ls | grep NAME). For scripts, --json prints every field as JSON.
    """
    given = ctx.get_parameter_source
    ctx.obj = Settings(
        url, namespace,
        url_given=given("url") is ParameterSource.COMMANDLINE,
        namespace_given=given("namespace") is ParameterSource.COMMANDLINE,
    )  # fmt: skip


# -- worker --------------------------------------------------------------------


@cli.command()
@click.argument("target", metavar="MODULE:APP")
@click.option("--concurrency", "-c", type=click.IntRange(min=1), default=10, show_default=True,
              help="Jobs run at once.")  # fmt: skip
@click.option("--queues", "-q", metavar="A,B", help="Queues to consume [default: the app's].")
@click.option("--burst", is_flag=True, help="Exit once nothing is due.")
@click.option("--processes", type=click.IntRange(min=1), default=1, show_default=True,
              help="Worker processes, kept running by this one.")  # fmt: skip
@click.option("--prefetch", type=click.IntRange(min=0), help="Jobs claimed beyond free slots.")
@click.option("--grace", type=FiniteFloat(min=0), default=30.0, show_default=True,
              help="Seconds running jobs get to finish on SIGTERM/SIGINT.")  # fmt: skip
@click.option("--retention-days", type=FiniteFloat(min=0, min_open=True), default=14.0,
              show_default=True, help="Days finished jobs stay in history.")  # fmt: skip
@log_level_option
@log_format_option
@click.pass_context
def worker(
    ctx: click.Context,
    target: str,
    concurrency: int,
    queues: str | None,
    burst: bool,
    processes: int,
    prefetch: int | None,
    grace: float,
    retention_days: float,
    log_level: str,
    log_format: str,
) -> None:
    """Run the tasks of the App at MODULE:APP (e.g. myproject.jobs:app)."""
    app = configured(load_app(target), settings(ctx))
    logs.configure(log_level, log_format)
    names = [q.strip() for q in queues.split(",") if q.strip()] if queues else None
    options = {"concurrency": concurrency, "queues": names, "burst": burst,
               "prefetch": prefetch, "grace": grace,
               "history_retention": retention_days * 86400}  # fmt: skip
    if processes > 1:
        ctx.exit(_supervise(app, options, processes, ctx.meta[ARGV]))
    sys.setswitchinterval(WORKER_SWITCH_INTERVAL)
    code = 0
    try:
        try:
            asyncio.run(_run_worker(app, options))
        finally:
            logs.flush()  # the worker's last lines come before any error line below
    except DatabaseUnavailable as exc:  # at the start: as for every other command
        click.echo(f"Error: {exc.__cause__}", err=True)
        code = CliError.exit_code
    except (DiskFull, DatabaseReadOnly) as exc:  # the first heartbeat, or a burst's round
        click.echo(f"Error: {exc}", err=True)
        code = CliError.exit_code
    except StoreError as exc:  # at the stop: the outcomes of running jobs were not written
        click.echo(f"Error: {exc}", err=True)
        code = 1
    # A sync handler still running past the grace period cannot be interrupted, and
    # its thread would hold the process open; its job is already back in the queue.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class DatabaseUnavailable(Exception):
    """The worker could not open the database (the StoreError is its cause)."""


async def _run_worker(app: App, options: dict[str, Any]) -> None:
    runner = ferryq.Worker(app, **options)
    try:
        try:
            await app.store()
        except StoreError as exc:
            raise DatabaseUnavailable from exc
        await runner.run()
    finally:
        await app.aclose()


def _supervise(app: App, options: dict[str, Any], processes: int, argv: list[str]) -> int:
    """Run ``processes`` workers, each a child with this command line; their status."""
    from ferryq.worker import supervisor

    ferryq.Worker(app, **options)  # checks the options once, here, not in every child
    command = supervisor.worker_command(argv)
    return supervisor.Supervisor(
        command, processes, grace=options["grace"], burst=options["burst"]
    ).run()


# -- migrate -------------------------------------------------------------------


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def migrate(ctx: click.Context, as_json: bool) -> None:
    """Apply pending schema migrations."""
    app = get_app(ctx)
    applied, version = app.migrate()
    if as_json:
        emit_json({"url": safe_url(app.url), "applied": applied, "schema_version": version})
        return
    if applied:
        out.print(f"applied migration(s): {', '.join(str(v) for v in applied)}")
    out.print(f"schema version {version}: up to date ({safe_url(app.url)})")


# -- enqueue -------------------------------------------------------------------

_OPTION_NAMES = ("queue", "lane", "delay", "priority", "ttl", "ttr", "timeout", "max_tries",
                 "retry", "unique_key", "unique_for", "after_failed", "after")  # fmt: skip
_OPTION_RE = re.compile(r"\b(" + "|".join(_OPTION_NAMES) + r")\b")


@cli.command()
@click.argument("task")
@click.argument("args_json", metavar="[ARGS_JSON]", default="[]", required=False)
@click.option("--queue", help="Queue [default: default].")
@click.option("--lane", help="Ordered lane key.")
@click.option("--delay", type=FiniteFloat(), help="Seconds before the job is due.")
@click.option("--priority", type=FiniteFloat(), help="Head start in seconds (may be negative).")
@click.option("--ttl", type=FiniteFloat(), help="Seconds the job has to finish from now.")
@click.option("--ttr", type=FiniteFloat(), help="Lease seconds per attempt [default: 60].")
@click.option("--timeout", type=FiniteFloat(),
              help="Time limit of each attempt in seconds [default: none].")  # fmt: skip
@click.option("--max-tries", type=int, help="Attempts before the job is dead [default: 3].")
@click.option("--retry", type=FiniteFloat(), metavar="N",
              help="Backoff: N>0 exponential capped at N s, N<0 fixed |N| s.")  # fmt: skip
@click.option("--unique-key", help="Deduplicate: return the unfinished job with this key.")
@click.option("--unique-for", type=FiniteFloat(), help="Deduplication window in seconds.")
@click.option("--after", type=JOB_ID, metavar="ID", multiple=True,
              help="A job that must end first (repeat for more).")  # fmt: skip
@click.option("--after-failed", type=click.Choice(["fail", "run"]),
              help="When one of those ends without success [default: fail].")  # fmt: skip
@click.option("--app", "target", metavar="MODULE:APP",
              help="Start from the defaults of TASK as registered in this App.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def enqueue(
    ctx: click.Context, /, task: str, args_json: str, retry: float | None, target: str | None,
    as_json: bool, **options: Any,
) -> None:  # fmt: skip
    """Enqueue TASK with ARGS_JSON: a JSON array (positional) or object (keywords),
    by default [] (no arguments).

    Options not given take the defaults of ferryq (or, with --app, of the task).
    """
    if not task.strip():
        raise CliError("TASK must be a task name, not empty")
    args = parse_args_json(args_json)
    app = get_app(ctx, target)
    if target is not None and task not in app.tasks:
        raise CliError(f"{target} has no task named {task!r}")
    try:
        if retry is not None:
            options["retry"] = backoff.from_signed(retry)
        options["after"] = options["after"] or None
        handle = app.enqueue(task, args, **options)
    except ValueError as exc:
        raise CliError(option_names(str(exc))) from None
    if as_json:
        emit_json({"id": handle.id, "created": handle.created})
    elif handle.created:
        out.print(f"enqueued job {handle.id}")
    else:
        out.print(f"job {handle.id} already exists with unique key "
                  f"{options['unique_key']!r}: nothing new enqueued")  # fmt: skip


def option_names(message: str) -> str:
    """A message of ferryq's about job options, with their command-line names
    (``max_tries`` → ``--max-tries``); the value it quotes (``(got …)``) stays as it is."""
    said, got, value = message.partition(" (got ")
    return _OPTION_RE.sub(lambda m: "--" + m[1].replace("_", "-"), said) + got + value


def parse_args_json(raw: str) -> list[Any] | dict[str, Any]:
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise CliError(f"ARGS_JSON is not valid JSON: {exc}") from None
    if not isinstance(value, list | dict):
        raise CliError(
            "ARGS_JSON must be a JSON array (positional arguments) or a JSON object "
            f"(keyword arguments), not {type(value).__name__} {raw.strip()[:40]}"
        )
    return value


# -- jobs ----------------------------------------------------------------------


@cli.group()
def jobs() -> None:
    """List, inspect, cancel and retry jobs."""


@jobs.command("ls")
@click.option("--state", type=click.Choice([s.value for s in State]))
@click.option("--queue")
@click.option("--task")
@click.option("--lane")
@click.option("--text", help="Substring of the job's arguments.")
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True)
@click.option("--after", type=JOB_ID, metavar="ID", help="Page on: jobs older than ID.")
@json_option
@click.pass_context
def jobs_ls(
    ctx: click.Context, /, state: str | None, after: int | None, limit: int, as_json: bool,
    **filters: str | None,
) -> None:  # fmt: skip
    """List jobs, newest first."""
    found = get_app(ctx, read_only=True).list_jobs(
        state=State(state) if state else None, after_id=after, limit=limit, **filters
    )
    print_jobs(found, limit, as_json)


def print_jobs(found: Sequence[Job], limit: int, as_json: bool) -> None:
    now = time.time()
    if as_json:
        emit_json([job.to_dict() for job in found])
    elif not found:
        out.print("no jobs", style="dim")
    else:
        show(_render.jobs_table(found, now))
        if len(found) == limit:
            out.print(f"more: add --after {found[-1].id}", style="dim")


@jobs.command("show")
@click.argument("job_id", metavar="ID", type=JOB_ID)
@json_option
@click.pass_context
def jobs_show(ctx: click.Context, job_id: int, as_json: bool) -> None:
    """Everything about one job: args, result, errors, stages, times, progress."""
    app = get_app(ctx, read_only=True)
    job = app.get_job(job_id)
    if as_json:
        emit_json(job.to_dict())
    else:
        show(_render.job_page(job, app.clock()))


@jobs.command("explain")
@click.argument("job_id", metavar="ID", type=JOB_ID)
@json_option
@click.pass_context
def jobs_explain(ctx: click.Context, job_id: int, as_json: bool) -> None:
    """Why a job is (not) running."""
    explanation = get_app(ctx, read_only=True).explain(job_id)
    if as_json:
        emit_json(explanation.to_dict())
    else:
        show(_render.explanation_text(explanation))


@jobs.command("deps")
@click.argument("job_id", metavar="ID", type=JOB_ID)
@json_option
@click.pass_context
def jobs_deps(ctx: click.Context, job_id: int, as_json: bool) -> None:
    """The jobs a job waits for (--after), and those that wait for it."""
    found = get_app(ctx, read_only=True).dependencies(job_id)
    if as_json:
        emit_json({
            "after": [{"id": d.id, "ended": d.ended} for d in found.after],
            "dependents": [{"id": d.id, "ended": d.ended} for d in found.dependents],
        })  # fmt: skip
        return
    for title, edges, pending in (("waits for", found.after, "not ended"),
                                  ("waited for by", found.dependents, "waiting")):  # fmt: skip
        if not edges:
            out.print(f"job {job_id} {title} no job", style="dim")
            continue
        out.print(f"job {job_id} {title} {len(edges)} job(s):")
        for edge in edges:
            out.print(f"  {edge.id}  {edge.ended or pending}")


@jobs.command("cancel")
@click.argument("job_id", metavar="ID", type=JOB_ID)
@json_option
@click.pass_context
def jobs_cancel(ctx: click.Context, job_id: int, as_json: bool) -> None:
    """Cancel a job: at once if it is not running, else ask its worker to stop it."""
    job = get_app(ctx).cancel(job_id)
    if as_json:
        emit_json(job.to_dict())
    elif job.state == State.CANCELLED:
        out.print(f"job {job.id} cancelled")
    else:
        out.print(f"job {job.id} is running on {job.worker}: cancel requested")


@jobs.command("retry")
@click.argument("job_ids", metavar="ID...", type=JOB_ID, nargs=-1, required=True)
@json_option
@click.pass_context
def jobs_retry(ctx: click.Context, job_ids: tuple[int, ...], as_json: bool) -> None:
    """Queue dead, cancelled or expired jobs again with a fresh try count."""
    app = get_app(ctx)
    retriable = {State.DEAD, State.CANCELLED, State.EXPIRED}
    check_states(app, job_ids, retriable, "retried (only dead, cancelled or expired jobs)")
    report("respawned", app.respawn(list(job_ids)), as_json)


# -- dead letters --------------------------------------------------------------


@cli.group()
def dead() -> None:
    """The dead letters: jobs that ran out of tries or failed for good."""


@dead.command("ls")
@click.option("--queue")
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True)
@click.option("--after", type=JOB_ID, metavar="ID", help="Page on: jobs older than ID.")
@json_option
@click.pass_context
def dead_ls(
    ctx: click.Context, queue: str | None, limit: int, after: int | None, as_json: bool
) -> None:
    """List dead jobs, newest first."""
    app = get_app(ctx, read_only=True)
    found = app.list_jobs(state=State.DEAD, queue=queue, limit=limit, after_id=after)
    print_jobs(found, limit, as_json)


all_option = click.option("--all", "every", is_flag=True, help="Every dead job (of --queue).")
queue_option = click.option("--queue", help="With --all: only this queue.")


@dead.command("respawn")
@click.argument("job_ids", metavar="ID...", type=JOB_ID, nargs=-1)
@all_option
@queue_option
@json_option
@click.pass_context
def dead_respawn(
    ctx: click.Context, job_ids: tuple[int, ...], every: bool, queue: str | None, as_json: bool
) -> None:
    """Queue dead jobs again with a fresh try count."""
    app = get_app(ctx)
    check_selection(job_ids, every, queue)
    if every:
        moved = for_every_dead(app, queue, "respawning", lambda ids: len(app.respawn(ids)))
        if as_json:
            emit_json({"respawned": moved})
        else:
            out.print(f"respawned {moved} dead job(s)")
        return
    check_states(app, job_ids, {State.DEAD}, "respawned here (not dead)")
    report("respawned", app.respawn(list(job_ids)), as_json)


@dead.command("purge")
@click.argument("job_ids", metavar="ID...", type=JOB_ID, nargs=-1)
@all_option
@queue_option
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@json_option
@click.pass_context
def dead_purge(
    ctx: click.Context,
    job_ids: tuple[int, ...],
    every: bool,
    queue: str | None,
    yes: bool,
    as_json: bool,
) -> None:
    """Delete dead jobs for good."""
    app = get_app(ctx)
    check_selection(job_ids, every, queue)
    if not every:
        check_states(app, job_ids, {State.DEAD}, "purged (not dead)")
    count = dead_count(app, queue) if every else len(job_ids)
    if count == 0:
        if as_json:
            emit_json({"purged": 0})
        else:
            out.print("no dead jobs", style="dim")
        return
    if not yes:
        click.confirm(f"Delete {count} dead job(s) for good?", abort=True, err=True)
    purged = for_every_dead(app, queue, "purging", app.purge) if every else app.purge(list(job_ids))
    if as_json:
        emit_json({"purged": purged})
    else:
        out.print(f"purged {purged} dead job(s)")


def check_selection(job_ids: Sequence[int], every: bool, queue: str | None) -> None:
    if every and job_ids:
        raise click.UsageError("give job ids or --all, not both")
    if not every and not job_ids:
        raise click.UsageError("give one or more job ids, or --all")
    if queue is not None and not every:
        raise click.UsageError("--queue goes with --all")


def check_states(app: App, job_ids: Sequence[int], allowed: set[State], what: str) -> None:
    """Fail before changing anything if a job is unknown or in the wrong state."""
    wrong = [job for job in (app.get_job(i) for i in job_ids) if job.state not in allowed]
    if wrong:
        listed = ", ".join(f"job {job.id} is {job.state}" for job in wrong)
        raise CliError(f"{listed}; cannot be {what}; nothing was changed")


def report(verb: str, ids: Sequence[int], as_json: bool = False) -> None:
    if as_json:
        emit_json({verb: list(ids)})
    else:
        out.print(f"{verb} {len(ids)} job(s): {' '.join(str(i) for i in ids)}")


def dead_count(app: App, queue: str | None) -> int:
    counts = app.stats().counts
    return sum(by_state.get(State.DEAD.value, 0) for q, by_state in counts.items()
               if queue is None or q == queue)  # fmt: skip


def dead_pages(app: App, queue: str | None) -> Iterator[list[int]]:
    """Ids of every dead job, a page at a time, newest first (keyset paging)."""
    after: int | None = None
    while page := app.list_jobs(state=State.DEAD, queue=queue, limit=PAGE, after_id=after):
        yield [job.id for job in page]
        after = page[-1].id


def for_every_dead(
    app: App, queue: str | None, verb: str, action: Callable[[list[int]], int]
) -> int:
    """Apply ``action`` to every dead job, with a progress bar on a terminal."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    done = 0
    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=err, transient=True, disable=not err.is_terminal,
    )  # fmt: skip
    with progress:
        bar = progress.add_task(verb, total=dead_count(app, queue))
        for ids in dead_pages(app, queue):
            done += action(ids)
            progress.advance(bar, len(ids))
    return done


# -- lanes ---------------------------------------------------------------------


@cli.group()
def lanes() -> None:
    """Ordered lanes: the busiest, and the limits per lane or prefix."""


@lanes.command("ls")
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True)
@json_option
@click.pass_context
def lanes_ls(ctx: click.Context, limit: int, as_json: bool) -> None:
    """Lanes with unfinished jobs, busiest first, then halted lanes."""
    found = get_app(ctx, read_only=True).lanes(limit=limit)
    if as_json:
        emit_json([asdict(info) for info in found])
    elif not found:
        out.print("no lanes with unfinished jobs", style="dim")
    else:
        show(_render.lanes_table(found))
        if len(found) == limit:
            out.print(f"the {limit} busiest lanes: add --limit for more", style="dim")


@lanes.command("limit")
@click.argument("pattern", required=False)
@click.argument("limit", type=int, required=False)
@click.option("--on-dead", type=click.Choice(lanes_module.ON_DEAD),
              help="With LIMIT: halt the lane behind a dead job, or go on. Left out, a "
                   "rule keeps its policy; a new rule continues.")  # fmt: skip
@click.option("--clear", is_flag=True, help="Remove the rule for PATTERN.")
@json_option
@click.pass_context
def lanes_limit(
    ctx: click.Context, pattern: str | None, limit: int | None, on_dead: str | None,
    clear: bool, as_json: bool,
) -> None:  # fmt: skip
    """Show, set or clear the limit of a lane (post:42) or a prefix (tenant:*).

    \b
    ferryq lanes limit                    every rule
    ferryq lanes limit tenant:acme        the rule lane tenant:acme follows
    ferryq lanes limit 'tenant:*' 3       at most 3 running jobs in each tenant lane
    ferryq lanes limit 'tenant:*' --clear back to the next rule, or the default of 1

    Jobs not started yet follow a change at once.
    """
    check_lane_limit_usage(pattern, limit, on_dead, clear)
    app = get_app(ctx, read_only=limit is None and not clear)
    if pattern is None:
        print_rules(app.lane_limits(), as_json)
    elif clear:
        lanes_module.check_rule(pattern, lanes_module.DEFAULT_LIMIT, "continue")
        cleared = app.clear_lane_limit(pattern)
        if as_json:
            emit_json({"pattern": pattern, "cleared": cleared})
        elif cleared:
            out.print(Text(f"cleared the rule for {pattern}"))
        else:
            out.print(Text(f"no rule for {pattern}: nothing changed", style="dim"))
    elif limit is not None:
        rule = app.set_lane_limit(pattern, limit, on_dead)
        if as_json:
            emit_json(asdict(rule))
        else:
            out.print(Text(f"{rule.pattern}: {_render.rule_text(rule)}"))
    else:
        lanes_module.check_rule(pattern, lanes_module.DEFAULT_LIMIT, "continue")
        rule = lanes_module.rule_for(app.lane_limits(), pattern)
        default = rule == lanes_module.DEFAULT_RULE
        if as_json:
            emit_json({"pattern": pattern, "rule": asdict(rule), "default": default})
        else:
            source = "the default" if default else f"rule {rule.pattern}"
            out.print(Text(f"{pattern}: {_render.rule_text(rule)} ({source})"))


@lanes.command("rate")
@click.argument("pattern")
@click.argument("n", type=int, required=False)
@click.option("--per", type=FiniteFloat(min=0.001), default=1.0, show_default=True,
              help="With N: the window, in seconds.")  # fmt: skip
@click.option("--clear", is_flag=True, help="Take the rate off PATTERN's rule.")
@json_option
@click.pass_context
def lanes_rate(
    ctx: click.Context, pattern: str, n: int | None, per: float, clear: bool, as_json: bool
) -> None:
    """Set or clear the rate of a lane (api:acme) or a prefix (api:*).

    \b
    ferryq lanes rate 'api:*' 10           at most 10 starts a second in each api lane
    ferryq lanes rate 'api:*' 100 --per 60 at most 100 starts in any minute
    ferryq lanes rate 'api:*' --clear      no rate; the limit and policy stay

    Every worker on every machine counts against one window per lane. The rule keeps
    its limit and policy; a new rule has limit 1. `ferryq lanes limit` shows rates.
    """
    if clear == (n is not None):
        raise click.UsageError("give N or --clear")
    app = get_app(ctx)
    if clear:
        rule = app.clear_lane_rate(pattern)
        if as_json:
            emit_json({"pattern": pattern, "cleared": rule is not None})
        elif rule is not None:
            out.print(Text(f"{rule.pattern}: {_render.rule_text(rule)}"))
        else:
            out.print(Text(f"no rule for {pattern}: nothing changed", style="dim"))
        return
    assert n is not None
    rule = app.set_lane_rate(pattern, n, per)
    if as_json:
        emit_json(asdict(rule))
    else:
        out.print(Text(f"{rule.pattern}: {_render.rule_text(rule)}"))


def check_lane_limit_usage(
    pattern: str | None, limit: int | None, on_dead: str | None, clear: bool
) -> None:
    if clear and limit is not None:
        raise click.UsageError("give LIMIT or --clear, not both")
    if pattern is None and clear:
        raise click.UsageError("--clear needs a PATTERN")
    if on_dead is not None and limit is None:
        raise click.UsageError("--on-dead goes with LIMIT")


def print_rules(rules: Sequence[lanes_module.LaneRule], as_json: bool) -> None:
    rules = sorted(rules, key=lambda rule: rule.pattern)  # the stores promise no order
    if as_json:
        emit_json([asdict(rule) for rule in rules])
    elif not rules:
        out.print(f"no lane rules: every lane runs {lanes_module.DEFAULT_LIMIT} job at a time")
    else:
        show(_render.rules_table(rules))


# -- stats and demo ------------------------------------------------------------


@cli.command()
@json_option
@click.pass_context
def stats(ctx: click.Context, as_json: bool) -> None:
    """Jobs by queue and state, the live workers and the periodic tasks."""
    app = get_app(ctx, read_only=True)
    current = app.stats()
    if as_json:
        emit_json(current.to_dict())
    else:
        show(_render.stats_view(current, app.clock()))


@cli.command()
@click.option("--seconds", type=FiniteFloat(min=1), default=60.0, show_default=True,
              help="Stop watching after this long.")  # fmt: skip
@click.option("--workers", type=click.IntRange(1, 16), default=2, show_default=True,
              help="Worker processes to start.")  # fmt: skip
@click.pass_context
def demo(ctx: click.Context, seconds: float, workers: int) -> None:
    """Run a short story of jobs on a fresh SQLite file and watch it live."""
    from ferryq import demo as demo_module

    ctx.exit(demo_module.run(seconds=seconds, workers=workers))
