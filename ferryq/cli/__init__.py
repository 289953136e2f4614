"""The ``ferryq`` command line (docs/operations.md, "Day-to-day commands").
``python -m ferryq`` runs the same program.

Errors ferryq raises on purpose become one line on stderr: exit code 1 when a job does
not exist, 2 for anything else the user can fix (bad options, bad arguments, a state
that does not allow the operation, a database out of reach, read-only or on a full
disk). ``--json`` prints machine-readable JSON on stdout.

Commands that only read never create a SQLite database: they fail when the file does
not exist, and read one they cannot write. Commands that write create it.

This module holds the root command; each group of commands has a module of its own
(``jobs``, ``dead``, ``lanes``, ``worker``, ``enqueue``, ``migrate``, ``stats``,
``demo``), and what they share is in ``settings`` (the global options and the App),
``options`` and ``output``. The commands of the HTTP server (``server``, ``token``)
are imported only when one of them runs or the commands are listed: the other
commands start without loading the server or the dashboard.
"""

from __future__ import annotations

import importlib
from typing import Any

import click
from click.core import ParameterSource

import ferryq
from ferryq.app import DEFAULT_URL
from ferryq.cli import dead, demo, enqueue, jobs, lanes, migrate, stats, worker
from ferryq.cli.output import CliError, NotFoundError
from ferryq.cli.settings import Settings
from ferryq.errors import FerryqError, JobNotFound

#: Commands defined elsewhere, imported when one of them runs or is listed in the help:
#: they load the HTTP server (starlette, uvicorn, the dashboard) or its tokens.
LAZY_COMMANDS = {"server": "ferryq.cli.server:server", "token": "ferryq.cli.tokens:token"}


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
        ctx.meta[worker.ARGV] = list(args)  # as given: ``worker --processes`` passes them on
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


cli.add_command(worker.worker)
cli.add_command(migrate.migrate)
cli.add_command(enqueue.enqueue)
cli.add_command(jobs.jobs)
cli.add_command(dead.dead)
cli.add_command(lanes.lanes)
cli.add_command(stats.stats)
cli.add_command(demo.demo)
