"""The per-attempt context a handler receives when it declares a ``Context`` parameter."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from typing import Any

#: A note given with a progress report is cut to this many characters.
MAX_NOTE = 255


class Context:
    """What a handler knows about its own attempt.

    ``fence`` is the fencing token of this attempt: it grows with every claim of the
    job, so it can serve downstream as an idempotency key. ``cancelled`` becomes true
    when someone cancels the job while it runs, or when the attempt is stopped (its
    time limit passed, the worker shuts down): async handlers are cancelled outright,
    sync ones interrupted (see docs/guarantees.md). ``heartbeat()`` extends the lease
    by the job's ttr; it returns at once and the worker writes it within
    milliseconds. ``progress()`` reports how far the attempt got.
    """

    __slots__ = (
        "_cancelled",
        "_heartbeat_wanted",
        "_meta",
        "_progress",
        "_request_heartbeat",
        "attempt",
        "context",
        "fence",
        "job_id",
        "lane",
        "max_tries",
        "queue",
        "stage",
        "task",
        "timeout",
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
        lane: str | None = None,
        max_tries: int = 1,
        timeout: float | None = None,
        meta: str = "{}",
    ) -> None:
        self.job_id = job_id
        self.task = task
        self.queue = queue
        self.attempt = attempt
        self.fence = fence
        self.stage = stage
        self.context = context
        self.lane = lane
        self.max_tries = max_tries
        self.timeout = timeout
        self._meta: str | dict[str, Any] = meta
        self._request_heartbeat = request_heartbeat
        self._cancelled = False
        self._heartbeat_wanted = False
        self._progress: str | None = None  # JSON, not written yet

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    @property
    def meta(self) -> dict[str, Any]:
        """The job's metadata, as enqueue hooks left it (the trace context among it)."""
        if isinstance(self._meta, str):
            self._meta = json.loads(self._meta)
        return self._meta  # type: ignore[return-value]

    def heartbeat(self) -> None:
        """Ask the worker to extend this attempt's lease by the job's ttr."""
        self._heartbeat_wanted = True
        if self._request_heartbeat is not None:
            self._request_heartbeat()

    def progress(self, done: float, total: float | None = None, note: str | None = None) -> None:
        """Say how far this attempt got: ``done`` of ``total`` (units of your choice),
        with an optional short ``note``. It returns at once; the worker stores the
        latest report with its next lease renewal (about every second), so calling
        it in a tight loop costs next to nothing. A new attempt starts with none."""
        _amount("done", done)
        if total is not None:
            _amount("total", total)
        if note is not None and not isinstance(note, str):
            raise ValueError(f"note must be a string (got {type(note).__name__})")
        self._progress = json.dumps({
            "done": done, "total": total,
            "note": None if note is None else note[:MAX_NOTE], "at": time.time(),
        })  # fmt: skip

    def _take_progress(self) -> str | None:
        progress, self._progress = self._progress, None
        return progress

    def _keep_progress(self, report: str) -> None:
        """Put back a report the worker could not write, unless a newer one came."""
        if self._progress is None:
            self._progress = report

    def _take_heartbeat(self) -> bool:
        wanted, self._heartbeat_wanted = self._heartbeat_wanted, False
        return wanted

    def _cancel(self) -> None:
        self._cancelled = True

    def __repr__(self) -> str:
        return f"<Context job={self.job_id} attempt={self.attempt} fence={self.fence}>"


def _amount(name: str, value: object) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
    ):
        raise ValueError(f"{name} must be a finite number, at least 0 (got {value!r})")
