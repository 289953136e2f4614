"""Runs one attempt: find the handler, decode, call, and turn the outcome into a Finish."""

from __future__ import annotations

import asyncio
import contextvars
import ctypes
import enum
import json
import threading
import traceback
from collections.abc import Awaitable, Callable, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any, NoReturn

from ferryq import _json, policy
from ferryq.context import AttemptSignals, Context, attempt_context
from ferryq.errors import SerializationError
from ferryq.hooks import Hooks, Outcome
from ferryq.metrics import QueueMetrics
from ferryq.outcome import DependencyFailed, Fail, Next, Retry, TimedOut
from ferryq.policy import AFTER_RESULTS
from ferryq.store.base import Claimed, Finish
from ferryq.task import Task


class Stop(enum.Enum):
    """Why the worker interrupted an attempt."""

    CANCEL = "cancelled by request"
    TIMEOUT = "time limit passed"
    SHUTDOWN = "worker shutting down"
    LEASE = "lease lost (recovered elsewhere, or not renewed in time)"


class UnknownTask(Exception):
    pass


class LeaseExpired(Exception):
    pass


class Interrupted(BaseException):
    """Raised inside a sync handler's thread to stop it (see ``Attempt.interrupt``).

    A BaseException, so that a handler's ``except Exception`` does not swallow it.
    """


@dataclass(slots=True, eq=False)
class Attempt:
    """One claimed job inside this worker, from claim to written completion."""

    job: Claimed
    task: Task[Any, Any] | None
    lease_until: float
    counts: QueueMetrics = field(repr=False)  # its queue's metrics
    started_at: float | None = None
    deadline: float | None = None  # when its time limit passes, once started
    stop: Stop | None = None
    runner: asyncio.Task[None] | None = field(default=None, repr=False)
    thread: _Thread | None = field(default=None, repr=False)  # a sync handler's, running
    successor: Attempt | None = field(default=None, repr=False)  # a claim waiting for us
    start_written: bool = False  # its started_at, past the claim's, is in the database
    begun: bool = False  # its runner has taken its first step: a cancel of it lands
    handler_done: bool = False  # the handler has ended: nothing left to interrupt
    #: Its Context and the signals it shares with the lease keeper, made when the
    #: handler or a hook first needs them (``Executor.context``).
    ctx: Context | None = field(default=None, repr=False)
    signals: AttemptSignals | None = field(default=None, repr=False)
    #: How the handler ended: what it raised (or what stopped it), or what it returned.
    error: BaseException | None = field(default=None, repr=False)
    result: Any = field(default=None, repr=False)

    def interrupt(self, reason: Stop) -> None:
        """Stop the handler: an async one is cancelled; a sync one has ``Interrupted``
        raised in its thread, which takes effect at its next Python instruction (a
        call blocked in C returns first). Either sees ``ctx.cancelled`` become true
        (docs/guarantees.md, Cancellation). The runner of a sync attempt is never
        cancelled: it ends when the thread does, so a slot is free only once the
        handler has really stopped. An attempt stopped before its handler began never
        runs it (``Executor.run``): its runner is not cancelled before its first
        step, which would end it without a word."""
        if self.stop is None or self.stop is Stop.CANCEL:
            self.stop = reason
        if self.signals is not None:
            self.signals.cancelled = True
        if self.runner is None or self.handler_done or not self.begun:
            return
        if self.task is not None and not self.task.is_async:
            if self.thread is not None:
                self.thread.interrupt()
        else:
            self.runner.cancel()

    @property
    def running(self) -> bool:
        return self.runner is not None and not self.runner.done()


class _Thread:
    """The thread a sync handler runs in, while it runs: ``interrupt`` raises
    ``Interrupted`` there, never in the pool's own code before or after the handler.
    It is sent once at most, so one raised as the handler ended, and caught in
    ``_leave`` or not, leaves nothing behind for the thread's next job."""

    __slots__ = ("_ident", "_lock", "_sent")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ident: int | None = None
        self._sent = False

    def call(self, fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        try:
            with self._lock:
                if self._sent:  # interrupted while it waited for a thread of the pool
                    raise Interrupted
                self._ident = threading.get_ident()
            return fn(*args, **kwargs)
        finally:
            self._leave()

    def _leave(self) -> None:
        while True:
            try:
                with self._lock:
                    if self._ident is not None:
                        _clear_async_exc(self._ident)  # one sent but not raised yet
                    self._ident = None
                return
            except Interrupted:  # raised just before it was cleared: the handler is done
                continue

    def interrupt(self) -> None:
        with self._lock:
            if self._sent:
                return
            self._sent = True  # before the handler began: it never will (``call``)
            if self._ident is not None:
                _set_async_exc(self._ident, Interrupted)


_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
_set_async_exc.argtypes = (ctypes.c_ulong, ctypes.py_object)
_set_async_exc.restype = ctypes.c_int
_clear_async_exc_raw = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p)(
    ("PyThreadState_SetAsyncExc", ctypes.pythonapi)
)


def _clear_async_exc(ident: int) -> None:
    _clear_async_exc_raw(ident, None)


class Executor:
    """Runs the attempts of one worker: ``run``, or ``run_with_hooks`` when the App has
    attempt hooks. An attempt pays for what it uses: its Context is made only for a
    handler that takes one or for hooks, a sync handler's thread only for it."""

    def __init__(
        self,
        *,
        worker: str,
        clock: Callable[[], float],
        threads: futures.Executor | None,
        hooks: Hooks | None,
        results_of: Callable[[int], Awaitable[list[str | None]]],
        wake: Callable[[], None],
    ) -> None:
        self.worker = worker
        self.clock = clock
        self.threads = threads
        self.hooks = hooks
        self.results_of = results_of  # the results of a job's dependencies, for a fan-in
        self.wake = wake  # a handler asks for its lease to be renewed now (any thread)

    def context(self, attempt: Attempt) -> Context:
        """The attempt's Context, made on first need with the signals it shares with
        the lease keeper (ferryq/worker/leases.py)."""
        if attempt.ctx is not None:
            return attempt.ctx
        job = attempt.job
        signals = attempt.signals = AttemptSignals(self.wake)
        signals.cancelled = attempt.stop is not None
        attempt.ctx = attempt_context(
            signals, self.clock, job_id=job.id, task=job.task, queue=job.queue,
            attempt=job.attempts, fence=job.fence, stage=job.stage,
            context=None if job.context == "null" else json.loads(job.context),
            lane=job.lane, max_tries=job.max_tries, timeout=job.timeout, meta=job.meta,
        )  # fmt: skip
        return attempt.ctx

    async def run(self, attempt: Attempt) -> Finish:
        """Run the handler; every outcome, even a crash of the handler, becomes a
        Finish. What ended the handler is left in ``attempt.error``/``result``."""
        attempt.begun = True
        job, task = attempt.job, attempt.task
        try:
            if task is None or job.dep_failed is not None:
                _refused(attempt)
            if job.args == "[]" and task.context_param is None and AFTER_RESULTS not in job.meta:
                args: Sequence[Any] = ()  # no arguments to decode: the common case
                kwargs: dict[str, Any] = {}
            else:
                args, kwargs = await self._arguments(attempt, task)
            if attempt.stop is not None:  # stopped before its handler began: it never runs
                raise Interrupted
            if task.is_async:
                value = await task.fn(*args, **kwargs)
            else:
                value = await self._in_thread(attempt, task.fn, args, kwargs)
        except BaseException as exc:  # SystemExit, KeyboardInterrupt too: see _ended_by
            attempt.handler_done = True
            return self._ended_by(attempt, exc)
        attempt.handler_done = True
        return self._returned(attempt, value)

    async def run_with_hooks(self, attempt: Attempt) -> Finish:
        """``run`` between the attempt hooks (ferryq/hooks.py): the before hooks in the
        handler's own context (``contextvars``), the after hooks once it has ended."""
        hooks = self.hooks
        assert hooks is not None
        ctx = self.context(attempt)
        attempt.begun = True
        try:
            if hooks.before_attempt_hooks:
                await hooks.call(hooks.before_attempt_hooks, ctx)
        except BaseException as exc:  # a stop while an async hook waited
            attempt.handler_done = True
            finish = self._ended_by(attempt, exc)
        else:
            finish = await self.run(attempt)
        if hooks.after_attempt_hooks:
            await hooks.call(hooks.after_attempt_hooks, ctx, outcome(attempt, finish))
        return finish

    async def _arguments(
        self, attempt: Attempt, task: Task[Any, Any]
    ) -> tuple[Sequence[Any], dict[str, Any]]:
        """The handler's arguments, from the job's (a list, or an object of keywords;
        a fan-in callback's first one the results of its dependencies), with its
        Context slotted in if it takes one."""
        job = attempt.job
        decoded = [] if job.args == "[]" else json.loads(job.args)
        if AFTER_RESULTS in job.meta and json.loads(job.meta).get(AFTER_RESULTS):
            decoded = await self._with_results(attempt, decoded)
        args: Sequence[Any] = []
        kwargs: dict[str, Any] = {}
        if isinstance(decoded, dict):
            kwargs = decoded
        elif isinstance(decoded, list):
            args = decoded
        else:
            args = [decoded]
        if task.context_param is not None:
            args, kwargs = task.with_context(args, kwargs, self.context(attempt))
        return args, kwargs

    async def _in_thread(
        self, attempt: Attempt, fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]
    ) -> Any:
        """Call a sync handler in a thread of the pool, where ``Attempt.interrupt`` can
        reach it, and in the context the hooks left (a trace span, say), as an async
        handler is."""
        thread = attempt.thread = _Thread()
        context = contextvars.copy_context()
        try:
            return await asyncio.get_running_loop().run_in_executor(
                self.threads, context.run, thread.call, fn, args, kwargs
            )
        finally:
            attempt.thread = None

    async def _with_results(self, attempt: Attempt, decoded: Any) -> Any:
        """A fan-in callback's arguments: its first one (stored as null) is the list of
        the results of its dependencies, in order; None for one that did not succeed."""
        if not isinstance(decoded, list) or not decoded:
            return decoded
        results = await self.results_of(attempt.job.id)
        return [[None if r is None else json.loads(r) for r in results], *decoded[1:]]

    def _ended_by(self, attempt: Attempt, exc: BaseException) -> Finish:
        """The Finish of an attempt whose handler (or a before hook) raised ``exc``."""
        now = self.clock()
        if isinstance(exc, Interrupted):
            return _interrupted(attempt, now, self.worker)
        if isinstance(exc, asyncio.CancelledError):
            current = asyncio.current_task()
            if attempt.stop is not None or (current is not None and current.cancelling()):
                return _interrupted(attempt, now, self.worker)
            # Raised by the handler itself (a sync handler's cancelled future arrives as
            # one too): a failed attempt, not a stop of ours that would give the try back.
        elif attempt.stop is not None:  # stopped, and the handler raised something else
            return _interrupted(attempt, now, self.worker)
        attempt.error = exc
        return _failed(attempt, exc, now, self.worker)

    def _returned(self, attempt: Attempt, value: Any) -> Finish:
        """The Finish of an attempt whose handler returned ``value``."""
        job, now = attempt.job, self.clock()
        if attempt.stop is Stop.CANCEL or attempt.stop is Stop.TIMEOUT:
            # Stopped, yet the handler returned: its late result is dropped.
            return _interrupted(attempt, now, self.worker)
        attempt.result = value
        if isinstance(value, Next):
            return _next_stage(attempt, value, now, self.worker)
        try:
            result = "null" if value is None else _json.dumps(value, f"result of {job.task}")
        except SerializationError as exc:
            attempt.error = exc
            return failure(job, exc, now, self.worker, permanent=True,
                           started_at=attempt.started_at)  # fmt: skip
        return Finish("succeeded", job.id, job.fence, now, attempt.started_at, result)


def _refused(attempt: Attempt) -> NoReturn:
    """An attempt whose handler never runs: a dependency failed its job, or no handler
    of its task's name is registered here."""
    job = attempt.job
    if job.dep_failed is not None:
        after_id, state = json.loads(job.dep_failed)
        raise DependencyFailed(f"dependency {after_id} ended {state}, so this job does not "
                               "run (after_failed='fail')")  # fmt: skip
    raise UnknownTask(f"unknown task {job.task!r}: no handler is registered in this worker")


def outcome(attempt: Attempt, finish: Finish) -> Outcome:
    """How ``attempt`` ended, as its after hooks see it."""
    started, error = attempt.started_at, attempt.error
    return Outcome(
        finish.kind, 0.0 if started is None else max(finish.finished_at - started, 0.0), error,
        finish.run_at if finish.kind == "retry" else None,
        attempt.result if finish.kind == "succeeded" else None, isinstance(error, TimedOut),
    )  # fmt: skip


def _failed(attempt: Attempt, exc: BaseException, now: float, worker: str) -> Finish:
    """The handler raised ``exc``: retried unless it says otherwise (``Fail``,
    ``Retry``) or the task's ``fail_on``/``retry_on`` make it final."""
    job, task = attempt.job, attempt.task
    if isinstance(exc, Retry):
        return failure(job, exc, now, worker, retry_after=exc.after, started_at=attempt.started_at)
    permanent = isinstance(exc, Fail) or (task is not None and task.failures.permanent(exc))
    return failure(job, exc, now, worker, permanent=permanent, started_at=attempt.started_at)


def _interrupted(attempt: Attempt, now: float, worker: str) -> Finish:
    """The Finish of an attempt the worker stopped (``attempt.stop``), or that a cancel
    from outside ferryq ended."""
    job = attempt.job
    if attempt.stop is Stop.CANCEL:
        return Finish("cancelled", job.id, job.fence, now, attempt.started_at)
    if attempt.stop is Stop.TIMEOUT:
        timed_out = attempt.error = TimedOut(
            f"timed out: the attempt ran past its time limit of {job.timeout:g} s and was stopped"
        )
        return _failed(attempt, timed_out, now, worker)
    if attempt.stop is Stop.LEASE:
        exc = attempt.error = LeaseExpired(
            f"the worker lost the lease (ttr {job.ttr:g} s) while the handler ran"
        )
        return failure(job, exc, now, worker, started_at=attempt.started_at)
    # Shutdown (or a cancel from outside ferryq): hand the job back without charging it.
    return Finish("returned", job.id, job.fence, now)


def _next_stage(attempt: Attempt, step: Next, now: float, worker: str) -> Finish:
    job = attempt.job
    try:
        context = _json.dumps(step.context, f"context for stage {step.stage!r}")
    except SerializationError as exc:
        return failure(job, exc, now, worker, permanent=True, started_at=attempt.started_at)
    run_at = now + step.delay
    return Finish(
        "next", job.id, job.fence, now, attempt.started_at,
        run_at=run_at, order_time=policy.order_time(run_at, job.priority),
        stage=step.stage, context=context,
    )  # fmt: skip


def _message(exc: BaseException) -> str:
    try:
        return str(exc) or type(exc).__name__
    except Exception as broken:  # an exception whose __str__ fails
        return f"{type(exc).__name__} (its message could not be read: {broken!r})"


def _traceback(exc: BaseException) -> str:
    try:
        return "".join(traceback.format_exception(exc))
    except Exception:
        return "".join(traceback.format_tb(exc.__traceback__)) + _message(exc)


def failure(
    job: Claimed,
    exc: BaseException,
    now: float,
    worker: str,
    *,
    permanent: bool = False,
    retry_after: float | None = None,
    started_at: float | None = None,
) -> Finish:
    """A failed attempt: retried after its backoff while tries remain, else dead."""
    error = {
        "type": type(exc).__name__,
        "message": _json.printable(_message(exc)),
        "traceback": _json.printable(_traceback(exc)) if exc.__traceback__ else None,
        "attempt": job.attempts,
        "stage": job.stage,
        "worker": worker,
        "at": now,
    }
    if permanent or job.attempts >= job.max_tries:
        return Finish("dead", job.id, job.fence, now, started_at, error=error)
    delay = retry_after
    if delay is None:
        delay = policy.retry_delay(json.loads(job.retry), job.attempts)
    # A retry is due at now + backoff and ignores the job's priority (docs/guarantees.md,
    # Order).
    run_at = now + delay
    return Finish("retry", job.id, job.fence, now, started_at, error=error,
                  run_at=run_at, order_time=run_at)  # fmt: skip
