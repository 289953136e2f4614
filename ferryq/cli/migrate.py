"""``ferryq migrate``: bring the database's schema up to date."""

from __future__ import annotations

import click

from ferryq.cli.output import emit_json, out
from ferryq.cli.settings import get_app
from ferryq.ops import safe_url


@click.command()
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
