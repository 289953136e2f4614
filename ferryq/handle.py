"""JobHandle: what enqueue returns, to follow one job."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ferryq.job import Job, State

if TYPE_CHECKING:
    from ferryq.app import App
    from ferryq.insights import Explanation


class JobHandle:
    """A reference to one job. ``created`` is False when dedup returned an existing job."""

    __slots__ = ("app", "created", "id")

    def __init__(self, app: App, job_id: int, created: bool = True) -> None:
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
