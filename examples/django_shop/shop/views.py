"""POST /orders/ item=tea: the order and the job that mails its receipt, in one
transaction: both are there, or neither."""

from __future__ import annotations

from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from examples.django_shop.shop.models import Order
from examples.django_shop.shop.tasks import send_receipt


@csrf_exempt
@require_POST
def create_order(request: HttpRequest) -> JsonResponse:
    item = request.POST.get("item", "")
    if not item:
        return JsonResponse({"error": "item is required"}, status=400)
    with transaction.atomic():
        order = Order.objects.create(item=item)
        job = send_receipt.enqueue(order.id, item)  # written in this transaction
        order.receipt_job = job.id
        order.save(update_fields=["receipt_job"])
    return JsonResponse({"order": order.id, "job": job.id}, status=201)
