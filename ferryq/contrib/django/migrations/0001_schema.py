"""ferryq's tables (ferryq.contrib.django.schema)."""

from __future__ import annotations

from django.db import migrations

from ferryq.contrib.django.schema import keep_schema, migrate_schema


class Migration(migrations.Migration):
    # Not in a transaction of Django's: ferryq's migrations run on a connection of
    # their own, which a transaction holding SQLite's file would block.
    atomic = False
    initial = True
    operations = [migrations.RunPython(migrate_schema, keep_schema, elidable=False)]
