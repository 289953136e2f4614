"""Transient faults, logged once per episode.

A worker rides out a database that is down, locked, full or out of connections by
retrying with back-off. Logging every retry would bury the logs (hundreds of lines a
second across the worker's loops), so each duty's run of failures is an *episode*:
its first failure is logged as one line, the rest are counted, and its end is logged
with how long it lasted and how many tries failed. The traceback of the first
failure goes to DEBUG.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

MAX_MESSAGE = 300
#: The longest wait between two tries of a duty that fails: a worker is back within a
#: second of the database answering again, and writes the outcomes it holds before
#: lease recovery (which waits a little after an outage, see maintenance) runs.
MAX_BACKOFF = 1.0


def one_line(exc: BaseException) -> str:
    """``Type: message`` on one line, bounded, for a log line or a CLI error."""
    try:
        message = str(exc)
    except Exception:  # an exception whose __str__ fails still gets named
        message = ""
    text = " ".join(f"{type(exc).__name__}: {message}".split()) if message else type(exc).__name__
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 1] + "…"


@dataclass(slots=True)
class _Episode:
    began: float
    failures: int


class FaultLog:
    """Episodes of failing duties (``"claiming jobs"``, ``"heartbeat"``, …) of one
    component, logged to ``logger``."""

    def __init__(self, logger: logging.Logger) -> None:
        self._log = logger
        self._open: dict[str, _Episode] = {}

    def failed(self, duty: str, exc: BaseException, retry_in: float | None = None) -> bool:
        """Count a failure of ``duty``; log it if it begins an episode (returns True)."""
        episode = self._open.get(duty)
        if episode is not None:
            episode.failures += 1
            return False
        self._open[duty] = _Episode(time.monotonic(), 1)
        retrying = "retrying" if retry_in is None else f"retrying in {retry_in:.2f} s"
        self._log.warning("%s failed: %s; %s, and logging once until it works again",
                          duty, one_line(exc), retrying)  # fmt: skip
        self._log.debug("%s failed", duty, exc_info=exc)
        return True

    def succeeded(self, duty: str) -> None:
        """End the episode of ``duty``, if one is open, saying how long it lasted."""
        if not self._open:
            return
        episode = self._open.pop(duty, None)
        if episode is not None:
            self._log.warning("%s works again after %.1f s (%d failed tries)",
                              duty, time.monotonic() - episode.began, episode.failures)  # fmt: skip

    def failing(self, duty: str) -> bool:
        return duty in self._open
