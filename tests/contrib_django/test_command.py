"""``manage.py ferryq ...`` as real processes, and workers of either kind running the
jobs of the other: one started through Django runs jobs a plain App enqueued, and a
plain ``ferryq worker`` runs jobs enqueued inside Django's transaction."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.core.management import CommandError, call_command
from django.db import transaction

from examples.django_shop.shop.tasks import send_receipt
from ferryq import App
from tests.processes import ROOT, WORKER_STARTED, Processes

MANAGE = str(ROOT / "examples" / "django_shop" / "manage.py")


def manage(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, MANAGE, *args], cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**_environ(), "SHOP_DATABASE_URL": url},
    )  # fmt: skip


def _environ() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("FERRYQ_URL", "FERRYQ_APP")}


def test_a_django_worker_runs_jobs_a_plain_app_enqueued(shop_db: str, processes: Processes) -> None:
    worker = processes.start(
        [sys.executable, MANAGE, "ferryq", "worker", "--queues", "mail"],
        env={"SHOP_DATABASE_URL": shop_db}, clean_env=["FERRYQ_URL", "FERRYQ_APP"],
    )  # fmt: skip
    worker.wait_for(WORKER_STARTED)
    plain = App(shop_db)
    try:
        handle = plain.enqueue(send_receipt.name, [7, "tea"], queue="mail")
        assert handle.result(timeout=60) == "receipt for order 7: tea"
    finally:
        plain.close()
    assert worker.stop() == 0


def test_a_plain_worker_runs_jobs_enqueued_in_a_django_transaction(
    shop_db: str, processes: Processes
) -> None:
    with transaction.atomic():
        handle = send_receipt.enqueue(8, "cake")
    worker = processes.start(
        [sys.executable, "-m", "ferryq", "--url", shop_db, "worker",
         "tests.contrib_django.plain_tasks:app", "--queues", "mail"],
        clean_env=["FERRYQ_URL", "FERRYQ_APP", "DJANGO_SETTINGS_MODULE"],
    )  # fmt: skip
    worker.wait_for(WORKER_STARTED)
    assert handle.result(timeout=60) == "plain receipt for order 8: cake"
    assert worker.stop() == 0


def test_manage_py_ferryq_commands(shop_db: str) -> None:
    enqueued = manage(shop_db, "ferryq", "enqueue", send_receipt.name, '[1, "tea"]')
    assert enqueued.returncode == 0, enqueued.stderr
    listed = manage(shop_db, "ferryq", "jobs", "ls", "--json")
    assert listed.returncode == 0, listed.stderr
    assert send_receipt.name in listed.stdout
    assert '"mail"' in listed.stdout  # the task's queue: --app came from the project
    helped = manage(shop_db, "ferryq", "--help")
    assert "manage.py ferryq" in helped.stdout and "worker" in helped.stdout


def test_call_command_returns_or_raises_and_leaves_the_environment(shop_db: str) -> None:
    before = dict(os.environ)
    call_command("ferryq", "stats")
    with pytest.raises(CommandError, match="exited with"):
        call_command("ferryq", "jobs", "show", "999999999")
    assert dict(os.environ) == before
