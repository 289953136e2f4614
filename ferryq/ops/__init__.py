"""The operations layer: the one way the faces reach the jobs.

Layers, each importing only those below it (``tests/unit/test_layers.py``):

- faces: ``ferryq.App``'s job methods, ``ferryq.cli``, ``ferryq.server``,
  ``ferryq.dashboard``;
- operations (here): :class:`Operations`, the namespaced reads and operator
  actions with their side effects, and the read models of ``ferryq.ops.views``;
- the store (``ferryq.store``): SQL, one backend per database;
- the rules (``ferryq.job``, ``ferryq.policy``, ``ferryq.lanes``, …): pure code.

The records a face handles (a job filter, a token, a lane, a worker, a job's
dependencies) are named here
too, so that no face needs to import the store.
"""

from ferryq.ops.actions import RESPAWNABLE, Operations, Signals
from ferryq.store import safe_url
from ferryq.store.base import (
    Dependencies,
    Dependency,
    JobFilter,
    LaneInfo,
    PeriodicState,
    Token,
    WorkerInfo,
)

__all__ = [
    "RESPAWNABLE",
    "Dependencies",
    "Dependency",
    "JobFilter",
    "LaneInfo",
    "Operations",
    "PeriodicState",
    "Signals",
    "Token",
    "WorkerInfo",
    "safe_url",
]
