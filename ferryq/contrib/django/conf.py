"""ferryq's Django settings: ``FERRYQ = {...}`` in the project's settings.

Every key is optional:

- ``DATABASE``: the alias in ``DATABASES`` whose database holds the jobs (``"default"``);
  its transactions are the ones enqueues join.
- ``URL``: ferryq's database URL; by default the one of that alias, PostgreSQL's built
  from NAME, USER, PASSWORD, HOST and PORT (and ``OPTIONS["sslmode"]``), SQLite's from
  NAME. A URL to another database works, but enqueues then never join Django's
  transactions (they would be in another database).
- ``NAMESPACE``: the App's namespace (``"default"``).
- ``DIRECT_URL``: PostgreSQL behind a pooler, the same database reached directly.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

from django.conf import settings
from django.db import connections

from ferryq.errors import ConfigurationError

#: Connection options of Django's PostgreSQL backend that a libpq URL takes as they are.
PASSED_OPTIONS = ("sslmode", "sslrootcert", "sslcert", "sslkey", "application_name")


@dataclass(frozen=True)
class FerryqSettings:
    database: str
    url: str
    namespace: str
    direct_url: str | None

    @property
    def joins_transactions(self) -> bool:
        """Whether enqueues join the transactions of Django's ``database``: ferryq's URL
        reaches the same database as the alias's, as the same user; ferryq's own
        parameters (``pooler=``, ``connections=``) and the rest of the query aside."""
        return same_database(self.url, url_of_database(self.database))


def same_database(one: str, other: str) -> bool:
    """Whether two URLs name the same database, user, host and port (the host of a Unix
    socket in the query, as libpq takes it)."""
    return _where(one) == _where(other)


def _where(url: str) -> tuple[str, ...]:
    parts = urlsplit(url.replace("postgres://", "postgresql://", 1))
    if parts.scheme.startswith("sqlite"):
        return ("sqlite", os.path.abspath(unquote(parts.path.removeprefix("/"))))
    host = parts.hostname or dict(parse_qsl(parts.query)).get("host", "")
    return (parts.scheme, parts.username or "", host, str(parts.port or 5432), parts.path)


def ferryq_settings() -> FerryqSettings:
    given: dict[str, Any] = dict(getattr(settings, "FERRYQ", None) or {})
    unknown = set(given) - {"DATABASE", "URL", "NAMESPACE", "DIRECT_URL"}
    if unknown:
        raise ConfigurationError(f"FERRYQ has unknown keys: {', '.join(sorted(unknown))}")
    database = str(given.get("DATABASE", "default"))
    if database not in settings.DATABASES:
        raise ConfigurationError(f"FERRYQ['DATABASE'] is {database!r}, not in DATABASES")
    return FerryqSettings(
        database=database,
        url=str(given.get("URL") or url_of_database(database)),
        namespace=str(given.get("NAMESPACE", "default")),
        direct_url=given.get("DIRECT_URL"),
    )


def url_of_database(alias: str) -> str:
    """ferryq's URL for the database Django reaches as ``alias``."""
    wrapper = connections[alias]
    params: dict[str, Any] = wrapper.settings_dict
    if wrapper.vendor == "postgresql":
        return postgres_url(params)
    if wrapper.vendor == "sqlite":
        return sqlite_url(params)
    raise ConfigurationError(
        f"DATABASES[{alias!r}] is {wrapper.vendor}: ferryq runs on PostgreSQL and SQLite"
    )


def postgres_url(params: dict[str, Any]) -> str:
    options: dict[str, Any] = params.get("OPTIONS") or {}
    if "service" in options:
        raise ConfigurationError(
            "DATABASES uses a pg_service.conf service: set FERRYQ['URL'] to the database's URL"
        )
    user = quote(str(params.get("USER") or ""), safe="")
    password = quote(str(params.get("PASSWORD") or ""), safe="")
    host = str(params.get("HOST") or "")
    port = str(params.get("PORT") or "")
    query = {name: str(options[name]) for name in PASSED_OPTIONS if name in options}
    if host.startswith("/"):  # a Unix socket's folder
        query["host"] = host
        host = ""
    credentials = f"{user}:{password}@" if password else f"{user}@" if user else ""
    netloc = f"{credentials}{host}{f':{port}' if port else ''}"
    name = quote(str(params.get("NAME") or ""), safe="")
    return f"postgresql://{netloc}/{name}{f'?{urlencode(query)}' if query else ''}"


def sqlite_url(params: dict[str, Any]) -> str:
    name = str(params.get("NAME") or "")
    if not name or name == ":memory:" or name.startswith("file:"):
        raise ConfigurationError(
            f"ferryq needs a SQLite file its workers can open, not {name or 'no NAME'!r}"
        )
    return f"sqlite:///{os.path.abspath(name)}"
