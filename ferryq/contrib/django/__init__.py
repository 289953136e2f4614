"""ferryq in a Django project (docs/django.md): ``"ferryq.contrib.django"`` in
``INSTALLED_APPS``, ``FERRYQ = {...}`` in the settings (``ferryq.contrib.django.conf``).

``app`` is the project's ferryq App, made on first use from the settings; register
tasks on it in an app's ``tasks.py`` (found at start-up, as the admin finds
``admin.py``)::

    from ferryq.contrib.django import app

    @app.task(queue="mail")
    def send_receipt(order_id: int) -> None: ...

Inside ``transaction.atomic()`` on ferryq's database an enqueue is written by Django's
connection, in its transaction (``ambient_connection``); outside, it commits at once.
``TasksBackend`` is the backend of ``django.tasks`` (``ferryq.contrib.django.backend``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from ferryq.app import App
from ferryq.clock import ServerClock
from ferryq.errors import ConfigurationError
from ferryq.policy import JobOptions

log = logging.getLogger("ferryq.django")
_made: App | None = None
# Reentrant: django.setup() in get_app() imports tasks.py, which calls get_app().
_lock = threading.RLock()


def get_app() -> App:
    """The project's App, made from the settings on first use. Django is set up first
    if it is not yet (a worker started by plain ``ferryq`` with DJANGO_SETTINGS_MODULE):
    its apps' ``tasks.py``, imported then, ask for the App in turn, and make it."""
    global _made
    with _lock:
        if _made is None:
            from django.apps import apps

            if not apps.ready and not apps.loading:
                import django

                django.setup()
        if _made is None:
            made = App()
            _configure(made)
            _made = made
        return _made


def reload_settings() -> None:
    """Read ``FERRYQ`` and ``DATABASES`` again into the App, its connections closed
    first: for tests that change them. Its tasks stay registered."""
    with _lock:
        if _made is not None:
            _made.close()
            _configure(_made)


def _configure(made: App) -> None:
    from ferryq.contrib.django.conf import ferryq_settings

    config = ferryq_settings()
    made.url, made.direct_url = config.url, config.direct_url
    JobOptions(namespace=config.namespace).validate()
    made.namespace = config.namespace
    made.clock = ServerClock() if made.url.startswith(("postgresql:", "postgres:")) else time.time
    made.ambient_connection = None
    if config.joins_transactions:
        made.ambient_connection = lambda: ambient_connection(config.database)
    else:
        log.warning(
            "FERRYQ['URL'] reaches another database than DATABASES[%r]: enqueues commit "
            "on ferryq's own connection at once, never in Django's transactions",
            config.database,
        )


def ambient_connection(alias: str) -> object | None:
    """Django's connection ``alias`` when this thread is inside ``atomic()`` on it, for
    the enqueue to be written in that transaction; else None (commit at once).

    Django's connections are for sync code: in an event loop, inside ``atomic()``
    (possible only with DJANGO_ALLOW_ASYNC_UNSAFE), the enqueue is refused rather than
    written outside the transaction around it."""
    from django.db import connections

    connection = connections[alias]
    if not connection.in_atomic_block:
        return None
    if _in_event_loop():
        raise ConfigurationError(
            "enqueue_async inside Django's atomic(): Django's connection is for sync "
            "code; call enqueue() there (from sync_to_async)"
        )
    return connection


def _in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def __getattr__(name: str) -> Any:
    if name == "app":
        return get_app()
    if name == "TasksBackend":  # imports django_tasks: only for a project that uses it
        from ferryq.contrib.django.backend import TasksBackend

        return TasksBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if TYPE_CHECKING:
    app: App

__all__ = ["ambient_connection", "app", "get_app", "reload_settings"]
