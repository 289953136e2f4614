"""The ``django.tasks`` backend (the django-tasks backport before Django 6):
``TASKS = {"default": {"BACKEND": "ferryq.contrib.django.TasksBackend"}}``.

A ``@task`` function's ``enqueue()`` writes a ferryq job on the project's App, inside
Django's transaction when ``atomic()`` is open around it (as every enqueue of the
app: no gap between your commit and the job's); workers are ``manage.py ferryq
worker``. What maps (docs/django.md):

- ``queue_name``: the ferryq queue (any name, unless the backend's ``QUEUES`` lists
  them); ``priority`` (-100..100): ferryq's priority, higher first (in ferryq's unit,
  seconds ahead in the queue); ``run_after``: the job's due time.
- ``get_result(id)`` / ``refresh()``: the job (id: ferryq's job id as a string);
  ``status`` READY (scheduled, waiting, ready), RUNNING, SUCCESSFUL, FAILED (dead,
  cancelled, expired); ``return_value``; ``errors`` (each attempt's); ``worker_ids``
  (the last worker); ``attempts``.
- ``OPTIONS``: ``max_tries`` and ``ttr`` of every job (ferryq's defaults: 3, 60 s):
  failures retry with ferryq's backoff, which Django's API does not express.

Every job runs the same ferryq task, ``RUNNER`` (the Django task's path in its
arguments and in the job's meta), registered as the app starts: a worker needs only the
tasks' modules importable, not a registry of them. A task that ``takes_context`` gets a
``TaskContext`` whose ``task_result`` is its job's, as ``get_result`` reads it.
"""

from __future__ import annotations

import builtins
from datetime import UTC, datetime
from typing import Any, TypeVar

from django.utils.module_loading import import_string
from django_tasks.backends.base import BaseTaskBackend
from django_tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
from django_tasks.exceptions import TaskResultDoesNotExist
from django_tasks.signals import task_enqueued
from typing_extensions import ParamSpec

from ferryq import Context, Job, State
from ferryq.contrib.django import get_app
from ferryq.errors import JobNotFound

T = TypeVar("T")
P = ParamSpec("P")

#: The ferryq task that runs every django.tasks job.
RUNNER = "ferryq.contrib.django.run_task"
#: The job's meta key naming the Django task.
TASK_META = "django_task"

_STATUS = {
    State.SUCCEEDED: TaskResultStatus.SUCCESSFUL,
    State.RUNNING: TaskResultStatus.RUNNING,
    State.DEAD: TaskResultStatus.FAILED,
    State.CANCELLED: TaskResultStatus.FAILED,
    State.EXPIRED: TaskResultStatus.FAILED,
}


class TasksBackend(BaseTaskBackend):
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        if "QUEUES" not in params:
            self.queues = set()  # every queue name
        self.job_options = {
            key: self.options[key] for key in ("max_tries", "ttr") if key in self.options
        }

    def enqueue(
        self,
        task: Task[P, T],
        args: P.args,  # type: ignore[valid-type]
        kwargs: P.kwargs,  # type: ignore[valid-type]
    ) -> TaskResult[T]:
        self.validate_task(task)
        app = get_app()
        handle = app.enqueue(
            RUNNER,
            {"task": task.module_path, "args": list(args), "kwargs": dict(kwargs)},
            queue=task.queue_name,
            priority=float(task.priority),
            run_at=None if task.run_after is None else task.run_after.timestamp(),
            meta={TASK_META: task.module_path, "django_backend": self.alias},
            **self.job_options,
        )
        # Not read back: inside atomic() the job is in a transaction the App's own
        # connection cannot see (and, on SQLite, must not wait for).
        result: TaskResult[T] = TaskResult(
            task=task, id=str(handle.id), status=TaskResultStatus.READY,
            enqueued_at=_time(app.clock()), started_at=None, finished_at=None,
            last_attempted_at=None, args=list(args), kwargs=dict(kwargs),
            backend=self.alias, errors=[], worker_ids=[],
        )  # fmt: skip
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> TaskResult[Any]:
        try:
            job = get_app().get_job(int(result_id))
        except (ValueError, JobNotFound):
            raise TaskResultDoesNotExist(result_id) from None
        if job.task != RUNNER:
            raise TaskResultDoesNotExist(result_id)
        task = import_string(job.args["task"])
        return task_result(task, job, self.alias)


def task_result(task: Task[Any, T], job: Job, alias: str) -> TaskResult[T]:
    """Django's view of ``job``, a job of ``task`` enqueued through backend ``alias``."""
    status = _STATUS.get(job.state, TaskResultStatus.READY)
    result: TaskResult[T] = TaskResult(
        task=task,
        id=str(job.id),
        status=status,
        enqueued_at=_time(job.created_at),
        started_at=_time(job.started_at),
        finished_at=_time(job.finished_at) if job.terminal else None,
        last_attempted_at=_time(job.started_at),
        args=job.args["args"],
        kwargs=job.args["kwargs"],
        backend=alias,
        errors=[_error(error) for error in job.errors],
        worker_ids=[job.worker] * job.attempts if job.worker else [],
    )
    if status == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", job.result)
    return result


def _time(seconds: float | None) -> datetime | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC)


def _error(error: dict[str, Any]) -> TaskError:
    """ferryq keeps an exception's class name, not its module: a built-in exception's
    class is itself, any other is ``Exception``."""
    name = str(error.get("type") or "")
    builtin = isinstance(getattr(builtins, name, None), type)
    path = f"builtins.{name}" if builtin else "builtins.Exception"
    return TaskError(exception_class_path=path, traceback=str(error.get("traceback") or ""))


def run_task(ctx: Context, task: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """The handler of every django.tasks job: the Django task at ``task``, called."""
    found: Task[..., Any] = import_string(task)
    if found.takes_context:
        job = get_app().get_job(ctx.job_id)
        context = TaskContext(task_result=task_result(found, job, job.meta["django_backend"]))
        return found.call(context, *args, **kwargs)
    return found.call(*args, **kwargs)


def register() -> None:
    """Register ``RUNNER`` on the project's App (once)."""
    app = get_app()
    if RUNNER not in app.tasks:
        app.task(name=RUNNER)(run_task)
