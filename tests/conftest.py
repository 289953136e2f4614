"""Shared fixtures: a frozen clock, and a store/app per backend.

Every backend-neutral test takes ``backend_url``; adding a backend means adding a
parameter here, not rewriting tests. ``pg_cluster``, ``pg_url`` and ``pg_empty_url``
(tests/pg.py) give tests a throwaway PostgreSQL and a fresh database on it, migrated or
empty; ``pgbouncer`` and ``pgbouncer_url`` (tests/pgbouncer.py) a PgBouncer in
transaction mode in front of it, and a fresh database through that.

Hypothesis runs under one of three profiles (``HYPOTHESIS_PROFILE``): ``full`` (the
default, and ``make test``), ``check`` (``make check``, the quick tier: a fifth of the
examples) and ``thorough`` (ten times the default: a long search, by hand). None has a
deadline: a busy machine makes any example slow now and then. A test that asks for its
own number of examples scales it with ``examples()``.
"""

from __future__ import annotations

import gc
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

import ferryq
from ferryq.store import Store, open_store
from tests.pg import pg_cluster, pg_empty_url, pg_url  # noqa: F401  (fixtures)
from tests.pgbouncer import pgbouncer, pgbouncer_url  # noqa: F401  (fixtures)
from tests.processes import Processes

BACKENDS = ["sqlite", "postgres"]
#: PostgreSQL as a store behind a transaction pooler sees it (``?pooler=transaction``):
#: every statement in a transaction of its own, leadership by lease, waits that poll.
#: The conformance suite runs on it as a third backend (tests/conformance/conftest.py);
#: against the plain server, since the mode's code must work there too.
POOLED = "postgres-pooled"
#: The same with a direct URL to the database, for LISTEN.
POOLED_DIRECT = f"{POOLED}-direct"
POSTGRES_BACKENDS = {"postgres", POOLED, POOLED_DIRECT}
START = 1_800_000_000.0

FULL_EXAMPLES = 100  # hypothesis's own default
settings.register_profile("full", max_examples=FULL_EXAMPLES, deadline=None)
settings.register_profile("check", max_examples=FULL_EXAMPLES // 5, deadline=None)
settings.register_profile("thorough", max_examples=FULL_EXAMPLES * 10, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "full"))


def examples(full: int) -> int:
    """``full`` examples under the full profile, as many fewer under a lighter one."""
    return max(1, full * settings().max_examples // FULL_EXAMPLES)


def model_settings(backend_url: str) -> settings:
    """A model test's settings against a real store: the same examples every run
    (derandomized), 60 on SQLite and 12 on PostgreSQL (each a fresh store's worth of
    writes, several times slower there: 25 took half a minute a test with a core busy;
    the ``thorough`` profile runs 120), as the profile scales them."""
    return settings(
        max_examples=examples(60 if backend_url.startswith("sqlite") else 12),
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow],
    )


class FrozenClock:
    """Time that moves only when a test says so."""

    def __init__(self, now: float = START) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


#: Packages whose fixtures are costly and package-wide (the dashboard's browser, and its
#: server per backend with a story told): pytest-xdist gives each whole to one worker,
#: where the tests of any other folder go module by module (``--dist loadscope``).
WHOLE_PACKAGES = ("tests/dashboard/",)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class PackageScopes(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            whole = next((p for p in WHOLE_PACKAGES if nodeid.startswith(p)), None)
            return whole if whole is not None else str(super()._split_scope(nodeid))

    return PackageScopes(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``postgres`` every test that uses PostgreSQL: by the cluster's fixture, or by a
    parameter (a backend) named so. ``make check`` leaves them out."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        params = list(callspec.params.values()) if callspec is not None else []
        named = any(isinstance(p, str) and p in POSTGRES_BACKENDS for p in params)
        if "pg_cluster" in getattr(item, "fixturenames", ()) or named:
            item.add_marker(pytest.mark.postgres)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze what collection made (every module imported, every test item): the
    collection after each test (``_collect_garbage``) then looks only at objects made
    since, a few milliseconds instead of a tenth of a second or more a test over the
    whole heap, and a connection a test leaks is among them all the same."""
    gc.collect()
    gc.freeze()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Make a report's text encodable as UTF-8 before pytest-xdist sends it from a worker
    (it cannot send a lone surrogate, and the worker would crash): tests of odd text log
    and fail with such characters, which then read as ``\\ud800``."""
    report.sections = [(title, _encodable(text)) for title, text in report.sections]
    if report.longrepr is not None and not _is_encodable(str(report.longrepr)):
        report.longrepr = _encodable(str(report.longrepr))


def _is_encodable(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _encodable(text: str) -> str:
    return text if _is_encodable(text) else text.encode(errors="backslashreplace").decode()


@pytest.fixture(autouse=True)
def _collect_garbage() -> Iterator[None]:
    """Collect after each test, so a leaked connection fails the test that leaked it;
    then freeze what is left (still referenced: caches, module state), so that the next
    test's collection looks at its own objects only, not at every survivor of the suite
    so far (0.15 s a test by the end of a run)."""
    yield
    gc.collect()
    gc.freeze()


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    """The processes a test starts (tests/processes.py): killed if still running at its end."""
    group = Processes(tmp_path / "processes")
    yield group
    group.close()


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock()


@pytest.fixture(params=BACKENDS)
def backend_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return url_of_backend(request, tmp_path)


def url_of_backend(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of a fresh database of the backend ``request.param`` names."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/ferryq.db"
    if request.param == POOLED:  # through a real PgBouncer in transaction mode
        return pooled_url(str(request.getfixturevalue("pgbouncer_url")))
    return str(request.getfixturevalue("pg_url"))


def pooled_url(url: str) -> str:
    """``url`` with ``pooler=transaction`` added to its query."""
    return f"{url}{'&' if '?' in url else '?'}pooler=transaction"


def server_url(url: str) -> str:
    """A backend's URL as a driver takes it, for a test's own connection: without the
    ``pooler`` parameter, which is ferryq's."""
    return url.replace("&pooler=transaction", "").replace("?pooler=transaction", "")


@pytest.fixture
async def store(backend_url: str) -> AsyncIterator[Store]:
    opened = open_store(backend_url)
    await opened.open()
    yield opened
    await opened.close()


@pytest.fixture
async def app(backend_url: str, clock: FrozenClock) -> AsyncIterator[ferryq.App]:
    application = ferryq.App(backend_url, clock=clock)
    yield application
    await application.aclose()
    application.close()
