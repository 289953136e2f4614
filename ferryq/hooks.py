"""Hooks: your code around every enqueue and every attempt (logs, metrics, tracing).

Four events, each a list of callables, plain or async:

- ``before_enqueue(enqueue)``: the options are checked, nothing is written yet; add
  to ``enqueue.meta`` and it is stored with the jobs (the trace context goes there).
- ``after_enqueue(enqueue)``: ``enqueue.ids`` holds the new jobs' ids, or
  ``enqueue.exception`` says why none was written.
- ``before_attempt(ctx)``: in the worker, just before the handler runs, in the same
  context (``contextvars``) as the handler, sync or async.
- ``after_attempt(ctx, outcome)``: once the handler has ended, before the outcome
  is written.

``before_*`` hooks run in the order they were added, ``after_*`` hooks in the reverse
order, so that the first added wraps all the others. A hook that raises is logged
(``ferryq.hooks``) and skipped: it never fails an enqueue or an attempt, and never
loses a job. Hooks of attempts run on the worker's event loop: a plain function there
must be quick, and an async one must not wait long, as its slot stays taken meanwhile.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from ferryq.faults import one_line
from ferryq.policy import JobOptions

if TYPE_CHECKING:
    from ferryq.context import Context

log = logging.getLogger("ferryq.hooks")

#: After the first failure of a hook, at most one line a minute about it.
COMPLAIN_EVERY = 60.0

OutcomeKind = Literal["succeeded", "retry", "dead", "cancelled", "next", "returned"]


@dataclass(slots=True)
class Enqueue:
    """One enqueue call, as its hooks see it: ``count`` jobs of ``task``."""

    task: str
    options: JobOptions
    count: int
    meta: dict[str, Any]  # stored with every job of the call: hooks may add to it
    ids: list[int] = field(default_factory=list)  # after: the jobs' ids
    exception: BaseException | None = None  # after: why nothing was written


@dataclass(frozen=True, slots=True)
class Outcome:
    """How an attempt ended.

    ``kind``: ``succeeded``, ``retry`` (a try remains: it runs again at ``retry_at``),
    ``dead``, ``cancelled``, ``next`` (a stage ended, the next is queued) or
    ``returned`` (handed back unrun or unfinished, by a stopping worker: no try
    charged). ``exception`` is what the handler raised, or what stopped it
    (``ferryq.TimedOut``, a lost lease). ``duration``: seconds the handler ran.
    """

    kind: OutcomeKind
    duration: float
    exception: BaseException | None = None
    retry_at: float | None = None
    result: Any = None
    timed_out: bool = False  # the exception is a ``ferryq.TimedOut``

    @property
    def error(self) -> str | None:
        """The exception as one short line, ``Type: message``."""
        if self.exception is None:
            return None
        return one_line(self.exception)


BeforeEnqueue = Callable[[Enqueue], Awaitable[None] | None]
AfterEnqueue = Callable[[Enqueue], Awaitable[None] | None]
BeforeAttempt = Callable[["Context"], Awaitable[None] | None]
AfterAttempt = Callable[["Context", Outcome], Awaitable[None] | None]

_EVENTS = ("before_enqueue", "after_enqueue", "before_attempt", "after_attempt")


class Hooks:
    """The hooks of an App: ``app.hooks``. Each event's method registers a hook and
    returns it, so it serves as a decorator::

        @app.hooks.after_attempt
        def count(ctx: ferryq.Context, outcome: ferryq.Outcome) -> None: ...

    ``use(middleware)`` registers every method of an object named after an event.
    """

    def __init__(self) -> None:
        self.before_enqueue_hooks: list[BeforeEnqueue] = []
        self.after_enqueue_hooks: list[AfterEnqueue] = []
        self.before_attempt_hooks: list[BeforeAttempt] = []
        self.after_attempt_hooks: list[AfterAttempt] = []
        self._complaints: dict[int, _Complaint] = {}

    def before_enqueue(self, hook: BeforeEnqueue) -> BeforeEnqueue:
        self.before_enqueue_hooks.append(_checked(hook, "before_enqueue"))
        return hook

    def after_enqueue(self, hook: AfterEnqueue) -> AfterEnqueue:
        self.after_enqueue_hooks.insert(0, _checked(hook, "after_enqueue"))
        return hook

    def before_attempt(self, hook: BeforeAttempt) -> BeforeAttempt:
        self.before_attempt_hooks.append(_checked(hook, "before_attempt"))
        return hook

    def after_attempt(self, hook: AfterAttempt) -> AfterAttempt:
        self.after_attempt_hooks.insert(0, _checked(hook, "after_attempt"))
        return hook

    def use(self, middleware: object) -> None:
        """Register each of ``before_enqueue``, ``after_enqueue``, ``before_attempt``
        and ``after_attempt`` that ``middleware`` has."""
        found = [name for name in _EVENTS if callable(getattr(middleware, name, None))]
        if not found:
            raise TypeError(f"{middleware!r} has none of the hook methods {', '.join(_EVENTS)}")
        for name in found:
            getattr(self, name)(getattr(middleware, name))

    @property
    def around_enqueue(self) -> bool:
        return bool(self.before_enqueue_hooks or self.after_enqueue_hooks)

    @property
    def around_attempts(self) -> bool:
        return bool(self.before_attempt_hooks or self.after_attempt_hooks)

    async def call(self, hooks: list[Callable[..., Any]], *args: Any) -> None:
        """Call every hook of an event in turn; one that raises is logged and skipped."""
        for hook in hooks:
            try:
                result = hook(*args)
                if inspect.isawaitable(result):
                    await result
            except Exception as exc:
                self._complain(hook, exc)

    def _complain(self, hook: Callable[..., Any], exc: Exception) -> None:
        complaint = self._complaints.setdefault(id(hook), _Complaint())
        complaint.failures += 1
        now = time.monotonic()
        if complaint.said_at is not None and now - complaint.said_at < COMPLAIN_EVERY:
            return
        name = getattr(hook, "__qualname__", repr(hook))
        log.error("hook %s raised %s (%d time(s) since it last said so); ferryq goes on "
                  "without it for this call", name, type(exc).__name__, complaint.failures,
                  exc_info=exc if complaint.said_at is None else None)  # fmt: skip
        complaint.said_at, complaint.failures = now, 0


@dataclass(slots=True)
class _Complaint:
    failures: int = 0
    said_at: float | None = None


def _checked(hook: Any, event: str) -> Any:
    if not callable(hook):
        raise TypeError(f"a {event} hook must be callable (got {hook!r})")
    return hook
