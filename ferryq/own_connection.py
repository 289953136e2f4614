"""The application's own connection, as ferryq writes on it (``task.using(conn)``).

A framework hands out its own wrapper of the driver's connection; ``driver_connection``
turns one into the connection of the driver that the store writes on (a sqlite3,
psycopg 3 or asyncpg connection), after checking that it can be written on in a
transaction. Anything else comes back as it is, for the store to check.

Known wrappers, recognised by their class's module (their packages are not imported
here): Django's connection (``django.db.connection``, ``connections[alias]``), inside
``transaction.atomic()``.
"""

from __future__ import annotations

from typing import Any

from ferryq.errors import ConfigurationError


def driver_connection(connection: object) -> object:
    """The driver's connection under ``connection`` (itself if none is known)."""
    if _is_django(connection):
        return _django_driver_connection(connection)
    return connection


def _is_django(connection: object) -> bool:
    """Django's wrapper, or ``django.db.connection``, the proxy that stands for it."""
    module = type(connection).__module__
    return module == "django.utils.connection" or module.startswith(
        ("django.db.backends.", "django.contrib.gis.db.backends.")
    )


def _django_driver_connection(connection: Any) -> object:
    """Under Django's wrapper, its driver's connection: only inside ``atomic()``, where
    Django has a transaction open (outside, every statement would commit at once)."""
    if not connection.in_atomic_block:
        raise ConfigurationError(
            f"Django's connection {connection.alias!r} has no transaction open: enqueue on "
            "it inside transaction.atomic(), or without it to commit at once"
        )
    connection.validate_no_broken_transaction()  # an error earlier in the block
    connection.ensure_connection()
    return connection.connection
