"""``ferryq server``: the HTTP API, its metrics and the admin API with the dashboard.

The root command (``ferryq.cli``) imports this module only when this command runs or
the commands are listed (``LAZY_COMMANDS``), and this module imports the web framework
only when the server starts."""

from __future__ import annotations

import asyncio
import logging
import os
import sys

import click

from ferryq import logs
from ferryq.cli.options import log_format_option, log_level_option
from ferryq.cli.output import CliError
from ferryq.cli.settings import get_app
from ferryq.errors import ConfigurationError


@click.command()
@click.option("--url", "server_url", envvar="FERRYQ_URL",
              help="Database URL [default: the global --url].")  # fmt: skip
@click.option("--host", default="127.0.0.1", show_default=True, help="API address.")
@click.option("--port", type=click.IntRange(0, 65535), default=7777, show_default=True,
              help="API port (0: any free port).")  # fmt: skip
@click.option("--admin-host", default="127.0.0.1", show_default=True, help="Admin address.")
@click.option("--admin-port", type=click.IntRange(0, 65535), default=7778, show_default=True,
              help="Admin port (0: any free port).")  # fmt: skip
@click.option("--admin-credential", envvar="FERRYQ_ADMIN_CREDENTIAL", metavar="USER:PASSWORD",
              help="Basic auth for the admin API; required off loopback.")  # fmt: skip
@click.option("--session-secret", envvar="FERRYQ_SESSION_SECRET", metavar="SECRET",
              help="Sign dashboard sessions with this (32+ characters): they then "
              "survive restarts and work on every server sharing it [default: a key "
              "per start].")  # fmt: skip
@click.option("--direct-url", envvar="FERRYQ_DIRECT_URL", show_envvar=True,
              help="Behind a pooler: the database reached directly, for wake-ups.")  # fmt: skip
@log_level_option
@log_format_option
@click.pass_context
def server(
    ctx: click.Context,
    server_url: str | None,
    host: str,
    port: int,
    admin_host: str,
    admin_port: int,
    admin_credential: str | None,
    session_secret: str | None,
    direct_url: str | None,
    log_level: str,
    log_format: str,
) -> None:
    """Serve the HTTP API (lmstfy-compatible and /v1), metrics and the admin API."""
    from ferryq.server.app import ServerConfig, serve  # the web framework, only here

    url = server_url or get_app(ctx).url
    # An empty secret or credential is refused by check(), not ignored: one that failed
    # to reach the environment would otherwise pass unseen (click drops empty variables).
    if session_secret is None and os.environ.get("FERRYQ_SESSION_SECRET") == "":
        session_secret = ""
    if admin_credential is None and os.environ.get("FERRYQ_ADMIN_CREDENTIAL") == "":
        admin_credential = ""
    config = ServerConfig(url, host, port, admin_host, admin_port, admin_credential,
                          session_secret, direct_url or None)  # fmt: skip
    try:
        config.check()
    except ConfigurationError as exc:
        raise CliError(str(exc)) from None
    logs.configure(log_level, log_format)
    asyncio.run(serve(config))
    logging.shutdown()
    sys.stdout.flush()
    os._exit(0)
