"""Tasks: handlers registered with ``@app.task``, and the calls that enqueue them."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, ParamSpec, Protocol, TypeVar

from ferryq import _json
from ferryq.context import Context
from ferryq.handle import JobHandle
from ferryq.policy import JobOptions

P = ParamSpec("P")
R = TypeVar("R")

#: One exception class or a tuple of them, as ``retry_on`` and ``fail_on`` take.
ExceptionTypes = type[BaseException] | tuple[type[BaseException], ...]


@dataclass(frozen=True, slots=True)
class Failures:
    """Which exceptions of a task's handler retry (docs/guarantees.md, Selective
    retries): one of ``fail_on``, or one not of ``retry_on`` when that is given, makes
    the job dead at once."""

    retry_on: tuple[type[BaseException], ...] | None = None
    fail_on: tuple[type[BaseException], ...] = ()

    @classmethod
    def of(cls, retry_on: ExceptionTypes | None, fail_on: ExceptionTypes | None) -> Failures:
        return cls(
            None if retry_on is None else _exception_types("retry_on", retry_on),
            () if fail_on is None else _exception_types("fail_on", fail_on),
        )

    def permanent(self, exc: BaseException) -> bool:
        """Whether ``exc``, raised by the handler, ends the job without retrying."""
        if isinstance(exc, self.fail_on):
            return True
        return self.retry_on is not None and not isinstance(exc, self.retry_on)


def _exception_types(option: str, value: object) -> tuple[type[BaseException], ...]:
    types = value if isinstance(value, tuple) else (value,)
    if not all(isinstance(t, type) and issubclass(t, BaseException) for t in types):
        raise ValueError(f"{option} must be an exception class or a tuple of them (got {value!r})")
    return types


class TaskApp(Protocol):
    """What a task asks of the App it is registered with (``ferryq.App`` is one): its
    enqueues, async, sync, and on the caller's connection. Typed so, the task names
    what it uses and depends on nothing of ferryq/app.py, which imports it in turn
    (tests/unit/test_imports.py)."""

    async def enqueue_raw(
        self,
        task: str,
        encoded_args: Sequence[str],
        options: JobOptions,
        connection: object | None = None,
        payload_limit: int | None = None,
    ) -> list[JobHandle]: ...

    def enqueue_raw_sync(
        self, task: str, encoded_args: Sequence[str], options: JobOptions
    ) -> list[JobHandle]: ...

    def enqueue_raw_on(
        self, connection: object, task: str, encoded_args: Sequence[str], options: JobOptions
    ) -> list[JobHandle]: ...


class Task(Generic[P, R]):
    """A registered handler. Calling it runs the function inline, with no queue."""

    def __init__(
        self,
        app: TaskApp,
        fn: Callable[P, R],
        name: str,
        defaults: JobOptions,
        failures: Failures = Failures(),
    ) -> None:
        self.app = app
        self.fn = fn
        self.name = name
        self.defaults = defaults
        self.failures = failures
        # An object whose __call__ is async is awaited too.
        self.is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
            type(fn).__call__
        )
        self.context_param = _context_parameter(fn)
        signature = inspect.signature(fn)
        self._context_index = _positional_index(signature, self.context_param)
        # What callers pass: the handler's parameters without its Context.
        self._signature = signature.replace(
            parameters=[p for p in signature.parameters.values() if p.name != self.context_param]
        )
        # How many positional arguments a call may pass, checked at every enqueue.
        params = list(self._signature.parameters.values())
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        self._fewest = sum(1 for p in positional if p.default is p.empty)
        self._most = (
            len(positional) if all(p.kind is not p.VAR_POSITIONAL for p in params) else None
        )
        self._needs_keywords = any(
            p.kind is p.KEYWORD_ONLY and p.default is p.empty for p in params
        )

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run the function inline, with no queue (a handler's Context is made up)."""
        if self.context_param is None:
            return self.fn(*args, **kwargs)
        ctx = Context(job_id=0, task=self.name, queue=self.queue, attempt=1, fence=0,
                      stage=None, context=None)  # fmt: skip
        call_args, call_kwargs = self.with_context(args, kwargs, ctx)
        return self.fn(*call_args, **call_kwargs)

    def with_context(
        self, args: Sequence[Any], kwargs: dict[str, Any], ctx: Context | None
    ) -> tuple[Sequence[Any], dict[str, Any]]:
        """The call's arguments with the handler's Context slotted in where it belongs."""
        if self.context_param is None:
            return args, kwargs
        index = self._context_index
        if index is not None and len(args) >= index:
            return [*args[:index], ctx, *args[index:]], kwargs
        return args, {**kwargs, self.context_param: ctx}

    def __repr__(self) -> str:
        return f"<Task {self.name} queue={self.queue}>"

    def _takes(self, count: int) -> bool:
        """Whether a call of ``count`` positional arguments fits the handler."""
        return (
            not self._needs_keywords
            and count >= self._fewest
            and (self._most is None or count <= self._most)
        )

    def callable_without_arguments(self) -> bool:
        """Whether the handler can run with no arguments (besides its Context)."""
        try:
            self._signature.bind()
        except TypeError:
            return False
        return True

    @property
    def queue(self) -> str:
        return self.defaults.queue or "default"

    def options(self, **overrides: Any) -> TaskCall[P, R]:
        """The same task with per-enqueue options: ``lane``, ``delay``, ``priority``, …"""
        return TaskCall(self, self.defaults.merged(**overrides))

    def using(self, connection: object) -> TaskCall[P, R]:
        """Enqueue on your own database connection, inside your open transaction."""
        return TaskCall(self, self.defaults, connection)

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
        """Positional calls are stored as a JSON array; any keyword makes it an object.
        A call the handler could not take is a TypeError here, not a dead job later."""
        if not kwargs and self._takes(len(args)):
            return _json.dumps(list(args), f"arguments of {self.name}")
        try:
            bound = self._signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{self.name}: {exc}") from None
        if not kwargs:
            return _json.dumps(list(args), f"arguments of {self.name}")
        if any(p.kind is p.VAR_POSITIONAL for p in self._signature.parameters.values()) and args:
            raise TypeError(f"{self.name}: pass *args or keywords, not both")
        params = self._signature.parameters
        if any(params[name].kind is inspect.Parameter.POSITIONAL_ONLY for name in bound.arguments):
            if bound.kwargs:
                raise TypeError(f"{self.name}: a job stores its arguments as a list or as "
                                "keywords; pass every argument positionally")  # fmt: skip
            return _json.dumps(list(bound.args), f"arguments of {self.name}")
        named = dict(bound.arguments)
        for param in self._signature.parameters.values():
            if param.kind is param.VAR_KEYWORD and param.name in named:
                named.update(named.pop(param.name))
        return _json.dumps(named, f"arguments of {self.name}")


class TaskCall(Generic[P, R]):
    """A task with options bound, ready to enqueue."""

    def __init__(
        self, task: Task[P, R], options: JobOptions, connection: object | None = None
    ) -> None:
        self.task = task
        self.job_options = options
        self.connection = connection

    def using(self, connection: object) -> TaskCall[P, R]:
        """Enqueue on your own database connection, inside your open transaction.

        A sync psycopg 3 connection works with ``enqueue``; asyncpg and async psycopg 3
        connections with ``enqueue_async``; a sqlite3 connection to the App's SQLite
        file with either, on its own thread. The job exists only if you commit.
        """
        return TaskCall(self.task, self.job_options, connection)

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> JobHandle:
        return self._enqueue_sync([self.task.encode_args(args, kwargs)])[0]

    async def enqueue_async(self, *args: P.args, **kwargs: P.kwargs) -> JobHandle:
        return (await self._enqueue([self.task.encode_args(args, kwargs)]))[0]

    def enqueue_many(self, calls: Iterable[Sequence[Any] | dict[str, Any]]) -> list[JobHandle]:
        return self._enqueue_sync(self._encode_many(calls))

    async def enqueue_many_async(
        self, calls: Iterable[Sequence[Any] | dict[str, Any]]
    ) -> list[JobHandle]:
        return await self._enqueue(self._encode_many(calls))

    def _enqueue_sync(self, encoded: list[str]) -> list[JobHandle]:
        app, name, options = self.task.app, self.task.name, self.job_options
        if self.connection is not None:
            return app.enqueue_raw_on(self.connection, name, encoded, options)
        return app.enqueue_raw_sync(name, encoded, options)

    async def _enqueue(self, encoded: list[str]) -> list[JobHandle]:
        app = self.task.app
        return await app.enqueue_raw(self.task.name, encoded, self.job_options, self.connection)

    def _encode_many(self, calls: Iterable[Sequence[Any] | dict[str, Any]]) -> list[str]:
        encode = self.task.encode_args
        return [encode((), c) if isinstance(c, dict) else encode(_positional(c), {}) for c in calls]


def _positional(call: object) -> Sequence[Any]:
    if isinstance(call, str | bytes) or not isinstance(call, Sequence):
        raise TypeError(
            f"each call is a list or tuple of arguments or a dict of keywords, not {call!r:.60}"
            " (one argument: wrap it, as (value,))"
        )
    return call


def _positional_index(signature: inspect.Signature, name: str | None) -> int | None:
    """Where the Context parameter stands among the positional ones, if it does."""
    for index, param in enumerate(signature.parameters.values()):
        if param.name == name:
            positional = (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD)
            return index if param.kind in positional else None
    return None


def _context_parameter(fn: Callable[..., Any]) -> str | None:
    """The name of the parameter annotated ``ferryq.Context``, if the handler has one."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # unresolvable string annotations: fall back to their text
        hints = {n: p.annotation for n, p in inspect.signature(fn).parameters.items()}
    for name, hint in hints.items():
        if name != "return" and _is_context(hint):
            return name
    return None


def _is_context(hint: object) -> bool:
    """``Context``, also as ``Context | None`` or ``Optional[Context]`` (or their text)."""
    if hint is Context:
        return True
    if isinstance(hint, str):
        text = hint.replace(" ", "").replace("ferryq.", "")
        return text in ("Context", "Context|None", "None|Context", "Optional[Context]")
    parts = typing.get_args(hint)
    return Context in parts and all(part in (Context, type(None)) for part in parts)
