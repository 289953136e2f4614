"""``/metrics`` and the timing of every request (see ferryq.metrics)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute, Match, Mount
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ferryq import metrics
from ferryq.server.engine import Engine

#: Job counts read the history too: read them at most this often, whatever the scrapes.
COUNTS_TTL = 5.0


#: The route label of a request that no route matched: one value, whatever the path.
UNMATCHED = "unmatched"


class RequestMetrics:
    """ASGI middleware: count and time requests by route pattern (never by raw path),
    the pattern of the one of ``routes`` that serves the request."""

    def __init__(self, app: ASGIApp, listener: str, routes: Sequence[BaseRoute]) -> None:
        self.app = app
        self.listener = listener
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500
        route = route_pattern(self.routes, dict(scope))  # before the router changes scope

        async def record_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, record_status)
        finally:
            metrics.HTTP_REQUESTS.inc(1, self.listener, route, scope["method"], str(status))
            metrics.HTTP_SECONDS.observe(time.perf_counter() - started, self.listener, route)


def route_pattern(routes: Sequence[BaseRoute], scope: Scope) -> str:
    """The path pattern of the route that serves ``scope`` (``/api/{namespace}/{queue}``),
    as a router picks it: the first full match, else the first match of the path alone
    (a method not allowed). Inside a mount, the mount's path and the inner pattern."""
    partial: tuple[BaseRoute, Scope] | None = None
    for route in routes:
        match, child = route.matches(scope)
        if match is Match.FULL:
            return _pattern(route, {**scope, **child})
        if match is Match.PARTIAL and partial is None:
            partial = (route, {**scope, **child})
    return UNMATCHED if partial is None else _pattern(*partial)


def _pattern(route: BaseRoute, scope: Scope) -> str:
    if isinstance(route, Mount):
        inner = route_pattern(route.routes, scope)
        return route.path + ("/{path:path}" if inner == UNMATCHED else inner)
    path = getattr(route, "path", None)
    if isinstance(path, str):
        return path
    # A router included whole as one route (FastAPI's include_router, the native API):
    # the pattern of the route inside it.
    inner_routes = getattr(getattr(route, "original_router", None), "routes", None)
    return UNMATCHED if inner_routes is None else route_pattern(inner_routes, scope)


def metrics_endpoint(engine: Engine) -> Callable[[Request], Awaitable[Response]]:
    cached: tuple[float, str] = (-COUNTS_TTL, "")

    async def metrics_page(request: Request) -> Response:
        nonlocal cached
        if time.monotonic() - cached[0] > COUNTS_TTL:
            cached = (time.monotonic(), await _database_gauges(engine))
        workers = await engine.ops.workers(alive=True)
        sources = [(engine.id, metrics.METRICS.snapshot())]
        sources += [(w.id, w.stats) for w in workers if w.stats]
        body = metrics.METRICS.render(sources) + cached[1]
        return PlainTextResponse(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    return metrics_page


async def _database_gauges(engine: Engine) -> str:
    counts = await engine.ops.counts(None)
    jobs = [({"namespace": ns, "queue": q, "state": state}, n)
            for (ns, q, state), n in sorted(counts.items())]  # fmt: skip
    live = await engine.ops.workers(alive=True)
    return metrics.gauge_text(
        "ferryq_jobs", "Jobs by namespace, queue and state (hot and history).", jobs
    ) + metrics.gauge_text("ferryq_workers_live", "Workers with a recent heartbeat.",
                           [({}, len(live))])  # fmt: skip
