"""``ferryq stats``: jobs by queue and state, the live workers, the periodic tasks."""

from __future__ import annotations

import click

from ferryq import _render
from ferryq.cli.options import json_option
from ferryq.cli.output import emit_json, show
from ferryq.cli.settings import get_app


@click.command()
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
