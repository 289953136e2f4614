"""Every exception ferryq raises on purpose derives from :class:`FerryqError`.

::

    FerryqError
    ├── ConfigurationError      a URL, option or setting that cannot work
    ├── SerializationError      args, results or context that are not JSON
    ├── JobNotFound             no hot or historical job has that id
    ├── UnknownDependency       after= names no job of the namespace (a ValueError too)
    ├── InvalidTransition       the job's state does not allow the operation
    ├── StoreError              the database failed, or cannot be used as it is
    │   ├── DiskFull            the disk under the database is full
    │   └── DatabaseReadOnly    the database cannot be written here
    ├── JobFailed               handle.result() on a job that ended without success
    │   ├── JobDead
    │   ├── JobCancelled
    │   └── JobExpired
    └── ResultTimeout           handle.result(timeout=...) ran out of time

Invalid options raise :class:`ValueError` naming the option, as Python code expects.

Two more classes are control flow for handlers rather than errors: ``Retry`` and
``Fail`` (see :mod:`ferryq.outcome`).
"""

from __future__ import annotations

from typing import Any


class FerryqError(Exception):
    """Root of every ferryq error."""


class ConfigurationError(FerryqError):
    """A URL, option or setting that cannot work."""


class SerializationError(FerryqError):
    """A value that ferryq must store is not JSON-serialisable."""


class UnknownDependency(FerryqError, ValueError):
    """An enqueue's ``after`` names a job that does not exist in its namespace."""

    def __init__(self, job_id: int, namespace: str) -> None:
        super().__init__(f"after: no job {job_id} in namespace {namespace!r}")
        self.job_id = job_id


class JobNotFound(FerryqError, LookupError):
    """No job, hot or historical, has that id."""

    def __init__(self, job_id: int) -> None:
        super().__init__(f"no job with id {job_id}")
        self.job_id = job_id


class InvalidTransition(FerryqError):
    """The job's current state does not allow the requested operation."""


class StoreError(FerryqError):
    """The database failed, or cannot be used as it is: out of reach, closed, or a
    driver error, whose own exception is the ``__cause__``."""


class DiskFull(StoreError):
    """A write found the disk under the database full. Writes work again once space
    is freed; the store then takes back what its write-ahead log held."""


class DatabaseReadOnly(StoreError):
    """The database cannot be written here: the file, its folder or its file system
    is read-only to this process. Reading may still work."""


class JobFailed(FerryqError):
    """The job reached a terminal state other than ``succeeded``."""

    def __init__(self, job_id: int, state: str, error: Any) -> None:
        detail = ""
        if isinstance(error, dict) and error.get("message"):
            detail = f": {error['message']}"
        super().__init__(f"job {job_id} is {state}{detail}")
        self.job_id = job_id
        self.state = state
        self.error = error


class JobDead(JobFailed):
    """The job ran out of tries or failed permanently."""


class JobCancelled(JobFailed):
    """The job was cancelled."""


class JobExpired(JobFailed):
    """The job passed its ttl before it could run."""


class ResultTimeout(FerryqError, TimeoutError):
    """``result(timeout=...)`` ran out of time before the job finished."""
