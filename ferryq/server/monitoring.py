"""``/metrics`` and the timing of every request (see ferryq.metrics)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ferryq import metrics
from ferryq.insights import WORKER_ALIVE_SECONDS
from ferryq.server.engine import Engine

#: Job counts read the history too: read them at most this often, whatever the scrapes.
COUNTS_TTL = 5.0


class RequestMetrics:
    """ASGI middleware: count and time requests by route (never by raw path)."""

    def __init__(self, app: ASGIApp, listener: str) -> None:
        self.app = app
        self.listener = listener

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def record_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, record_status)
        finally:
            route = _route_name(scope)
            metrics.HTTP_REQUESTS.inc(1, self.listener, route, scope["method"], str(status))
            metrics.HTTP_SECONDS.observe(time.perf_counter() - started, self.listener, route)


def _route_name(scope: Scope) -> str:
    route = scope.get("route")
    path = getattr(route, "path", None)
    if isinstance(path, str):
        return path
    endpoint = scope.get("endpoint")
    return getattr(endpoint, "__name__", "unmatched") if endpoint is not None else "unmatched"


def metrics_endpoint(engine: Engine) -> Callable[[Request], Awaitable[Response]]:
    cached: tuple[float, str] = (-COUNTS_TTL, "")

    async def metrics_page(request: Request) -> Response:
        nonlocal cached
        if time.monotonic() - cached[0] > COUNTS_TTL:
            cached = (time.monotonic(), await _database_gauges(engine))
        workers = await engine.store.worker_list(alive_since=engine.now() - WORKER_ALIVE_SECONDS)
        sources = [(engine.id, metrics.METRICS.snapshot())]
        sources += [(w.id, w.stats) for w in workers if w.stats]
        body = metrics.METRICS.render(sources) + cached[1]
        return PlainTextResponse(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    return metrics_page


async def _database_gauges(engine: Engine) -> str:
    counts = await engine.store.job_counts(None)
    jobs = [({"namespace": ns, "queue": q, "state": state}, n)
            for (ns, q, state), n in sorted(counts.items())]  # fmt: skip
    live = await engine.store.worker_list(alive_since=engine.now() - WORKER_ALIVE_SECONDS)
    return metrics.gauge_text(
        "ferryq_jobs", "Jobs by namespace, queue and state (hot and history).", jobs
    ) + metrics.gauge_text("ferryq_workers_live", "Workers with a recent heartbeat.",
                           [({}, len(live))])  # fmt: skip
