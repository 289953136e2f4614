"""Building the two ASGI apps (API and admin) and serving them on their own ports."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import signal
import socket
import sys
from collections.abc import Generator
from dataclasses import dataclass

import uvicorn
from fastapi import FastAPI
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.types import ASGIApp

import ferryq
from ferryq.app import App
from ferryq.dashboard import build_dashboard
from ferryq.dashboard.auth import check_admin_credential, check_session_secret
from ferryq.errors import ConfigurationError
from ferryq.logs import fields
from ferryq.ops import safe_url
from ferryq.server.access import AccessLog, admin_path
from ferryq.server.admin import AdminApi, BasicAuth
from ferryq.server.engine import Engine
from ferryq.server.http import RequestIds, api_not_found, internal_error
from ferryq.server.lmstfy import LmstfyApi
from ferryq.server.monitoring import RequestMetrics, metrics_endpoint
from ferryq.server.native import native_router

log = logging.getLogger("ferryq.server")


@dataclass(frozen=True, slots=True)
class ServerConfig:
    url: str
    host: str = "127.0.0.1"
    port: int = 7777
    admin_host: str = "127.0.0.1"
    admin_port: int = 7778
    admin_credential: str | None = None  # "user:password"; None: no auth (loopback only)
    session_secret: str | None = None  # signs dashboard sessions; None: a key per start
    direct_url: str | None = None  # behind a pooler, for LISTEN; None: FERRYQ_DIRECT_URL

    def check(self) -> None:
        for name, port in (("port", self.port), ("admin port", self.admin_port)):
            if not 0 <= port <= 65535:
                raise ConfigurationError(f"{name} must be from 0 to 65535 (got {port})")
        if self.admin_credential is not None:
            check_admin_credential(self.admin_credential)
        if self.session_secret is not None:
            check_session_secret(self.session_secret)
        if self.admin_credential is None and not _is_loopback(self.admin_host):
            raise ConfigurationError(
                f"refusing to serve the admin API on {self.admin_host} without a credential: "
                "set --admin-credential USER:PASSWORD (or FERRYQ_ADMIN_CREDENTIAL), or bind "
                "it to 127.0.0.1"
            )


def build_api(
    engine: Engine, admin_credential: str | None = None, session_secret: str | None = None
) -> ASGIApp:
    """The API port: lmstfy routes, the native API, metrics, health and the dashboard.

    The dashboard lives under ``/ui`` (``/`` leads there); the admin credential lets
    the operator sign in to it, and a session secret lets its sessions outlive a
    restart and work on every server that shares the secret.
    """
    api = FastAPI(
        title="ferryq", version=ferryq.__version__, docs_url=None, redoc_url=None,
        openapi_url="/openapi.json",
        exception_handlers={HTTPException: api_not_found, Exception: internal_error},
    )  # fmt: skip
    api.router.routes.extend(LmstfyApi(engine).routes())
    api.include_router(native_router(engine))
    api.router.routes.append(Route("/healthz", _healthz, methods=["GET"]))
    api.router.routes.append(Route("/metrics", metrics_endpoint(engine), methods=["GET"]))
    api.router.routes.append(Route("/", _to_dashboard, methods=["GET"]))
    dashboard = build_dashboard(engine, admin_credential, session_secret=session_secret)
    api.router.routes.append(Mount("/ui", dashboard))
    return RequestIds(RequestMetrics(api, "api", api.routes))


def build_admin(engine: Engine, credential: str | None) -> ASGIApp:
    routes = AdminApi(engine, metrics_endpoint(engine)).routes()
    admin: ASGIApp = Starlette(
        routes=routes,
        exception_handlers={HTTPException: api_not_found, Exception: internal_error},
    )
    if credential is not None:
        admin = BasicAuth(admin, credential)
    return RequestIds(RequestMetrics(admin, "admin", routes))


async def _to_dashboard(request: Request) -> Response:
    return RedirectResponse("/ui/", status_code=303)


async def _healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: ``serve`` stops both listeners."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


async def serve(config: ServerConfig, *, announce: bool = True) -> None:
    """Serve until SIGTERM or SIGINT; return after a clean stop.

    Requests are logged on ``ferryq.server.access`` (``AccessLog``); uvicorn's own
    warnings and errors go to its loggers (``uvicorn.error``) with no handler of
    uvicorn's: they come out wherever the process routes its logs."""
    config.check()
    sockets = [_bind(config.host, config.port), _bind(config.admin_host, config.admin_port)]
    engine = Engine(App(config.url, direct_url=config.direct_url))
    await engine.start()
    apps = [
        AccessLog(build_api(engine, config.admin_credential, config.session_secret), "api"),
        AccessLog(build_admin(engine, config.admin_credential), "admin", admin_path),
    ]
    servers = [
        _Server(uvicorn.Config(app, log_config=None, log_level="warning", access_log=False,
                               lifespan="off", timeout_graceful_shutdown=5))
        for app in apps
    ]  # fmt: skip

    def stop() -> None:
        engine.close()
        for server in servers:
            server.should_exit = True

    api, admin = (_url(sock) for sock in sockets)
    database = safe_url(config.url)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    try:
        running = [asyncio.create_task(s.serve(sockets=[sock]))
                   for s, sock in zip(servers, sockets, strict=True)]  # fmt: skip
        log.info("server listening: api %s, admin %s, database %s, ferryq %s", api, admin,
                 database, ferryq.__version__, extra=fields(api=api, admin=admin,
                 database=database, version=ferryq.__version__))  # fmt: skip
        if announce:
            # The sockets listen already: a client that connects now waits in the
            # backlog until uvicorn takes it, a few milliseconds at most.
            sys.stdout.write(f"ferryq server listening api={api} admin={admin}\n")
            sys.stdout.flush()
        await asyncio.gather(*running)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await engine.stop()
        for sock in sockets:
            sock.close()
        log.info("server stopped", extra=fields(api=api, admin=admin))


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not 0: asyncio turns Nagle off (TCP_NODELAY) only on sockets that say
    # they are TCP, and accepted sockets inherit this one's protocol. With Nagle on, a
    # response written in two parts waits 40 ms for the client's delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigurationError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.listen(1024)
    sock.setblocking(False)
    return sock


def _url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
