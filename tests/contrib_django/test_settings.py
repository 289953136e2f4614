"""FERRYQ's URL from Django's DATABASES, and the schema through ``manage.py migrate``
in a new project and in existing ones."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.core.management import call_command

from examples.django_shop.shop.tasks import send_receipt
from ferryq import App
from ferryq.contrib.django import app as project_app
from ferryq.contrib.django.conf import postgres_url, same_database, sqlite_url
from ferryq.errors import ConfigurationError
from tests.contrib_django.django_db import use_database


def test_postgres_url_from_the_fields() -> None:
    fields = {"NAME": "shop", "USER": "web", "PASSWORD": "p@ss/word", "HOST": "db.internal",
              "PORT": 6432, "OPTIONS": {"sslmode": "require", "connect_timeout": 3}}  # fmt: skip
    assert (
        postgres_url(fields)
        == "postgresql://web:p%40ss%2Fword@db.internal:6432/shop?sslmode=require"
    )


def test_postgres_url_on_a_socket_and_without_credentials() -> None:
    assert postgres_url({"NAME": "shop", "HOST": "/run/postgresql"}) == (
        "postgresql:///shop?host=%2Frun%2Fpostgresql"
    )
    assert postgres_url({"NAME": "shop", "USER": "web"}) == "postgresql://web@/shop"


def test_ferryqs_own_parameters_leave_the_database_the_same() -> None:
    """FERRYQ['URL'] behind PgBouncer says pooler= and connections=: Django's alias is
    still the same database, whose transactions enqueues join."""
    django = "postgresql://shop@pgbouncer:6432/shop?sslmode=require"
    assert same_database(f"{django}&pooler=transaction&connections=3", django)
    assert same_database("postgres://shop@pgbouncer:6432/shop", django)
    assert not same_database("postgresql://shop@pgbouncer:6432/other", django)
    assert not same_database("postgresql://admin@pgbouncer:6432/shop", django)
    assert not same_database("postgresql://shop@db:5432/shop", django)
    assert same_database("sqlite:////data/shop.db?synchronous=full", "sqlite:////data/shop.db")
    assert not same_database("sqlite:////data/other.db", "sqlite:////data/shop.db")


def test_sqlite_url_is_the_absolute_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert sqlite_url({"NAME": "shop.db"}) == f"sqlite:///{tmp_path}/shop.db"
    with pytest.raises(ConfigurationError, match="SQLite file"):
        sqlite_url({"NAME": ":memory:"})


def test_the_app_takes_the_default_database(shop_db: str) -> None:
    assert project_app.url == shop_db
    assert project_app.ambient_connection is not None


def test_an_existing_project_adds_ferryq(django_url: str) -> None:
    """A database with the project's tables, not ferryq's: ``migrate`` adds them."""
    with use_database(django_url):
        call_command("migrate", "shop", verbosity=0)
        call_command("migrate", "ferryq", "zero", "--fake", verbosity=0)
        call_command("migrate", verbosity=0)
        assert send_receipt.enqueue(1, "tea").id > 0


def test_a_database_with_ferryq_tables_already(pg_url: str) -> None:
    """A project that used plain ferryq on its database before adding the app."""
    with use_database(pg_url):
        call_command("migrate", verbosity=0)
        handle = send_receipt.enqueue(1, "tea")
    reader = App(pg_url)
    try:
        assert reader.get_job(handle.id).task == send_receipt.name
    finally:
        reader.close()


@pytest.fixture(params=["sqlite", "postgres"])
def django_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/existing.db"
    return str(request.getfixturevalue("pg_empty_url"))
