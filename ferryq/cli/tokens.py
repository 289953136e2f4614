"""``ferryq token``: create, list and revoke the namespace tokens of the HTTP API.

Importing this module loads ``ferryq.server.tokens`` (how a token is made, stored and
checked); the root command (``ferryq.cli``) imports it only when one of these commands
runs or the commands are listed (``LAZY_COMMANDS``)."""

from __future__ import annotations

import click

from ferryq import _render
from ferryq.cli.options import json_option
from ferryq.cli.output import CliError, emit_json, show
from ferryq.cli.settings import get_app
from ferryq.ops import Token
from ferryq.server import tokens


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
