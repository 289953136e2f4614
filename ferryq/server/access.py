"""The access log: one line per HTTP request, on ``ferryq.server.access`` at INFO."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ferryq.logs import fields

log = logging.getLogger("ferryq.server.access")

#: Longer paths are cut in the log (a request line is bounded by the HTTP parser anyway).
MAX_PATH = 2000
#: The admin API names a token in its path (``/token/{ns}/{token}[/limit]``).
_ADMIN_TOKEN = re.compile(r"^(/token/[^/]+/)[^/]+")


def admin_path(path: str) -> str:
    """An admin API path with the token it names masked."""
    return _ADMIN_TOKEN.sub(r"\1***", path, count=1)


class AccessLog:
    """ASGI middleware: once a request is answered, a line with its method, path,
    status, duration and client, as text and as fields (``method``, ``path``,
    ``status``, ``duration_ms``, ``client``, ``listener``, ``request_id``).

    The path is logged without its query (lmstfy clients may pass their token there),
    and ``redact`` hides what a path itself holds secret. Nothing is measured while
    the logger is off at INFO."""

    def __init__(
        self, app: ASGIApp, listener: str, redact: Callable[[str], str] | None = None
    ) -> None:
        self.app = app
        self.listener = listener
        self.redact = redact

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not log.isEnabledFor(logging.INFO):
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # what the server answers when the app fails before a response
        request_id: str | None = None

        async def noted(message: Message) -> None:
            nonlocal status, request_id
            if message["type"] == "http.response.start":
                status = message["status"]
                for name, value in message.get("headers", ()):
                    if name == b"x-request-id":
                        request_id = value.decode("latin-1")
            await send(message)

        try:
            await self.app(scope, receive, noted)
        finally:
            self._log(scope, status, (time.perf_counter() - started) * 1000, request_id)

    def _log(self, scope: Scope, status: int, duration_ms: float, request_id: str | None) -> None:
        path = _printable(str(scope.get("path", ""))[:MAX_PATH])
        if self.redact is not None:
            path = self.redact(path)
        method = _printable(str(scope.get("method", "")))
        client = scope.get("client")
        peer = f"{client[0]}:{client[1]}" if client else None
        # Built directly, as a line per request: Logger.info would first look for the
        # caller's frame (a few microseconds, a third of the line's cost).
        log.handle(log.makeRecord(
            log.name, logging.INFO, __file__, 0, "%s %s %d %.1f ms %s",
            (method, path, status, duration_ms, peer or "-"), None, "access",
            fields(method=method, path=path, status=status, duration_ms=round(duration_ms, 3),
                   client=peer, listener=self.listener, request_id=request_id),
        ))  # fmt: skip


def _printable(text: str) -> str:
    """``text`` with control characters escaped: a decoded path may hold a newline,
    which must not start a forged line in a text log."""
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")
