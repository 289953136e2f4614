"""What a worker uses of its App: ``WorkerApp``, which ``ferryq.App`` is.

The worker's modules are typed against this Protocol rather than against App, so
that they name the few members they use and depend on nothing of ferryq/app.py,
which imports them in turn (a circle in the types, tests/unit/test_imports.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ferryq.handle import JobHandle
    from ferryq.hooks import Hooks
    from ferryq.periodic import Periodic
    from ferryq.policy import JobOptions
    from ferryq.store.base import Store
    from ferryq.task import Task


class WorkerApp(Protocol):
    """The App a Worker runs the tasks of: its database, namespace and clock, its
    tasks and periodic schedules, its attempt hooks; and an enqueue, for the ticks of
    periodic tasks."""

    @property
    def url(self) -> str: ...

    @property
    def namespace(self) -> str: ...

    @property
    def clock(self) -> Callable[[], float]: ...

    @property
    def tasks(self) -> Mapping[str, Task[Any, Any]]: ...

    @property
    def schedules(self) -> Mapping[str, Periodic]: ...

    @property
    def hooks(self) -> Hooks: ...

    async def store(self) -> Store: ...

    async def enqueue_raw(
        self,
        task: str,
        encoded_args: Sequence[str],
        options: JobOptions,
        connection: object | None = None,
        payload_limit: int | None = None,
    ) -> list[JobHandle]: ...
