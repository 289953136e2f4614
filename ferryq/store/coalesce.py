"""Enqueue calls made at the same time, committed together.

A web server enqueues one job per request, from many threads or tasks at once. Each
call needs its job durable before it returns, and a commit is what costs: an fsync
on PostgreSQL and on SQLite at ``synchronous=full``. So the calls that arrive while a
commit is under way wait for it to end and then share the next one (a group commit),
each returning once its own job is in. A single caller never waits for anyone.

Each backend decides who commits (see the stores); this module holds what they share:
the waiting call, and how a batch's outcome reaches each one.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from ferryq.errors import StoreError
from ferryq.store.base import Inserted, NewJob

#: The most calls one transaction takes: a batch stays a short transaction.
MAX_BATCH = 500


@dataclass(slots=True, eq=False)
class PendingInsert:
    """One enqueue call waiting for a commit: its jobs, then its outcome."""

    job: NewJob
    args: Sequence[str]
    inserted: list[Inserted] | None = None
    error: BaseException | None = None
    #: How the caller hears that its outcome is in: an async caller awaits ``future``
    #: on ``loop``; a sync caller blocks on ``wake``, a lock held until then.
    future: asyncio.Future[None] | None = None
    loop: asyncio.AbstractEventLoop | None = None
    wake: threading.Lock | None = None
    #: Told to lead the next commit of calls (PostgreSQL).
    lead: bool = False

    @property
    def done(self) -> bool:
        return self.inserted is not None or self.error is not None

    def outcome(self) -> list[Inserted]:
        if self.error is not None:
            raise self.error
        assert self.inserted is not None
        return self.inserted

    def settle(self) -> None:
        """Tell the caller its outcome is in."""
        if self.wake is not None:
            self.wake.release()
        future, loop = self.future, self.loop
        if future is None:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop is None or running is loop:
            _resolve(future)
        else:
            with contextlib.suppress(RuntimeError):  # its loop is closed: no one waits
                loop.call_soon_threadsafe(_resolve, future)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():  # its caller may have been cancelled meanwhile
        future.set_result(None)


def take(queue: deque[PendingInsert], most: int | None = MAX_BATCH) -> list[PendingInsert]:
    """The calls waiting in ``queue``, oldest first, at most ``most``."""
    batch: list[PendingInsert] = []
    while queue and (most is None or len(batch) < most):
        batch.append(queue.popleft())
    return batch


def fail_all(batch: Sequence[PendingInsert], error: BaseException) -> None:
    """Each call of a batch that could not commit gets the error, as its own copy:
    callers raise it in their own threads and tasks."""
    for index, pending in enumerate(batch):
        if not pending.done:
            pending.error = error if index == 0 else _copy(error)


def fail_interrupted(batch: Sequence[PendingInsert], cause: BaseException) -> None:
    """The committer of a batch was interrupted (its caller cancelled, its thread or
    loop stopping): the other callers get a StoreError, not the interruption."""
    stopped = StoreError("the enqueue was interrupted: its commit was cancelled")
    stopped.__cause__ = cause
    fail_all(batch, stopped)


def _copy(error: BaseException) -> BaseException:
    try:
        twin = copy.copy(error)
    except Exception:
        return error
    twin.__cause__, twin.__traceback__ = error.__cause__, None
    return twin
