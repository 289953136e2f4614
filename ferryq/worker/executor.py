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
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from ferryq import _json, policy
from ferryq.context import Context
from ferryq.errors import SerializationError
from ferryq.hooks import Hooks, Outcome
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
    ctx: Context
    started_at: float | None = None
    deadline: float | None = None  # when its time limit passes, once started
    stop: Stop | None = None
    runner: asyncio.Task[None] | None = field(default=None, repr=False)
    thread: _Thread | None = field(default=None, repr=False)  # a sync handler's, running
    successor: Attempt | None = field(default=None, repr=False)  # a claim waiting for us
    start_written: bool = False  # its started_at, past the claim's, is in the database
    begun: bool = False  # its runner has taken its first step: a cancel of it lands
    #: Reads the results of a job's dependencies, for a fan-in callback (ferryq.group).
    results_of: Callable[[int], Awaitable[list[str | None]]] | None = field(
        default=None, repr=False
    )
    handler_done: bool = False  # the handler has ended: nothing left to interrupt

    def interrupt(self, reason: Stop) -> None:
        """Stop the handler: an async one is cancelled; a sync one has ``Interrupted``
        raised in its thread, which takes effect at its next Python instruction (a
        call blocked in C returns first). Either sees ``ctx.cancelled`` become true
        (SPEC §9). The runner of a sync attempt is never cancelled: it ends when the
        thread does, so a slot is free only once the handler has really stopped. An
        attempt stopped before its handler began never runs it (``_call``): its runner
        is not cancelled before its first step, which would end it without a word."""
        if self.stop is None or self.stop is Stop.CANCEL:
            self.stop = reason
        self.ctx._cancel()
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


async def run(
    attempt: Attempt,
    threads: Executor | None,
    clock: Callable[[], float],
    worker: str,
    hooks: Hooks | None = None,
) -> tuple[Finish, Outcome]:
    """Run the handler between the attempt hooks; every outcome, even a crash of the
    handler, becomes a Finish (to write) and an Outcome (to tell)."""
    attempt.begun = True
    finish, exc, value = await _ended(attempt, threads, clock, worker, hooks)
    attempt.handler_done = True
    started = attempt.started_at
    outcome = Outcome(
        finish.kind, 0.0 if started is None else max(finish.finished_at - started, 0.0), exc,
        finish.run_at if finish.kind == "retry" else None,
        value if finish.kind == "succeeded" else None, isinstance(exc, TimedOut),
    )  # fmt: skip
    if hooks is not None and hooks.after_attempt_hooks:
        await hooks.call(hooks.after_attempt_hooks, attempt.ctx, outcome)
    return finish, outcome


async def _ended(
    attempt: Attempt,
    threads: Executor | None,
    clock: Callable[[], float],
    worker: str,
    hooks: Hooks | None,
) -> tuple[Finish, BaseException | None, Any]:
    """The attempt's Finish, the exception that ended it (if one did) and the value
    its handler returned."""
    job, started = attempt.job, attempt.started_at
    try:
        if hooks is not None and hooks.before_attempt_hooks:
            await hooks.call(hooks.before_attempt_hooks, attempt.ctx)
        value = await _call(attempt, threads)
    except Interrupted:
        return _interrupted(attempt, clock(), worker)
    except asyncio.CancelledError as exc:
        current = asyncio.current_task()
        if attempt.stop is not None or (current is not None and current.cancelling()):
            return _interrupted(attempt, clock(), worker)
        # Raised by the handler itself (a sync handler's cancelled future arrives as
        # one too): a failed attempt, not a stop of ours that would give the try back.
        return _failed(attempt, exc, clock(), worker), exc, None
    except BaseException as exc:  # SystemExit, KeyboardInterrupt too: this attempt failed
        if attempt.stop is not None:  # stopped, and the handler raised something else
            return _interrupted(attempt, clock(), worker)
        return _failed(attempt, exc, clock(), worker), exc, None
    now = clock()
    if attempt.stop is Stop.CANCEL or attempt.stop is Stop.TIMEOUT:
        # Stopped, yet the handler returned: its late result is dropped.
        return _interrupted(attempt, now, worker)
    if isinstance(value, Next):
        return _next_stage(attempt, value, now, worker), None, value
    try:
        result = "null" if value is None else _json.dumps(value, f"result of {job.task}")
    except SerializationError as exc:
        return failure(job, exc, now, worker, permanent=True, started_at=started), exc, value
    return Finish("succeeded", job.id, job.fence, now, started, result), None, value


def _failed(attempt: Attempt, exc: BaseException, now: float, worker: str) -> Finish:
    """The handler raised ``exc``: retried unless it says otherwise (``Fail``,
    ``Retry``) or the task's ``fail_on``/``retry_on`` make it final."""
    job, task = attempt.job, attempt.task
    if isinstance(exc, Retry):
        return failure(job, exc, now, worker, retry_after=exc.after, started_at=attempt.started_at)
    permanent = isinstance(exc, Fail) or (task is not None and task.failures.permanent(exc))
    return failure(job, exc, now, worker, permanent=permanent, started_at=attempt.started_at)


async def _call(attempt: Attempt, threads: Executor | None) -> Any:
    task, job = attempt.task, attempt.job
    if job.dep_failed is not None:
        after_id, state = json.loads(job.dep_failed)
        raise DependencyFailed(f"dependency {after_id} ended {state}, so this job does not "
                               "run (after_failed='fail')")  # fmt: skip
    if task is None:
        raise UnknownTask(f"unknown task {job.task!r}: no handler is registered in this worker")
    decoded = [] if job.args == "[]" else json.loads(job.args)
    if AFTER_RESULTS in job.meta and json.loads(job.meta).get(AFTER_RESULTS):
        decoded = await _with_results(attempt, decoded)
    args: Sequence[Any] = []
    kwargs: dict[str, Any] = {}
    if isinstance(decoded, dict):
        kwargs = decoded
    elif isinstance(decoded, list):
        args = decoded
    else:
        args = [decoded]
    if task.context_param is not None:
        args, kwargs = task.with_context(args, kwargs, attempt.ctx)
    if attempt.stop is not None:  # stopped before its handler began: it never runs
        raise Interrupted
    if task.is_async:
        return await task.fn(*args, **kwargs)
    thread = attempt.thread = _Thread()
    # In the context the hooks left (a trace span, say), as an async handler is.
    context = contextvars.copy_context()
    try:
        return await asyncio.get_running_loop().run_in_executor(
            threads, context.run, thread.call, task.fn, args, kwargs
        )
    finally:
        attempt.thread = None


async def _with_results(attempt: Attempt, decoded: Any) -> Any:
    """A fan-in callback's arguments: its first one (stored as null) is the list of
    the results of its dependencies, in order; None for one that did not succeed."""
    if attempt.results_of is None or not isinstance(decoded, list) or not decoded:
        return decoded
    results = await attempt.results_of(attempt.job.id)
    return [[None if r is None else json.loads(r) for r in results], *decoded[1:]]


def _interrupted(
    attempt: Attempt, now: float, worker: str
) -> tuple[Finish, BaseException | None, Any]:
    job = attempt.job
    if attempt.stop is Stop.CANCEL:
        return Finish("cancelled", job.id, job.fence, now, attempt.started_at), None, None
    if attempt.stop is Stop.TIMEOUT:
        timed_out = TimedOut(f"timed out: the attempt ran past its time limit of "
                             f"{job.timeout:g} s and was stopped")  # fmt: skip
        return _failed(attempt, timed_out, now, worker), timed_out, None
    if attempt.stop is Stop.LEASE:
        exc = LeaseExpired(f"the worker lost the lease (ttr {job.ttr:g} s) while the handler ran")
        return failure(job, exc, now, worker, started_at=attempt.started_at), exc, None
    # Shutdown (or a cancel from outside ferryq): hand the job back without charging it.
    return Finish("returned", job.id, job.fence, now), None, None


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
    # A retry is due at now + backoff and ignores the job's priority (SPEC §3).
    run_at = now + delay
    return Finish("retry", job.id, job.fence, now, started_at, error=error,
                  run_at=run_at, order_time=run_at)  # fmt: skip
