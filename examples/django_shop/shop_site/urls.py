from __future__ import annotations

from django.contrib import admin
from django.urls import path

from examples.django_shop.shop import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("orders/", views.create_order, name="create-order"),
]
