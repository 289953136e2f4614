"""The web dashboard (SPEC §17): queues, jobs, dead letters, lanes and workers.

``ferryq server`` mounts it on the API port under ``/ui`` (``/`` leads there). Pages
are rendered on the server from ``templates/``; ``static/`` holds the style sheet and
the small script that keeps a page live. See :mod:`ferryq.dashboard.auth` for who may
sign in and what they see.
"""

from __future__ import annotations

from ferryq.dashboard.routes import build_dashboard

__all__ = ["build_dashboard"]
