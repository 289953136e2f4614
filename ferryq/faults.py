"""Transient faults, logged once per episode.

A worker rides out a database that is down, locked, full or out of connections by
retrying with back-off. Logging every retry would bury the logs (hundreds of lines a
second across the worker's loops), so each duty's run of failures is an *episode*:
its first failure is logged as one line, the rest are counted, and its end, once the
duty has worked for QUIET seconds in a row, is logged with how long it lasted and how
many tries failed. The traceback of the first failure goes to DEBUG.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
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


#: An episode ends once its duty has worked this long without a failure: a fault that
#: comes and goes (connections freed and taken again) is one episode, not dozens.
QUIET = 2.0


@dataclass(slots=True)
class _Episode:
    began: float
    failures: int
    working_since: float | None = None  # the first success after the last failure


class FaultLog:
    """Episodes of failing duties (``"claiming jobs"``, ``"heartbeat"``, …) of one
    component, logged to ``logger``."""

    def __init__(self, logger: logging.Logger, clock: Callable[[], float] = time.monotonic) -> None:
        self._log = logger
        self._clock = clock
        self._open: dict[str, _Episode] = {}

    def failed(self, duty: str, exc: BaseException, retry_in: float | None = None) -> bool:
        """Count a failure of ``duty``; log it if it begins an episode (returns True)."""
        episode = self._open.get(duty)
        if episode is not None:
            episode.failures += 1
            episode.working_since = None
            return False
        self._open[duty] = _Episode(self._clock(), 1)
        retrying = "retrying" if retry_in is None else f"retrying in {retry_in:.2f} s"
        self._log.warning("%s failed: %s; %s, and logging once until it works again",
                          duty, one_line(exc), retrying)  # fmt: skip
        self._log.debug("%s failed", duty, exc_info=exc)
        return True

    def succeeded(self, duty: str) -> None:
        """``duty`` worked: once it has worked for QUIET seconds without failing, its
        episode ends, logged with how long it lasted."""
        if not self._open:
            return
        episode = self._open.get(duty)
        if episode is None:
            return
        now = self._clock()
        if episode.working_since is None:
            episode.working_since = now
        if now - episode.working_since < QUIET:
            return
        del self._open[duty]
        self._log.warning("%s works again after %.1f s (%d failed tries)", duty,
                          episode.working_since - episode.began, episode.failures)  # fmt: skip
