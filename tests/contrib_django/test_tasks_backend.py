"""django.tasks on ferryq: ``@task`` functions enqueue ferryq jobs, run by a real
``manage.py ferryq worker``; ``get_result``, priority, ``run_after`` and queues as
Django documents them."""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta

from django.db import transaction
from django_tasks import task_backends
from django_tasks.base import TaskResultStatus

from examples.django_shop.shop.tasks import count_items
from ferryq.contrib.django import app as project_app
from ferryq.contrib.django.backend import RUNNER, TasksBackend
from tests.contrib_django.test_command import MANAGE
from tests.processes import WORKER_STARTED, Processes


def test_the_backend_is_ferryqs(shop_db: str) -> None:
    assert isinstance(task_backends["default"], TasksBackend)


def test_round_trip_through_a_manage_py_worker(shop_db: str, processes: Processes) -> None:
    result = count_items.enqueue([{"quantity": 2}, {"quantity": 3}])
    assert result.status == TaskResultStatus.READY
    job = project_app.get_job(int(result.id))
    assert (job.task, job.queue, job.priority) == (RUNNER, "reports", 10.0)
    worker = processes.start(
        [sys.executable, MANAGE, "ferryq", "worker", "--queues", "reports"],
        env={"SHOP_DATABASE_URL": shop_db}, clean_env=["FERRYQ_URL", "FERRYQ_APP"],
    )  # fmt: skip
    worker.wait_for(WORKER_STARTED)
    assert project_app.portal_call(project_app.result_async(int(result.id), timeout=60)) == 5
    result.refresh()
    assert result.return_value == 5  # raises unless SUCCESSFUL
    assert result.attempts == 1 and result.finished_at is not None
    again = count_items.get_result(result.id)
    assert (again.status, again.return_value, again.args) == (
        TaskResultStatus.SUCCESSFUL, 5, [[{"quantity": 2}, {"quantity": 3}]],
    )  # fmt: skip
    assert worker.stop() == 0


def test_run_after_and_another_queue(shop_db: str) -> None:
    later = datetime.now(UTC) + timedelta(hours=1)
    result = count_items.using(run_after=later, queue_name="slow", priority=-5).enqueue([])
    job = project_app.get_job(int(result.id))
    assert (job.state, job.queue, job.priority) == ("scheduled", "slow", -5.0)
    assert abs(job.run_at - later.timestamp()) < 1e-3


def test_enqueue_inside_atomic_joins_the_transaction(shop_db: str) -> None:
    with transaction.atomic():
        result = count_items.enqueue([])
        transaction.set_rollback(True)
    assert project_app.list_jobs(task=RUNNER) == []
    assert result.id  # the id of a job that never was
