"""The shop's background jobs; the worker runs ``ferryq worker
examples.fastapi_sqlalchemy.jobs:queue``."""

from __future__ import annotations

import functools

from sqlalchemy import Engine
from sqlalchemy.orm import Session

import ferryq
from examples.fastapi_sqlalchemy.db import URL, Order, sync_engine

queue = ferryq.App(URL)


@functools.cache
def _engine() -> Engine:
    return sync_engine()


@queue.task(max_tries=3)
def send_receipt(order_id: int) -> str:
    """Send the order's receipt (here: mark it sent). The job runs only once the
    order's transaction committed, so the order is always there to read."""
    with Session(_engine()) as session, session.begin():
        order = session.get_one(Order, order_id)
        order.receipt_sent = True
        return f"receipt for {order.quantity} x {order.item}"
