"""A plain ferryq App (no Django) that knows the shop's receipt task by its name."""

from __future__ import annotations

import ferryq

app = ferryq.App()


@app.task(name="examples.django_shop.shop.tasks.send_receipt", queue="mail")
def send_receipt(order_id: int, item: str) -> str:
    return f"plain receipt for order {order_id}: {item}"
