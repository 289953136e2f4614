from __future__ import annotations

from django.db import models


class Order(models.Model):
    id: int  # Django's auto field (typed here for checkers without Django's plugin)
    item: models.CharField[str, str] = models.CharField(max_length=100)
    quantity: models.PositiveIntegerField[int, int] = models.PositiveIntegerField(default=1)
    # The ferryq job that mails the receipt.
    receipt_job: models.BigIntegerField[int | None, int | None] = models.BigIntegerField(null=True)
