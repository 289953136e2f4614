"""The shop's jobs, found by ferryq.contrib.django as the project starts."""

from __future__ import annotations

from django_tasks import task

from ferryq.contrib.django import app


@app.task(queue="mail", max_tries=5)
def send_receipt(order_id: int, item: str) -> str:
    """Mail the receipt of an order (here: say what would be mailed)."""
    return f"receipt for order {order_id}: {item}"


@task(queue_name="reports", priority=10)
def count_items(orders: list[dict[str, int]]) -> int:
    """A django.tasks task: run by ferryq's workers through TasksBackend."""
    return sum(order["quantity"] for order in orders)
