"""The HTTP server (docs/http-api.md): the lmstfy-compatible API, the native API, metrics,
and the admin API, over the same engine and tables as the workers.

The names below are imported on first use, so that a module of the package that
needs no web framework (``tokens``, ``http``, used by ``ferryq token``) loads none.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ferryq.server.app import ServerConfig, build_admin, build_api, serve
    from ferryq.server.engine import Engine

__all__ = ["Engine", "ServerConfig", "build_admin", "build_api", "serve"]
_HOMES = {"Engine": "ferryq.server.engine"} | {
    name: "ferryq.server.app" for name in ("ServerConfig", "build_admin", "build_api", "serve")
}

if not TYPE_CHECKING:

    def __getattr__(name: str) -> object:
        home = _HOMES.get(name)
        if home is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        globals()[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *__all__})
