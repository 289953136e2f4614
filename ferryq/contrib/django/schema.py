"""ferryq's tables in Django's database, through ``manage.py migrate``.

The Django migrations of this app run ferryq's own migrations (numbered SQL files, a
version table of their own: the same as ``ferryq migrate``) on ferryq's database,
when ``migrate`` runs on that alias. They are idempotent: a database whose ferryq
tables exist already (a project that used ferryq before adding the app) gets only the
versions it lacks. A ferryq release whose schema changes brings a Django migration
that runs them again; workers also migrate the schema as they start.
"""

from __future__ import annotations

from typing import Any

from ferryq.contrib.django import get_app, reload_settings
from ferryq.contrib.django.conf import ferryq_settings


def migrate_schema(apps: Any, schema_editor: Any) -> None:
    """A ``RunPython`` step: ferryq's migrations, on ferryq's own connection. The App
    is made again first if its database is no longer the one Django migrates: the test
    runner renames each database (``test_…``, SQLite in memory or a file of its own)
    after the App was made from the settings, and migrates the new one; from then on
    the App writes there too."""
    config = ferryq_settings()
    if schema_editor.connection.alias != config.database:
        return
    app = get_app()
    if app.url != config.url:
        reload_settings()
    app.migrate()


def keep_schema(apps: Any, schema_editor: Any) -> None:
    """Migrating the app back leaves ferryq's tables and jobs where they are: drop them
    by hand if they are to go."""
