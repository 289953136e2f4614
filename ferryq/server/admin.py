"""The admin API (its own port, as lmstfy's): tokens, their rate limits, and facts
about the server. Basic auth with the admin credential when one is configured."""

from __future__ import annotations

import base64
import binascii
import hmac
import json as jsonlib
from typing import Any, TypeGuard
from urllib.parse import parse_qsl

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

import ferryq
from ferryq.ops import Token
from ferryq.server import http, tokens
from ferryq.server.engine import Engine
from ferryq.server.http import NO_CONTENT, error


class BasicAuth:
    """ASGI middleware: every request needs ``user:password`` by HTTP basic auth."""

    def __init__(self, app: ASGIApp, credential: str) -> None:
        self.app = app
        self.expected = credential.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self._allowed(scope):
            response = error(401, "unauthorized")
            response.headers["WWW-Authenticate"] = 'Basic realm="ferryq admin"'
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _allowed(self, scope: Scope) -> bool:
        header = dict(scope["headers"]).get(b"authorization", b"")
        scheme, _, encoded = header.partition(b" ")
        if scheme.lower() != b"basic":
            return False
        try:
            given = base64.b64decode(encoded.strip(), validate=True)
        except binascii.Error:
            return False
        return hmac.compare_digest(given, self.expected)


class AdminApi:
    def __init__(self, engine: Engine, metrics: http.Endpoint) -> None:
        self.engine = engine
        self.metrics = metrics

    def routes(self) -> list[Route]:
        return [
            http.route("/token/{ns}", _in_namespace(self.token_create), ["POST"]),
            http.route("/token/{ns}", _in_namespace(self.token_list), ["GET"]),
            http.route("/token/{ns}/{token}", _in_namespace(self.token_delete), ["DELETE"]),
            http.route("/token/{ns}/{token}/limit", _in_namespace(self.limit_set), ["POST", "PUT"]),
            http.route("/token/{ns}/{token}/limit", _in_namespace(self.limit_get), ["GET"]),
            http.route("/token/{ns}/{token}/limit", _in_namespace(self.limit_delete), ["DELETE"]),
            http.route("/info", self.info, ["GET"]),
            http.route("/version", self.version, ["GET"]),
            http.route("/pools", self.pools, ["GET"]),
            http.route("/metrics", self.metrics, ["GET"]),
        ]

    # -- tokens ------------------------------------------------------------------

    async def token_create(self, request: Request) -> Response:
        namespace = request.path_params["ns"]
        if http.query(request, "pool") not in (None, tokens.POOL):
            return error(404, "pool not found")
        try:
            fields = await _fields(request)
        except http.RequestTooLarge:
            return error(413, "body too large")
        description = fields.get("description", "")
        # PostgreSQL cannot store NUL in text (the token's hint is stored too).
        if not description or len(description) > 1024 or "\x00" in description:
            return error(400, "invalid description")
        chosen = fields.get("token") or None  # empty: one is generated, as lmstfy does
        if chosen is not None and len(chosen) < tokens.MIN_TOKEN_LENGTH:
            return error(400, "the user token was too short")
        if chosen is not None and (
            len(chosen) > 256 or ":" in chosen or not tokens.writable(chosen)
        ):
            return error(400, "invalid token")
        secret = tokens.generate() if chosen is None else chosen
        record = Token(namespace, tokens.digest(secret), description, tokens.hint(secret),
                       self.engine.now())  # fmt: skip
        if not await self.engine.ops.token_create(record):
            return error(400, "the token has already existed")
        self.engine.tokens.forget(record.digest)
        return http.json(201, {"token": secret})

    async def token_list(self, request: Request) -> Response:
        listed = await self.engine.ops.token_list(request.path_params["ns"])
        return http.json(200, {"tokens": {t.hint: t.description for t in listed}})

    async def token_delete(self, request: Request) -> Response:
        _pool, secret = tokens.split_pool(request.path_params["token"])
        digest = tokens.digest(secret)
        await self.engine.ops.token_delete(request.path_params["ns"], digest)
        self.engine.tokens.forget(digest)
        return NO_CONTENT

    # -- rate limits -------------------------------------------------------------

    async def limit_set(self, request: Request) -> Response:
        token = await self._token(request)
        if token is None:
            return error(404, "token not found")
        try:
            body = jsonlib.loads(await http.read_body(request, 4096))
        except (ValueError, RecursionError, http.RequestTooLarge):  # nested past the parser
            return error(400, "invalid limit")
        limit = _limit_fields(body)
        if limit is None:
            return error(400, "invalid limit")
        await self.engine.ops.token_limit_set(token.digest, *limit)
        self.engine.tokens.forget(token.digest)
        status = 201 if request.method == "POST" else 200
        return http.json(status, {"msg": "success"})

    async def limit_get(self, request: Request) -> Response:
        token = await self._token(request)
        if token is None or token.limit_interval is None:
            return error(404, "limit not found")
        return http.json(200, {"read": token.limit_read, "write": token.limit_write,
                               "interval": int(token.limit_interval)})  # fmt: skip

    async def limit_delete(self, request: Request) -> Response:
        token = await self._token(request)
        if token is not None:
            await self.engine.ops.token_limit_set(token.digest, None, None, None)
            self.engine.tokens.forget(token.digest)
        return http.json(200, {"msg": "success"})

    async def _token(self, request: Request) -> Token | None:
        _pool, secret = tokens.split_pool(request.path_params["token"])
        found = await self.engine.ops.token_get(tokens.digest(secret))
        return found if found is not None and found.namespace == request.path_params["ns"] else None

    # -- facts -------------------------------------------------------------------

    async def info(self, request: Request) -> Response:
        namespaces: dict[str, set[str]] = {t.namespace: set() for t in
                                           await self.engine.ops.token_list(None)}  # fmt: skip
        for ns, queue, _state in await self.engine.ops.counts(None):
            namespaces.setdefault(ns, set()).add(queue)
        pool = {ns: sorted(queues) for ns, queues in sorted(namespaces.items())}
        return http.json(200, {tokens.POOL: pool})

    async def version(self, request: Request) -> Response:
        return http.json(200, {"version": ferryq.__version__})

    async def pools(self, request: Request) -> Response:
        return http.json(200, [tokens.POOL])


def _in_namespace(endpoint: http.Endpoint) -> http.Endpoint:
    """The endpoint behind lmstfy's check of the namespace name every token route makes."""

    async def checked(request: Request) -> Response:
        namespace = request.path_params["ns"]
        if len(namespace) > http.MAX_NAME_LENGTH or not http.NAME.fullmatch(namespace):
            return error(400, "namespace name contains forbidden characters")
        return await endpoint(request)

    checked.__name__ = endpoint.__name__
    return checked


async def _fields(request: Request) -> dict[str, str]:
    """Query parameters, overridden by a form body (urlencoded), as lmstfy reads them;
    the first value of a repeated one."""
    fields = http.first_values(request.query_params.multi_items())
    content_type = request.headers.get("content-type", "")
    if content_type.startswith("application/x-www-form-urlencoded"):
        body = (await http.read_body(request, 64 * 1024)).decode("utf-8", "replace")
        fields.update(http.first_values(parse_qsl(body, keep_blank_values=True)))
    return fields


def _limit_fields(body: Any) -> tuple[int, int, float] | None:
    if not isinstance(body, dict):
        return None
    read, write, interval = (body.get(k) for k in ("read", "write", "interval"))
    if not (_count(read) and _count(write) and _count(interval)) or interval == 0:
        return None
    return read, write, float(interval)


def _count(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 31
