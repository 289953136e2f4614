"""A real ``ferryq server`` per backend with the story's jobs in it, and a real browser.

The browser is the system's Chromium (``/usr/bin/chromium``, or FERRYQ_TEST_CHROMIUM),
driven by Playwright; Playwright's own browser downloads are never used.
``scripts/ensure-chromium.sh`` installs it as root. Without it the tests are skipped,
except under CI (``CI=true``), where that fails the run.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, Playwright, expect, sync_playwright

from tests.conftest import BACKENDS, POOLED, pooled_url
from tests.dashboard.story import Story, tell
from tests.pg import PgCluster, fresh_database, in_ci
from tests.pgbouncer import Bouncer
from tests.processes import ROOT
from tests.server.harness import ServerProcess, running_server

CHROMIUM = os.environ.get("FERRYQ_TEST_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = ROOT / "artifacts" / "dashboard"
ADMIN = ("admin", "s3cret-pass")
TIMEOUT_MS = 10_000
# Assertions wait as long as actions do: a live page refreshes every 2-3 s, and a busy
# machine can take a while to answer.
expect.set_options(timeout=TIMEOUT_MS)


@dataclass(frozen=True, slots=True)
class Dash:
    """The module's server, its backend's name and the story told in its database."""

    server: ServerProcess
    backend: str
    story: Story

    @property
    def base(self) -> str:
        return self.server.api

    def url(self, path: str) -> str:
        return f"{self.server.api}{path}"

    def token(self, namespace: str) -> str:
        return self.server.create_token(namespace, "dashboard tests")

    def shot(self, page: Page, name: str) -> None:
        """Keep a picture of the page with the test's artifacts."""
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"{self.backend}-{name}.png"), full_page=True)


# The browser lives as long as this package's tests and no longer: Playwright's sync
# API holds an event loop on the main thread while it runs, and the async tests of
# other packages need that thread free of one.
@pytest.fixture(scope="package")
def playwright() -> Iterator[Playwright]:
    if not os.access(CHROMIUM, os.X_OK):
        message = f"no Chromium at {CHROMIUM} (scripts/ensure-chromium.sh installs it)"
        if in_ci():
            pytest.fail(f"CI=true and {message}", pytrace=False)
        pytest.skip(message)
    with sync_playwright() as running:
        yield running


@pytest.fixture(scope="package")
def browser(playwright: Playwright) -> Iterator[Browser]:
    launched = playwright.chromium.launch(executable_path=CHROMIUM)
    yield launched
    launched.close()


@pytest.fixture(scope="package", params=BACKENDS)
def dash(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Dash]:
    """One server per backend for the whole dashboard suite, the story told once. A test
    may ask for ``POOLED`` too (``pytest.mark.parametrize("dash", [..., POOLED],
    indirect=True)``): PostgreSQL through the session's PgBouncer in transaction mode,
    the story told, the database migrated and the server run through it."""
    backend = request.param
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('dashboard-db')}/ferryq.db"
        yield from _serve(url, backend, tmp_path_factory)
        return
    cluster: PgCluster = request.getfixturevalue("pg_cluster")
    if backend == POOLED:
        bouncer: Bouncer = request.getfixturevalue("pgbouncer")
        with fresh_database(cluster, migrated=False) as url:
            yield from _serve(pooled_url(bouncer.through(url)), backend, tmp_path_factory)
        return
    with fresh_database(cluster) as url:
        yield from _serve(url, backend, tmp_path_factory)


def _serve(url: str, backend: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dash]:
    story = tell(url)
    logs = tmp_path_factory.mktemp("dashboard-logs")
    with running_server(url, logs, credential=":".join(ADMIN)) as server:
        yield Dash(server, backend, story)


@contextmanager
def browser_page(browser: Browser, state: Any = None) -> Iterator[Page]:
    """A page in a context of its own (with ``state``'s cookies, if given); errors in
    the page fail the test."""
    context = browser.new_context(viewport={"width": 1280, "height": 900}, storage_state=state)
    context.set_default_timeout(TIMEOUT_MS)
    opened = context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda exc: errors.append(str(exc)))
    yield opened
    context.close()
    assert not errors, f"errors in the page: {errors}"


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """A fresh browser context, signed in as nobody."""
    with browser_page(browser) as opened:
        yield opened


@pytest.fixture(scope="package")
def admin_state(browser: Browser, dash: Dash) -> Any:
    """The cookies of an operator's session, signed in once through the form."""
    with browser_page(browser) as opened:
        sign_in_admin(opened, dash)
        expect(opened).to_have_title("Overview · ferryq")
        return opened.context.storage_state()


@pytest.fixture
def admin(browser: Browser, admin_state: Any) -> Iterator[Page]:
    """A page signed in as the operator."""
    with browser_page(browser, admin_state) as opened:
        yield opened


def sign_in_admin(page: Page, dash: Dash, password: str = ADMIN[1]) -> None:
    page.goto(dash.url("/"))
    page.fill("#admin-login input[name=user]", ADMIN[0])
    page.fill("#admin-login input[name=password]", password)
    page.click("#admin-login button[type=submit]")


def sign_in_token(page: Page, dash: Dash, token: str) -> None:
    page.goto(dash.url("/"))
    page.fill("#token-login input[name=token]", token)
    page.click("#token-login button[type=submit]")


@contextmanager
def signed_in_client(dash: Dash) -> Iterator[httpx.Client]:
    """An HTTP client with an operator's session, as a browser would hold it."""
    with httpx.Client(base_url=dash.base, timeout=30) as client:
        form = client.get("/ui/login")
        csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
        assert csrf is not None
        signed = client.post("/ui/login", data={"csrf": csrf[1], "user": ADMIN[0],
                                                "password": ADMIN[1]})  # fmt: skip
        assert signed.status_code == 303, signed.text
        yield client
