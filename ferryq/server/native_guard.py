"""What every route of the native API (``/v1``) does before its own work, and how its
refusals look: the caller's token first, then a bounded body; every refusal, FastAPI's
validation errors included, as ``{"error": "message"}``, and documented so.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Annotated, Any

from fastapi import Depends, Security
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message

from ferryq.ops import Token
from ferryq.server import http
from ferryq.server.engine import Engine
from ferryq.server.http import RequestTooLarge, error
from ferryq.server.native_models import ErrorOut
from ferryq.server.tokens import POOL, split_pool

#: One job: args and context of up to 1 MiB each (App.max_payload_bytes), with room
#: for the escapes JSON may spend on them.
BODY_BYTES = 3 << 20
BATCH_BODY_BYTES = 16 << 20
_TOKEN_KEY = "ferryq.token"


class ApiError(Exception):
    """A refusal: the status and the message of its ``{"error": ...}`` body."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


# -- the caller's token ----------------------------------------------------------------

_TOKEN_HEADER = APIKeyHeader(name="X-Token", auto_error=False, scheme_name="token")
_BEARER = HTTPBearer(auto_error=False, scheme_name="bearer")


async def _caller(
    request: Request,
    _header: Annotated[str | None, Security(_TOKEN_HEADER)],
    _bearer: Annotated[HTTPAuthorizationCredentials | None, Security(_BEARER)],
) -> Token:
    """The token the route class checked (the parameters document the schemes)."""
    token: Token = request.scope[_TOKEN_KEY]
    return token


Caller = Annotated[Token, Depends(_caller)]


async def _authorize(engine: Engine, request: Request) -> Token:
    raw = request.headers.get("x-token")
    if raw is None:
        scheme, _, value = request.headers.get("authorization", "").partition(" ")
        raw = value.strip() if scheme.lower() == "bearer" else None
    if not raw:
        raise ApiError(401, "token required: send it as X-Token or Authorization: Bearer")
    pool, secret = split_pool(raw)
    token = await engine.tokens.lookup(secret) if pool == POOL and secret else None
    if token is None:
        raise ApiError(401, "invalid token")
    return token


# -- what every route does first -------------------------------------------------------


def route_class(engine: Engine) -> type[APIRoute]:
    class NativeRoute(APIRoute):
        """The token first, then a bounded body; every refusal as ``{"error": ...}``."""

        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            handle = super().get_route_handler()
            limit = BATCH_BODY_BYTES if self.path.endswith("/batch") else BODY_BYTES
            has_body = self.body_field is not None
            query = frozenset(param.alias for param in self.dependant.query_params)

            async def guarded(request: Request) -> Response:
                try:
                    request.scope[_TOKEN_KEY] = await _authorize(engine, request)
                    _once_each(request, query)
                    if has_body:
                        request = await _bounded(request, limit)
                    return await handle(request)
                except ApiError as exc:
                    return error(exc.status, exc.message)
                except RequestValidationError as exc:
                    return error(422, _describe(exc))
                except HTTPException as exc:  # FastAPI's own: a body it could not parse
                    return error(exc.status_code, str(exc.detail))

            return guarded

    return NativeRoute


async def _bounded(request: Request, limit: int) -> Request:
    """The request with its body read already, refused past ``limit`` bytes."""
    try:
        body = await http.read_body(request, limit)
    except RequestTooLarge:
        raise ApiError(413, f"the request body is over the limit of {limit} bytes") from None
    if _declares_json(request):
        _check_utf8(body)
    replayed = False

    async def receive() -> Message:
        nonlocal replayed
        if replayed:
            return await request.receive()
        replayed = True
        return {"type": "http.request", "body": body, "more_body": False}

    return Request(request.scope, receive)


def _declares_json(request: Request) -> bool:
    """Whether FastAPI parses the body as JSON: ``application/json`` or ``…+json``."""
    media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    return media_type == "application/json" or (
        media_type.startswith("application/") and media_type.endswith("+json")
    )


def _check_utf8(body: bytes) -> None:
    """JSON text is UTF-8 (RFC 8259). ``json.loads`` on bytes fails on other bytes with
    an error FastAPI answers 400, and reads UTF-16 and UTF-32 as well, guessing them
    from the NUL bytes of their ASCII characters: a NUL byte is never JSON in UTF-8."""
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(422, f"the body is not valid JSON: not UTF-8 at byte {exc.start}") from None
    if (nul := body.find(b"\x00")) >= 0:
        raise ApiError(422, f"the body is not valid JSON: a NUL byte at byte {nul}")


def _once_each(request: Request, declared: frozenset[str]) -> None:
    """Every query parameter of this API takes one value: a repeated one is ambiguous."""
    names = [name for name, _ in request.query_params.multi_items() if name in declared]
    if len(names) != len(set(names)):
        repeated = sorted({name for name in names if names.count(name) > 1})
        raise ApiError(422, f"{', '.join(repeated)}: given more than once")


def _describe(exc: RequestValidationError) -> str:
    problems = []
    for problem in list(exc.errors())[:5]:
        if problem.get("type") == "json_invalid":
            reason = problem.get("ctx", {}).get("error", "")
            problems.append(f"the body is not valid JSON: {reason}")
            continue
        loc = [str(part) for part in problem.get("loc", ())]
        where = ".".join(loc[1:]) or (loc[0] if loc else "request")
        problems.append(f"{where}: {problem.get('msg', 'invalid')}")
    return "; ".join(problems) or "invalid request"


# -- the documented answers ------------------------------------------------------------

REFUSALS = {
    400: "Values the schema allows but ferryq refuses; the message says which.",
    401: "No token, or not a token of any namespace.",
    404: "No such job in the token's namespace (or no such lane rule).",
    409: "The job's state does not allow this.",
    413: "The request body is over the limit.",
    422: "The request does not match the schema: malformed JSON, wrong types, missing or "
    "unknown fields, values out of range.",
    429: "The token's publish rate limit is reached; retry later.",
    503: "The database cannot be reached; retry later.",
}


def refusals(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {code: {"model": ErrorOut, "description": REFUSALS[code]}
            for code in sorted({401, 503, *codes})}  # fmt: skip


def answer(model: type[Any], description: str) -> dict[str, Any]:
    return {"model": model, "description": description}
