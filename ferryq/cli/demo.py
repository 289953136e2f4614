"""``ferryq demo``: the story of ``ferryq.demo``, which is imported only when it runs."""

from __future__ import annotations

import click

from ferryq.cli.options import FiniteFloat


@click.command()
@click.option("--seconds", type=FiniteFloat(min=1), default=60.0, show_default=True,
              help="Stop watching after this long.")  # fmt: skip
@click.option("--workers", type=click.IntRange(1, 16), default=2, show_default=True,
              help="Worker processes to start.")  # fmt: skip
@click.pass_context
def demo(ctx: click.Context, seconds: float, workers: int) -> None:
    """Run a short story of jobs on a fresh SQLite file and watch it live."""
    from ferryq import demo as demo_module

    ctx.exit(demo_module.run(seconds=seconds, workers=workers))
