"""What every route shares: request ids, error bodies, bounded bodies and parameters."""

from __future__ import annotations

import itertools
import logging
import os
import re
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ferryq.errors import StoreError

log = logging.getLogger("ferryq.server")

#: Every request body is read into memory up to this size, and refused past it.
MAX_BODY_BYTES = 1 << 20
NAME = re.compile(r"[-_A-Za-z0-9]+")
MAX_NAME_LENGTH = 255


Endpoint = Callable[[Request], Awaitable[Response]]


class RequestTooLarge(Exception):
    pass


class RequestIds:
    """ASGI middleware: an ``X-Request-ID`` on every response, unique per request.

    A process prefix and a counter: unique across processes and restarts (the prefix
    is random), cheaper than a UUID per request, and sortable within one server.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.prefix = os.urandom(6).hex()
        self.counter = itertools.count(1)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = f"{self.prefix}-{next(self.counter):x}".encode()

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"x-request-id", request_id)]
            await send(message)

        await self.app(scope, receive, send_with_id)


def route(path: str, endpoint: Endpoint, methods: list[str]) -> Route:
    """A route answering ``methods`` only. Starlette answers HEAD on every GET route
    by running the GET, which for a consume leases a job and drops it; lmstfy's router
    (gin) has no HEAD routes: HEAD is 404 ``api not found`` there, and so here."""
    made = Route(path, endpoint, methods=methods)
    if "HEAD" not in methods and made.methods is not None:
        made.methods.discard("HEAD")
    return made


def error(status: int, text: str, key: str = "error") -> JSONResponse:
    return JSONResponse({key: text}, status_code=status)


def json(status: int, body: Any) -> JSONResponse:
    return JSONResponse(body, status_code=status)


NO_CONTENT = Response(status_code=204)


async def api_not_found(request: Request, exc: Exception) -> Response:
    """Unknown routes and wrong methods, as lmstfy answers them."""
    if isinstance(exc, HTTPException) and exc.status_code not in (404, 405):
        return error(exc.status_code, str(exc.detail))
    return error(404, "api not found")


async def internal_error(request: Request, exc: Exception) -> Response:
    """A failure of ours: logged with its traceback, answered without one."""
    if isinstance(exc, StoreError):
        log.error("%s %s: the database failed: %s", request.method, request.url.path, exc)
        return error(503, "the database is not available, try again later")
    log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    return error(500, "internal error")


async def read_body(request: Request, limit: int = MAX_BODY_BYTES) -> bytes:
    """The whole body, or :class:`RequestTooLarge` as soon as it passes ``limit``."""
    declared = _digits(request.headers.get("content-length") or "", 20)
    if declared is not None and declared > limit:
        raise RequestTooLarge
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestTooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def query(request: Request, name: str) -> str | None:
    """The first value of a query parameter, as gin's ``Query`` reads a repeated one
    (Starlette's ``query_params.get`` gives the last)."""
    values = request.query_params.getlist(name)
    return values[0] if values else None


def first_values(pairs: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Each name's first value, as Go's ``url.Values.Get`` reads a repeated one."""
    fields: dict[str, str] = {}
    for name, value in pairs:
        fields.setdefault(name, value)
    return fields


def parse_uint(raw: str | None, default: int, bits: int) -> int | None:
    """A whole number as Go's ``ParseUint`` reads it; None when it is not one."""
    if raw is None:
        return default
    value = _digits(raw, 20)  # 2**64 has 20
    return value if value is not None and value < (1 << bits) else None


def parse_int(raw: str | None, default: int) -> int | None:
    """A whole number as Go's ``ParseInt(s, 10, 64)`` reads it (an optional sign, then
    ASCII digits, within int64); None when it is not one."""
    if raw is None:
        return default
    value = _digits(raw[1:] if raw[:1] in ("+", "-") else raw, 19)  # 2**63 has 19
    if value is None:
        return None
    value = -value if raw[:1] == "-" else value
    return value if -(1 << 63) <= value < (1 << 63) else None


def _digits(raw: str, most: int) -> int | None:
    """The value of ASCII decimal digits, None for anything else or for more than
    ``most`` digits after the leading zeros. ``str.isdigit`` alone passes '²', on
    which ``int`` raises, as it does past 4300 digits."""
    if not (raw.isascii() and raw.isdigit()):
        return None
    significant = raw.lstrip("0")
    return int(significant or "0") if len(significant) <= most else None


def name_error(namespace: str, queue: str) -> str | None:
    """lmstfy's checks of a namespace and a queue name, with its messages."""
    if len(namespace) > MAX_NAME_LENGTH or len(queue) > MAX_NAME_LENGTH:
        return "namespace or queue name too long"
    if not NAME.fullmatch(namespace):
        return "namespace name contains forbidden characters"
    if queue.startswith("_") or not NAME.fullmatch(queue):
        return "queue name contains forbidden characters"
    return None


def queue_name_ok(queue: str) -> bool:
    return (
        len(queue) <= MAX_NAME_LENGTH and not queue.startswith("_") and bool(NAME.fullmatch(queue))
    )
