"""The web dashboard: queues, jobs, dead letters, lanes and workers (docs/operations.md,
"Dashboard").

``ferryq server`` mounts it on the API port under ``/ui`` (``/`` leads there). Pages
are rendered on the server from ``templates/``; ``static/`` holds the style sheet and
the small script that keeps a page live. See :mod:`ferryq.dashboard.auth` for who may
sign in and what they see.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from ferryq.server.engine import Engine

__all__ = ["build_dashboard"]


def build_dashboard(
    engine: Engine, credential: str | None, base: str = "/ui", session_secret: str | None = None
) -> Starlette:
    """The dashboard app, to be mounted at ``base`` on the API port."""
    # Imported here: the routes use ferryq.server, whose app imports this package.
    from ferryq.dashboard.routes import build_dashboard as build

    return build(engine, credential, base, session_secret)
