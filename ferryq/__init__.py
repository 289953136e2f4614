"""ferryq: durable background jobs in SQL, with ordered lanes and fair tenants."""

from ferryq import backoff
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
)
from ferryq.handle import JobHandle
from ferryq.hooks import Enqueue, Outcome
from ferryq.insights import Explanation
from ferryq.job import Job, State
from ferryq.outcome import Fail, Next, Retry, TimedOut
from ferryq.task import Task
from ferryq.worker import Worker

__version__ = "0.1.0"

__all__ = [
    "App",
    "ConfigurationError",
    "Context",
    "DatabaseReadOnly",
    "DiskFull",
    "Enqueue",
    "Explanation",
    "Fail",
    "FerryqError",
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
    "Worker",
    "backoff",
]
