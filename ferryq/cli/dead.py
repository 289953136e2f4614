"""``ferryq dead``: the dead letters, listed, respawned or purged, one by one or all
of them (``--all``, a page at a time, with a progress bar on a terminal)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import click

from ferryq.app import App
from ferryq.cli.jobs import check_states
from ferryq.cli.options import JOB_ID, json_option
from ferryq.cli.output import emit_json, err, out, print_jobs, report
from ferryq.cli.settings import get_app
from ferryq.job import State

#: Jobs per page when an operation walks every dead job (``--all``).
PAGE = 500

all_option = click.option("--all", "every", is_flag=True, help="Every dead job (of --queue).")
queue_option = click.option("--queue", help="With --all: only this queue.")


@click.group()
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
    print_jobs(found, limit, as_json, app.clock())


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
