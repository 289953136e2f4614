"""ferryq: durable background jobs in SQL, with ordered lanes and fair tenants."""

from typing import TYPE_CHECKING

from ferryq import backoff
from ferryq._version import __version__ as __version__
from ferryq.app import App
from ferryq.context import Context
from ferryq.errors import (
    ConfigurationError,
    DatabaseReadOnly,
    DiskFull,
    FerryqError,
    InvalidTransition,
    JobCancelled,
    JobDead,
    JobExpired,
    JobFailed,
    JobNotFound,
    ResultTimeout,
    SerializationError,
    StoreError,
    UnknownDependency,
)
from ferryq.group import Group, group
from ferryq.handle import JobHandle
from ferryq.hooks import Enqueue, Outcome
from ferryq.insights import Explanation
from ferryq.job import Job, State
from ferryq.outcome import DependencyFailed, Fail, Next, Retry, TimedOut
from ferryq.task import Task

if TYPE_CHECKING:
    from ferryq.worker import Worker

__all__ = [
    "App",
    "ConfigurationError",
    "Context",
    "DatabaseReadOnly",
    "DependencyFailed",
    "DiskFull",
    "Enqueue",
    "Explanation",
    "Fail",
    "FerryqError",
    "Group",
    "InvalidTransition",
    "Job",
    "JobCancelled",
    "JobDead",
    "JobExpired",
    "JobFailed",
    "JobHandle",
    "JobNotFound",
    "Next",
    "Outcome",
    "ResultTimeout",
    "Retry",
    "SerializationError",
    "State",
    "StoreError",
    "Task",
    "TimedOut",
    "UnknownDependency",
    "Worker",
    "backoff",
    "group",
]


# The worker is imported on first use (``ferryq.Worker``, ``from ferryq import Worker``,
# ``App.run_worker``): a program that only enqueues or reads jobs, the command line
# among them, does without it.
if not TYPE_CHECKING:

    def __getattr__(name: str) -> object:
        if name == "Worker":
            from ferryq.worker import Worker

            globals()["Worker"] = Worker
            return Worker
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted({*globals(), *__all__})
