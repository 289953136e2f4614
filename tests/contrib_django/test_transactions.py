"""An enqueue inside ``transaction.atomic()`` is written by Django's connection, in its
transaction, on PostgreSQL and on SQLite: committed, the job runs; rolled back (by
hand, by an exception, by a savepoint's rollback), it is gone with the rows.
Outside ``atomic()`` it commits at once, on ferryq's own connection."""

from __future__ import annotations

import contextlib
import sqlite3

import psycopg
import pytest
from django.db import connection, transaction

from examples.django_shop.shop.models import Order
from examples.django_shop.shop.tasks import send_receipt
from ferryq import App, State
from ferryq.contrib.django import app as project_app
from ferryq.errors import ConfigurationError


class Refused(Exception):
    pass


def jobs_of(url: str) -> list[tuple[int, State, object]]:
    """The jobs of ``send_receipt``, read by an App of its own (not Django's)."""
    reader = App(url, read_only=True)
    try:
        return [(job.id, job.state, job.args) for job in reader.list_jobs(task=send_receipt.name)]
    finally:
        reader.close()


def visible_job_ids(url: str) -> list[int]:
    """The ids of the jobs another connection sees, read by SQL: an App would wait for
    the write lock of SQLite that the open transaction holds."""
    query = "SELECT id FROM ferryq_jobs ORDER BY id"
    if url.startswith("sqlite:"):
        with contextlib.closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as conn:
            return [row[0] for row in conn.execute(query)]
    with psycopg.connect(url) as pg:
        return [row[0] for row in pg.execute(query)]


def run_jobs() -> None:
    project_app.run_worker(burst=True, queues=["mail"])


def test_committed_the_job_runs(shop_db: str) -> None:
    with transaction.atomic():
        order = Order.objects.create(item="tea")
        handle = send_receipt.enqueue(order.id, "tea")
        assert connection.in_atomic_block
    run_jobs()
    assert project_app.get_job(handle.id).state == State.SUCCEEDED
    assert handle.result(timeout=0) == f"receipt for order {order.id}: tea"


def test_the_job_is_written_in_the_transaction(shop_db: str) -> None:
    """Inside the transaction another connection does not see the job yet."""
    with transaction.atomic():
        handle = send_receipt.enqueue(1, "tea")
        assert visible_job_ids(shop_db) == []
    assert visible_job_ids(shop_db) == [handle.id]


def test_rolled_back_no_job(shop_db: str) -> None:
    with transaction.atomic():
        Order.objects.create(item="tea")
        send_receipt.enqueue(1, "tea")
        transaction.set_rollback(True)
    assert jobs_of(shop_db) == []
    assert Order.objects.count() == 0


def test_an_exception_inside_atomic_no_job(shop_db: str) -> None:
    with pytest.raises(Refused), transaction.atomic():
        Order.objects.create(item="tea")
        send_receipt.enqueue(1, "tea")
        raise Refused
    assert jobs_of(shop_db) == []
    assert Order.objects.count() == 0


def test_a_savepoint_rolled_back_takes_its_job_the_outer_one_stays(shop_db: str) -> None:
    with transaction.atomic():
        outer = send_receipt.enqueue(1, "outer")
        with pytest.raises(Refused), transaction.atomic():
            send_receipt.enqueue(2, "inner")
            raise Refused
        kept = send_receipt.enqueue(3, "after")
    assert [(job_id, args) for job_id, _, args in jobs_of(shop_db)] == [
        (kept.id, [3, "after"]),
        (outer.id, [1, "outer"]),
    ] or sorted(job_id for job_id, _, _ in jobs_of(shop_db)) == sorted([outer.id, kept.id])
    run_jobs()
    assert {state for _, state, _ in jobs_of(shop_db)} == {State.SUCCEEDED}


def test_outside_atomic_it_commits_at_once(shop_db: str) -> None:
    assert not connection.in_atomic_block
    handle = send_receipt.enqueue(1, "tea")
    assert [job_id for job_id, _, _ in jobs_of(shop_db)] == [handle.id]


def test_enqueue_many_and_by_name_join_too(shop_db: str) -> None:
    with transaction.atomic():
        send_receipt.enqueue_many([(1, "a"), (2, "b")])
        project_app.enqueue(send_receipt.name, [3, "c"])
        transaction.set_rollback(True)
    assert jobs_of(shop_db) == []


def test_using_django_connection_outside_atomic_is_refused(shop_db: str) -> None:
    with pytest.raises(ConfigurationError, match="no transaction open"):
        send_receipt.using(connection).enqueue(1, "tea")
    assert jobs_of(shop_db) == []


def test_using_django_connection_inside_atomic(shop_db: str) -> None:
    with transaction.atomic():
        send_receipt.using(connection).enqueue(1, "tea")
        transaction.set_rollback(True)
    assert jobs_of(shop_db) == []


async def test_enqueue_async_outside_atomic_commits_at_once(shop_db: str) -> None:
    handle = await send_receipt.enqueue_async(1, "tea")
    await project_app.aclose()
    assert [job_id for job_id, _, _ in jobs_of(shop_db)] == [handle.id]


async def test_enqueue_async_inside_atomic_is_refused(shop_db: str) -> None:
    """Django's connection is for sync code: in an event loop, inside atomic() (only
    with DJANGO_ALLOW_ASYNC_UNSAFE), the enqueue is refused, not written outside it."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "1")
        try:
            with transaction.atomic():
                with pytest.raises(ConfigurationError, match="sync code"):
                    await send_receipt.enqueue_async(1, "tea")
                transaction.set_rollback(True)
        finally:
            connection.close()  # this task's own, which the test's end would not close
    assert jobs_of(shop_db) == []


def test_the_shops_view_creates_the_order_and_its_job(shop_db: str) -> None:
    from django.test import Client

    response = Client().post("/orders/", {"item": "tea"})
    assert response.status_code == 201
    created = response.json()
    assert Order.objects.get(id=created["order"]).receipt_job == created["job"]
    run_jobs()
    receipt = project_app.get_job(created["job"]).result
    assert receipt == f"receipt for order {created['order']}: tea"
