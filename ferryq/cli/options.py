"""Option types and options that several commands share: numbers that must be finite,
job ids, ``--json`` and the log options of the long-running commands."""

from __future__ import annotations

import math
from typing import Any

import click

from ferryq import logs
from ferryq.job import MAX_JOB_ID

#: A job id as both backends store it: a positive signed 64-bit integer.
JOB_ID = click.IntRange(1, MAX_JOB_ID)


class FiniteFloat(click.FloatRange):
    """A float option, optionally bounded, that refuses ``nan`` and ``inf``."""

    name = "float"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
log_level_option = click.option(
    "--log-level", type=click.Choice(list(logs.LEVELS), case_sensitive=False), default="info",
    envvar="FERRYQ_LOG_LEVEL", show_default=True, show_envvar=True,
    help="Log records at this level and above, to stderr.",
)  # fmt: skip
log_format_option = click.option(
    "--log-format", type=click.Choice(logs.FORMATS, case_sensitive=False), default="text",
    envvar="FERRYQ_LOG_FORMAT", show_default=True, show_envvar=True,
    help="text: one readable line a record; json: one JSON object a line.",
)  # fmt: skip
