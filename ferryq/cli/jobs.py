"""``ferryq jobs``: list, inspect, cancel and retry jobs."""

from __future__ import annotations

from collections.abc import Collection, Sequence

import click

from ferryq import _render
from ferryq.app import App
from ferryq.cli.options import JOB_ID, json_option
from ferryq.cli.output import CliError, emit_json, out, print_jobs, report, show
from ferryq.cli.settings import get_app
from ferryq.job import State
from ferryq.ops import RESPAWNABLE


def state_names(states: Collection[State]) -> str:
    """``dead, cancelled or expired``: the states, in the order of ``State``."""
    names = [state.value for state in State if state in states]
    return ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else "".join(names)


@click.group()
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
    app = get_app(ctx, read_only=True)
    found = app.list_jobs(
        state=State(state) if state else None, after_id=after, limit=limit, **filters
    )
    print_jobs(found, limit, as_json, app.clock())


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


@jobs.command("retry", help=f"Queue {state_names(RESPAWNABLE)} jobs again with a fresh try count.")
@click.argument("job_ids", metavar="ID...", type=JOB_ID, nargs=-1, required=True)
@json_option
@click.pass_context
def jobs_retry(ctx: click.Context, job_ids: tuple[int, ...], as_json: bool) -> None:
    app = get_app(ctx)
    only = f"retried (only {state_names(RESPAWNABLE)} jobs)"
    check_states(app, job_ids, RESPAWNABLE, only)
    report("respawned", app.respawn(list(job_ids)), as_json)


def check_states(app: App, job_ids: Sequence[int], allowed: Collection[State], what: str) -> None:
    """Fail before changing anything if a job is unknown or in the wrong state."""
    wrong = [job for job in (app.get_job(i) for i in job_ids) if job.state not in allowed]
    if wrong:
        listed = ", ".join(f"job {job.id} is {job.state}" for job in wrong)
        raise CliError(f"{listed}; cannot be {what}; nothing was changed")
