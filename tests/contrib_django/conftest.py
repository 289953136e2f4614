"""Django in the tests' own process: the example shop's project (examples/django_shop),
set up as this folder is collected (its test modules import the shop's models), with
no DJANGO_SETTINGS_MODULE left in the environment of other tests' processes; pointed
at each test's database by ``shop_db``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.management import call_command

from tests.contrib_django.django_db import set_up_django, use_database

set_up_django()


@pytest.fixture(params=["sqlite", "postgres"])
def shop_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh database of each backend, empty: a new project's."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/shop.db"
    return str(request.getfixturevalue("pg_empty_url"))


@pytest.fixture
def shop_db(shop_url: str) -> Iterator[str]:
    """Django and ferryq on ``shop_url``, migrated by ``manage.py migrate``."""
    with use_database(shop_url):
        call_command("migrate", verbosity=0)
        yield shop_url
