from __future__ import annotations

from django.apps import AppConfig


class ShopConfig(AppConfig):
    name = "examples.django_shop.shop"
    label = "shop"
    default_auto_field = "django.db.models.BigAutoField"
