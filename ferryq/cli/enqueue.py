"""``ferryq enqueue``: one job of a task, by name, with the options of ``JobOptions``
given on the command line. ferryq's messages about those options name them as the
command line spells them (``--max-tries``)."""

from __future__ import annotations

import json
import re
from typing import Any

import click

from ferryq import backoff
from ferryq.app import DEFAULT_TASK_OPTIONS as DEFAULTS  # ferryq's own
from ferryq.cli.options import JOB_ID, FiniteFloat
from ferryq.cli.output import CliError, emit_json, out
from ferryq.cli.settings import get_app
from ferryq.policy import AFTER_FAILED, OPTION_NAMES


@click.command()
@click.argument("task")
@click.argument("args_json", metavar="[ARGS_JSON]", default="[]", required=False)
@click.option("--queue", help=f"Queue [default: {DEFAULTS.queue}].")
@click.option("--lane", help="Ordered lane key.")
@click.option("--delay", type=FiniteFloat(), help="Seconds before the job is due.")
@click.option("--priority", type=FiniteFloat(), help="Head start in seconds (may be negative).")
@click.option("--ttl", type=FiniteFloat(), help="Seconds the job has to finish from now.")
@click.option("--ttr", type=FiniteFloat(),
              help=f"Lease seconds per attempt [default: {DEFAULTS.ttr:g}].")  # fmt: skip
@click.option("--timeout", type=FiniteFloat(),
              help="Time limit of each attempt in seconds [default: none].")  # fmt: skip
@click.option("--max-tries", type=int,
              help=f"Attempts before the job is dead [default: {DEFAULTS.max_tries}].")  # fmt: skip
@click.option("--retry", type=FiniteFloat(), metavar="N",
              help="Backoff: N>0 exponential capped at N s, N<0 fixed |N| s.")  # fmt: skip
@click.option("--unique-key", help="Deduplicate: return the unfinished job with this key.")
@click.option("--unique-for", type=FiniteFloat(), help="Deduplication window in seconds.")
@click.option("--after", type=JOB_ID, metavar="ID", multiple=True,
              help="A job that must end first (repeat for more).")  # fmt: skip
@click.option("--after-failed", type=click.Choice(AFTER_FAILED),
              help="When one of those ends without success [default: fail].")  # fmt: skip
@click.option("--app", "target", metavar="MODULE:APP", envvar="FERRYQ_APP", show_envvar=True,
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


#: The job options this command takes, by their names in ``JobOptions``, and the flag
#: of each (``max_tries``: ``--max-tries``). The others (``run_at``, ``stage``,
#: ``meta``…) are not given here; ``namespace`` is the global ``--namespace``.
FLAGS = {param.name: param.opts[0] for param in enqueue.params if param.name in OPTION_NAMES}
_FLAG_RE = re.compile(r"\b(" + "|".join(FLAGS) + r")\b")


def option_names(message: str) -> str:
    """A message of ferryq's about job options, with their command-line names
    (``max_tries`` → ``--max-tries``); the value it quotes (``(got …)``) stays as it is."""
    said, got, value = message.partition(" (got ")
    return _FLAG_RE.sub(lambda m: FLAGS[m[1]], said) + got + value


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
