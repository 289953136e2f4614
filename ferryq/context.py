"""The per-attempt context a handler receives when it declares a ``Context`` parameter."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class Context:
    """What a handler knows about its own attempt.

    ``fence`` is the fencing token of this attempt: it grows with every claim of the
    job, so it can serve downstream as an idempotency key. ``cancelled`` becomes true
    when someone cancels the job while it runs (sync handlers poll it; async handlers
    are cancelled outright). ``heartbeat()`` extends the lease by the job's ttr; it
    returns at once and the worker writes it within milliseconds.
    """

    __slots__ = (
        "_cancel_event",
        "_heartbeat_wanted",
        "_request_heartbeat",
        "attempt",
        "context",
        "fence",
        "job_id",
        "queue",
        "stage",
        "task",
    )

    def __init__(
        self,
        *,
        job_id: int,
        task: str,
        queue: str,
        attempt: int,
        fence: int,
        stage: str | None,
        context: Any,
        request_heartbeat: Callable[[], None] | None = None,
    ) -> None:
        self.job_id = job_id
        self.task = task
        self.queue = queue
        self.attempt = attempt
        self.fence = fence
        self.stage = stage
        self.context = context
        self._request_heartbeat = request_heartbeat
        self._cancel_event = threading.Event()
        self._heartbeat_wanted = False

    @property
    def cancelled(self) -> bool:
        return self._cancel_event.is_set()

    def heartbeat(self) -> None:
        """Ask the worker to extend this attempt's lease by the job's ttr."""
        self._heartbeat_wanted = True
        if self._request_heartbeat is not None:
            self._request_heartbeat()

    def _take_heartbeat(self) -> bool:
        wanted, self._heartbeat_wanted = self._heartbeat_wanted, False
        return wanted

    def _cancel(self) -> None:
        self._cancel_event.set()

    def __repr__(self) -> str:
        return f"<Context job={self.job_id} attempt={self.attempt} fence={self.fence}>"
