"""The shop's settings: one database for the shop's rows and ferryq's jobs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

HERE = Path(__file__).resolve().parents[1]


def database(url: str) -> dict[str, Any]:
    """Django's DATABASES entry for ``url`` (sqlite:///path or postgresql://…)."""
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": parts.path[1:] or "shop.db",
                "OPTIONS": {"transaction_mode": "IMMEDIATE"}}  # fmt: skip
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")),
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
    }


SECRET_KEY = os.environ.get("SHOP_SECRET_KEY", "an example's key, not a secret")
DEBUG = os.environ.get("SHOP_DEBUG", "1") == "1"
ALLOWED_HOSTS = ["localhost", "127.0.0.1", "testserver"]
USE_TZ = True
ROOT_URLCONF = "examples.django_shop.shop_site.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
DATABASES = {"default": database(os.environ.get("SHOP_DATABASE_URL", f"sqlite:///{HERE}/shop.db"))}

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "ferryq.contrib.django",
    "examples.django_shop.shop",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
# django.tasks (the django-tasks backport on Django 5.2): @task functions run on ferryq.
TASKS = {"default": {"BACKEND": "ferryq.contrib.django.TasksBackend"}}
FERRYQ = {"NAMESPACE": os.environ.get("SHOP_NAMESPACE", "default")}
