"""JobHandle: what enqueue returns, to follow one job."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ferryq.job import Job, State

if TYPE_CHECKING:
    from ferryq.insights import Explanation

T = TypeVar("T")


class HandleApp(Protocol):
    """What a JobHandle asks of the App that made it (``ferryq.App`` is one): typed so,
    the handle names what it uses and depends on nothing of ferryq/app.py, which
    imports it in turn (tests/unit/test_imports.py)."""

    def get_job(self, job_id: int) -> Job: ...

    async def get_job_async(self, job_id: int) -> Job: ...

    def portal_call(self, coro: Coroutine[Any, Any, T]) -> T: ...

    async def result_async(self, job_id: int, timeout: float | None = None) -> Any: ...

    def cancel(self, job_id: int) -> Job: ...

    async def cancel_async(self, job_id: int) -> Job: ...

    def explain(self, job_id: int) -> Explanation: ...

    async def explain_async(self, job_id: int) -> Explanation: ...


class JobHandle:
    """A reference to one job. ``created`` is False when dedup returned an existing job."""

    __slots__ = ("app", "created", "id")

    def __init__(self, app: HandleApp, job_id: int, created: bool = True) -> None:
        self.app = app
        self.id = job_id
        self.created = created

    def __repr__(self) -> str:
        return f"<JobHandle {self.id}{'' if self.created else ' (existing)'}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, JobHandle) and other.id == self.id and other.app is self.app

    def __hash__(self) -> int:
        return hash(self.id)

    def get(self) -> Job:
        return self.app.get_job(self.id)

    async def get_async(self) -> Job:
        return await self.app.get_job_async(self.id)

    def status(self) -> State:
        return self.get().state

    async def status_async(self) -> State:
        return (await self.get_async()).state

    def result(self, timeout: float | None = None) -> Any:
        """Wait for the job's result; raise :class:`ferryq.JobFailed` if it did not succeed."""
        return self.app.portal_call(self.app.result_async(self.id, timeout))

    async def result_async(self, timeout: float | None = None) -> Any:
        return await self.app.result_async(self.id, timeout)

    def cancel(self) -> Job:
        return self.app.cancel(self.id)

    async def cancel_async(self) -> Job:
        return await self.app.cancel_async(self.id)

    def explain(self) -> Explanation:
        return self.app.explain(self.id)

    async def explain_async(self) -> Explanation:
        return await self.app.explain_async(self.id)
