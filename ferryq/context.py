"""The per-attempt context a handler receives when it declares a ``Context`` parameter,
and the signals it shares with the worker that runs the attempt."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from typing import Any

#: A note given with a progress report is cut to this many characters.
MAX_NOTE = 255


class AttemptSignals:
    """What a handler and the worker's lease keeper (ferryq/worker/leases.py) tell each
    other about one attempt, through its Context: the handler asks for its lease to be
    renewed (``ctx.heartbeat()``) and reports progress (``ctx.progress()``), both
    written with the next renewal; the worker says the attempt is to stop
    (``ctx.cancelled``). The handler may run in a thread of its own: each signal is
    one attribute, set or swapped whole."""

    __slots__ = ("_wake", "cancelled", "progress", "renewal_asked")

    def __init__(self, wake: Callable[[], None] | None = None) -> None:
        self._wake = wake  # tells the worker to renew now, from any thread
        self.cancelled = False
        self.renewal_asked = False
        self.progress: str | None = None  # JSON, not written yet

    def ask_renewal(self) -> None:
        self.renewal_asked = True
        if self._wake is not None:
            self._wake()

    def take_renewal(self) -> bool:
        """Whether a renewal was asked since the last call."""
        asked, self.renewal_asked = self.renewal_asked, False
        return asked

    def take_progress(self) -> str | None:
        """The latest report not written yet, if any; the caller writes it."""
        progress, self.progress = self.progress, None
        return progress

    def keep_progress(self, report: str) -> None:
        """Put back a report that could not be written, unless a newer one came."""
        if self.progress is None:
            self.progress = report


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
        "_clock",
        "_meta",
        "_signals",
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
        self._signals = AttemptSignals(request_heartbeat)
        self._clock: Callable[[], float] = time.time  # a worker's Context has the App's

    @property
    def cancelled(self) -> bool:
        return self._signals.cancelled

    @property
    def meta(self) -> dict[str, Any]:
        """The job's metadata, as enqueue hooks left it (the trace context among it)."""
        if isinstance(self._meta, str):
            self._meta = json.loads(self._meta)
        return self._meta  # type: ignore[return-value]

    def heartbeat(self) -> None:
        """Ask the worker to extend this attempt's lease by the job's ttr."""
        self._signals.ask_renewal()

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
        self._signals.progress = json.dumps({
            "done": done, "total": total,
            "note": None if note is None else note[:MAX_NOTE], "at": self._clock(),
        })  # fmt: skip

    def __repr__(self) -> str:
        return f"<Context job={self.job_id} attempt={self.attempt} fence={self.fence}>"


def attempt_context(signals: AttemptSignals, clock: Callable[[], float], **fields: Any) -> Context:
    """The Context a worker gives an attempt: ``fields`` as for ``Context``, its
    signals shared with the worker, its time (a progress report's) the App's clock."""
    ctx = Context(**fields)
    ctx._signals, ctx._clock = signals, clock
    return ctx


def _amount(name: str, value: object) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
    ):
        raise ValueError(f"{name} must be a finite number, at least 0 (got {value!r})")
