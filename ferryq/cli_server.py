"""``ferryq server`` and ``ferryq token``: the HTTP server and its namespace tokens.

Importing this module loads the server; the root command (``ferryq.cli``) imports it
only when one of these commands runs or is listed (``LAZY_COMMANDS``)."""

from __future__ import annotations

import asyncio
import logging
import os
import sys

import click

from ferryq import _render, logs
from ferryq.cli_common import (
    CliError,
    emit_json,
    get_app,
    json_option,
    log_format_option,
    log_level_option,
    show,
)
from ferryq.errors import ConfigurationError
from ferryq.ops import Token
from ferryq.server import tokens


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
                          session_secret)  # fmt: skip
    try:
        config.check()
    except ConfigurationError as exc:
        raise CliError(str(exc)) from None
    logs.configure(log_level, log_format)
    asyncio.run(serve(config))
    logging.shutdown()
    sys.stdout.flush()
    os._exit(0)


@click.group()
def token() -> None:
    """Namespace tokens of the HTTP API."""


def _check_namespace(namespace: str) -> None:
    from ferryq.server.http import MAX_NAME_LENGTH, NAME  # starlette: only for tokens

    if len(namespace) > MAX_NAME_LENGTH or not NAME.fullmatch(namespace):
        raise CliError(
            f"invalid namespace {namespace!r}: the HTTP API serves namespaces of letters, "
            "digits, - and _ only (jobs may use . and : too, but not over HTTP)"
        )


@token.command("create")
@click.argument("namespace")
@click.option("--description", "-d", required=True, help="What the token is for.")
@click.option("--token", "chosen", help=f"Use this token (at least {tokens.MIN_TOKEN_LENGTH} "
              "characters) instead of a random one.")  # fmt: skip
@json_option
@click.pass_context
def token_create(
    ctx: click.Context, namespace: str, description: str, chosen: str | None, as_json: bool
) -> None:
    """Make a token for NAMESPACE; it is shown once, and stored only as a digest."""
    _check_namespace(namespace)
    if chosen is not None and len(chosen) < tokens.MIN_TOKEN_LENGTH:
        raise CliError(f"a token must be at least {tokens.MIN_TOKEN_LENGTH} characters")
    if chosen is not None and not tokens.writable(chosen):
        raise CliError(
            "a token cannot contain spaces or control characters (clients cannot send it)"
        )
    if chosen is not None and ":" in chosen:
        raise CliError("a token cannot contain ':' (it separates a pool from a token)")
    app = get_app(ctx)
    secret = chosen or tokens.generate()
    record = Token(namespace, tokens.digest(secret), description, tokens.hint(secret), app.clock())

    async def create() -> bool:
        return await (await app.operations()).token_create(record)

    if not app.portal_call(create()):
        raise CliError("that token exists already")
    if as_json:
        emit_json({"namespace": namespace, "token": secret, "description": description})
    else:
        click.echo(secret)


@token.command("ls")
@click.argument("namespace", required=False)
@json_option
@click.pass_context
def token_ls(ctx: click.Context, namespace: str | None, as_json: bool) -> None:
    """List tokens (of NAMESPACE, or all): hints and descriptions, never the tokens."""
    app = get_app(ctx, read_only=True)

    async def listed() -> list[Token]:
        return await (await app.operations()).token_list(namespace)

    found = app.portal_call(listed())
    if as_json:
        emit_json([_token_dict(t) for t in found])
    else:
        show(_render.tokens_table(found))


@token.command("revoke")
@click.argument("namespace")
@click.argument("secret", metavar="TOKEN")
@json_option
@click.pass_context
def token_revoke(ctx: click.Context, namespace: str, secret: str, as_json: bool) -> None:
    """Revoke TOKEN of NAMESPACE at once (servers forget it within seconds)."""
    app = get_app(ctx)
    digest = tokens.digest(tokens.split_pool(secret)[1])

    async def revoke() -> bool:
        return await (await app.operations()).token_delete(namespace, digest)

    if not app.portal_call(revoke()):
        raise CliError(f"no such token in namespace {namespace!r}")
    if as_json:
        emit_json({"namespace": namespace, "revoked": True})
    else:
        click.echo(f"revoked a token of {namespace}")


def _token_dict(token: Token) -> dict[str, object]:
    return {
        "namespace": token.namespace, "hint": token.hint, "description": token.description,
        "created_at": token.created_at, "limit": None if token.limit_interval is None else {
            "read": token.limit_read, "write": token.limit_write,
            "interval": token.limit_interval},
    }  # fmt: skip
