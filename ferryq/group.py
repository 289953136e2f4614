"""Fan-out and fan-in: many jobs of one task, then a callback that runs once every one
of them has ended, and receives their results in order.

    album_job = ferryq.group(thumbnail, [(photo,) for photo in photos]).then(album, 7)

``thumbnail`` runs once per photo, in parallel across workers; ``album(results, 7)``
runs after the last of them, with ``results[i]`` the result of the i-th call. The
callback is an ordinary job with ``after`` set to the members (see
``Task.options(after=...)``): it is held until they end, fails when one of them does
not succeed (``after_failed="run"`` runs it anyway, with None for that result), and
explain says which members it still waits for.

The members are enqueued first, then the callback: a process that dies in between
leaves the members without their callback.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ferryq.policy import AFTER_RESULTS
from ferryq.task import Task, TaskCall

if TYPE_CHECKING:
    from ferryq.handle import JobHandle

Call = Sequence[Any] | dict[str, Any]


class Group:
    """Calls of one task, enqueued together by ``then`` (or ``enqueue``)."""

    def __init__(self, task: Task[Any, Any] | TaskCall[Any, Any], calls: Iterable[Call]) -> None:
        self.call = _bound(task)
        self.calls = list(calls)
        self.members: list[JobHandle] = []  # once enqueued

    def enqueue(self) -> list[JobHandle]:
        """Enqueue the members alone; their handles."""
        self.members = self.call.enqueue_many(self.calls)
        return self.members

    async def enqueue_async(self) -> list[JobHandle]:
        self.members = await self.call.enqueue_many_async(self.calls)
        return self.members

    def then(self, callback: Task[Any, Any] | TaskCall[Any, Any], *args: Any) -> JobHandle:
        """Enqueue the members, then ``callback(results, *args)`` after them."""
        members = self.members or self.enqueue()
        bound = _callback(callback, members)
        return bound.enqueue(None, *args)  # null: where its worker puts the results

    async def then_async(
        self, callback: Task[Any, Any] | TaskCall[Any, Any], *args: Any
    ) -> JobHandle:
        members = self.members or await self.enqueue_async()
        bound = _callback(callback, members)
        return await bound.enqueue_async(None, *args)


def group(task: Task[Any, Any] | TaskCall[Any, Any], calls: Iterable[Call]) -> Group:
    """A group of calls of ``task`` (each a tuple of positional arguments, or a dict of
    keywords), to enqueue with a callback: ``group(task, calls).then(callback, *args)``."""
    return Group(task, calls)


def _bound(task: Task[Any, Any] | TaskCall[Any, Any]) -> TaskCall[Any, Any]:
    return task if isinstance(task, TaskCall) else TaskCall(task, task.defaults)


def _callback(
    callback: Task[Any, Any] | TaskCall[Any, Any], members: Sequence[JobHandle]
) -> TaskCall[Any, Any]:
    bound = _bound(callback)
    meta = {**bound.job_options.meta, AFTER_RESULTS: True}
    return TaskCall(
        bound.task, bound.job_options.merged(after=members, meta=meta), bound.connection
    )
