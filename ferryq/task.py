"""Tasks: handlers registered with ``@app.task``, and the calls that enqueue them."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar

from ferryq import _json
from ferryq.context import Context
from ferryq.handle import JobHandle
from ferryq.policy import JobOptions

if TYPE_CHECKING:
    from ferryq.app import App

P = ParamSpec("P")
R = TypeVar("R")


class Task(Generic[P, R]):
    """A registered handler. Calling it runs the function inline, with no queue."""

    def __init__(self, app: App, fn: Callable[P, R], name: str, defaults: JobOptions) -> None:
        self.app = app
        self.fn = fn
        self.name = name
        self.defaults = defaults
        self.is_async = inspect.iscoroutinefunction(fn)
        self.context_param = _context_parameter(fn)
        self._signature = inspect.signature(fn)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<Task {self.name} queue={self.queue}>"

    @property
    def queue(self) -> str:
        return self.defaults.queue or "default"

    def options(self, **overrides: Any) -> TaskCall[P, R]:
        """The same task with per-enqueue options: ``lane``, ``delay``, ``priority``, …"""
        return TaskCall(self, self.defaults.merged(**overrides))

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> JobHandle:
        return TaskCall(self, self.defaults).enqueue(*args, **kwargs)

    async def enqueue_async(self, *args: P.args, **kwargs: P.kwargs) -> JobHandle:
        return await TaskCall(self, self.defaults).enqueue_async(*args, **kwargs)

    def enqueue_many(self, calls: Iterable[Sequence[Any] | dict[str, Any]]) -> list[JobHandle]:
        return TaskCall(self, self.defaults).enqueue_many(calls)

    async def enqueue_many_async(
        self, calls: Iterable[Sequence[Any] | dict[str, Any]]
    ) -> list[JobHandle]:
        return await TaskCall(self, self.defaults).enqueue_many_async(calls)

    def encode_args(self, args: Sequence[Any], kwargs: dict[str, Any]) -> str:
        """Positional calls are stored as a JSON array; any keyword makes it an object."""
        if not kwargs:
            return _json.dumps(list(args), f"arguments of {self.name}")
        try:
            bound = self._signature.bind_partial(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{self.name}: {exc}") from None
        if any(p.kind is p.VAR_POSITIONAL for p in self._signature.parameters.values()) and args:
            raise TypeError(f"{self.name}: pass *args or keywords, not both")
        named = dict(bound.arguments)
        for param in self._signature.parameters.values():
            if param.kind is param.VAR_KEYWORD and param.name in named:
                named.update(named.pop(param.name))
        return _json.dumps(named, f"arguments of {self.name}")


class TaskCall(Generic[P, R]):
    """A task with options bound, ready to enqueue."""

    def __init__(self, task: Task[P, R], options: JobOptions) -> None:
        self.task = task
        self.job_options = options

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> JobHandle:
        encoded = self.task.encode_args(args, kwargs)
        app = self.task.app
        return app.portal_call(app.enqueue_raw(self.task.name, [encoded], self.job_options))[0]

    async def enqueue_async(self, *args: P.args, **kwargs: P.kwargs) -> JobHandle:
        encoded = self.task.encode_args(args, kwargs)
        return (await self.task.app.enqueue_raw(self.task.name, [encoded], self.job_options))[0]

    def enqueue_many(self, calls: Iterable[Sequence[Any] | dict[str, Any]]) -> list[JobHandle]:
        encoded = self._encode_many(calls)
        app = self.task.app
        return app.portal_call(app.enqueue_raw(self.task.name, encoded, self.job_options))

    async def enqueue_many_async(
        self, calls: Iterable[Sequence[Any] | dict[str, Any]]
    ) -> list[JobHandle]:
        encoded = self._encode_many(calls)
        return await self.task.app.enqueue_raw(self.task.name, encoded, self.job_options)

    def _encode_many(self, calls: Iterable[Sequence[Any] | dict[str, Any]]) -> list[str]:
        encode = self.task.encode_args
        return [encode((), c) if isinstance(c, dict) else encode(c, {}) for c in calls]


def _context_parameter(fn: Callable[..., Any]) -> str | None:
    """The name of the parameter annotated ``ferryq.Context``, if the handler has one."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # unresolvable string annotations: fall back to their text
        hints = {n: p.annotation for n, p in inspect.signature(fn).parameters.items()}
    for name, hint in hints.items():
        if name != "return" and (hint is Context or hint in ("Context", "ferryq.Context")):
            return name
    return None
