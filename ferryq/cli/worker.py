"""``ferryq worker``: run the tasks of a user's App, in this process or in several
kept running by this one (``--processes``).

The worker module itself (``ferryq.Worker``) is imported on first use, when this
command runs, not when the command line starts.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from typing import Any

import click

import ferryq
from ferryq import logs
from ferryq.app import App
from ferryq.cli.options import FiniteFloat, log_format_option, log_level_option
from ferryq.cli.output import CliError
from ferryq.cli.settings import configured, load_app, settings
from ferryq.errors import DatabaseReadOnly, DiskFull, StoreError

#: Where the root command keeps the command line's arguments (``ctx.meta``): a worker
#: started with ``--processes`` gives its children the same ones.
ARGV = "ferryq.argv"
# A worker process hands the interpreter from thread to thread every millisecond
# rather than Python's default five: the SQLite store writes from a thread of its own,
# and after each statement that thread must win the interpreter back from a busy
# event loop. Drains on SQLite run 3-12% faster (docs/operations.md); the HTTP server
# did not gain (bench.http) and keeps the default.
WORKER_SWITCH_INTERVAL = 0.001


@click.command()
@click.argument("target", metavar="MODULE:APP", envvar="FERRYQ_APP")
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
@click.option("--direct-url", envvar="FERRYQ_DIRECT_URL", show_envvar=True,
              help="Behind a pooler: the database reached directly, for wake-ups.")  # fmt: skip
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
    direct_url: str | None,
    log_level: str,
    log_format: str,
) -> None:
    """Run the tasks of the App at MODULE:APP (e.g. myproject.jobs:app; by default
    FERRYQ_APP's, which ``manage.py ferryq`` sets to the Django project's)."""
    app = configured(load_app(target), settings(ctx))
    if direct_url:
        app.direct_url = direct_url
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
