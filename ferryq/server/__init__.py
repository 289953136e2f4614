"""The HTTP server (SPEC §16): the lmstfy-compatible API, the native API, metrics,
and the admin API, over the same engine and tables as the workers."""

from ferryq.server.app import ServerConfig, build_admin, build_api, serve
from ferryq.server.engine import Engine

__all__ = ["Engine", "ServerConfig", "build_admin", "build_api", "serve"]
