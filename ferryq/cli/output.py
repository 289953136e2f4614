"""What the command line prints, and the errors it shows instead of a traceback.

Tables and messages go to ``out`` (stdout), progress bars to ``err`` (stderr); ``--json``
prints through ``emit_json``. An error ferryq raises on purpose becomes a ``CliError``:
one line on stderr and exit code 2, or 1 for a job that does not exist.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import click
from rich.console import RenderableType

from ferryq import _render
from ferryq.job import Job

out = _render.console()
err = _render.console(stderr=True)


class CliError(click.ClickException):
    """A message for the user and an exit code; never a traceback."""

    exit_code = 2


class NotFoundError(CliError):
    exit_code = 1


def emit_json(value: Any) -> None:
    click.echo(_render.to_json(value))


def show(renderable: RenderableType) -> None:
    out.print(renderable)


def print_jobs(found: Sequence[Job], limit: int, as_json: bool, now: float) -> None:
    """A page of jobs (``jobs ls``, ``dead ls``), with how to ask for the next one; the
    table shows times relative to ``now``, the App's clock."""
    if as_json:
        emit_json([job.to_dict() for job in found])
    elif not found:
        out.print("no jobs", style="dim")
    else:
        show(_render.jobs_table(found, now))
        if len(found) == limit:
            out.print(f"more: add --after {found[-1].id}", style="dim")


def report(verb: str, ids: Sequence[int], as_json: bool = False) -> None:
    """What an operation on jobs did: ``respawned 2 job(s): 4 5``."""
    if as_json:
        emit_json({verb: list(ids)})
    else:
        out.print(f"{verb} {len(ids)} job(s): {' '.join(str(i) for i in ids)}")
