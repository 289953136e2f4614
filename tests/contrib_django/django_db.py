"""Pointing the tests' Django process at a database of a test's own."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from asgiref.local import Local

from examples.django_shop.shop_site import settings as shop_settings
from examples.django_shop.shop_site.settings import database


def set_up_django() -> None:
    """Django configured with the shop's settings and set up, once in this process."""
    import django
    from django.conf import settings

    if not settings.configured:
        settings.configure(**{name: getattr(shop_settings, name) for name in dir(shop_settings)
                              if name.isupper()})  # fmt: skip
        django.setup()


def reset_connections() -> None:
    """Close Django's connections and have it read DATABASES again."""
    from django.db import connections

    connections.close_all()
    connections._settings = None  # type: ignore[attr-defined]
    connections.__dict__.pop("settings", None)  # its cached_property
    connections._connections = Local(connections.thread_critical)  # type: ignore[attr-defined]


@contextlib.contextmanager
def use_database(url: str) -> Iterator[None]:
    """Django's ``default`` database, and so ferryq's App, on ``url`` until the end."""
    from django.conf import settings

    from ferryq.contrib.django import reload_settings

    kept = settings.DATABASES
    settings.DATABASES = {"default": database(url)}
    reset_connections()
    reload_settings()
    try:
        yield
    finally:
        settings.DATABASES = kept
        reset_connections()
        reload_settings()
