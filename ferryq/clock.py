"""Time as ferryq keeps it: on PostgreSQL, the database server's clock.

Leases, due times and the recovery of lapsed leases compare times written by one host
with times read on another: a worker whose clock is 30 s slow writes leases that are
already over for everyone else, and a leader 30 s fast recovers leases that are not.
So an App on PostgreSQL keeps the server's time: its host's clock plus an offset,
measured against ``clock_timestamp()`` when its store opens and again by a worker
every MEASURE_EVERY seconds (half a round trip is the most it can be off by; a
reading within the round trip is no offset at all: ``RESOLUTION``). A host
off by more than WARN_AFTER is told so in the log, once per change; nothing else
changes for it. On SQLite the database is a file on the host itself: no offset.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

log = logging.getLogger("ferryq.clock")
#: How often a worker measures its offset again (a host's clock may be stepped).
MEASURE_EVERY = 30.0
#: An offset past this is worth a line in the log.
WARN_AFTER = 1.0
#: A server's reading within the round trip (give or take this) is no offset at all:
#: the host's clock is kept as it is, exactly, as on a server on the same machine,
#: where an offset would be nothing but the measure's own error.
RESOLUTION = 0.01


class ServerClock:
    """``host()`` plus the offset to the database server's clock: Unix seconds."""

    def __init__(self, host: Callable[[], float] = time.time) -> None:
        self.host = host
        self.offset = 0.0
        self._measured_at: float | None = None  # by the monotonic clock
        self._told = False

    def __call__(self) -> float:
        return self.host() + self.offset

    def due(self) -> bool:
        """Whether a measure is due (never made, or MEASURE_EVERY ago)."""
        return self._measured_at is None or time.monotonic() - self._measured_at >= MEASURE_EVERY

    async def measure(self, server_time: Callable[[], Awaitable[float | None]]) -> None:
        """Set the offset from one reading of ``server_time()`` (None: the database is
        on this host), taken as of halfway through the round trip."""
        before = self.host()
        server = await server_time()
        after = self.host()
        self._measured_at = time.monotonic()
        if server is None:
            return
        if before - RESOLUTION <= server <= after + RESOLUTION:
            self.offset = 0.0  # they agree, as far as one round trip can tell
        else:
            self.offset = server - (before + after) / 2
        off = abs(self.offset) > WARN_AFTER
        if off and not self._told:
            log.warning(
                "this host's clock is %.1f s %s the database server's: ferryq keeps the "
                "server's time for leases, due times and recovery", abs(self.offset),
                "behind" if self.offset > 0 else "ahead of",
            )  # fmt: skip
        self._told = off
