"""Signing in, what a namespace token may see, and job data that tries to be markup."""

from __future__ import annotations

import re
import sqlite3
import subprocess
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Dialog, Page, expect

import ferryq
from tests.dashboard.conftest import ADMIN, Dash, browser_page, sign_in_token, signed_in_client
from tests.dashboard.story import OTHER_NAMESPACE, SCRIPT
from tests.processes import ROOT, wait_until
from tests.server.harness import ServerProcess, running_server, server_command, server_env

# What does not depend on the backend runs on SQLite only, to keep the suite quick.
SQLITE_ONLY = pytest.mark.parametrize("dash", ["sqlite"], indirect=True)


@SQLITE_ONLY
def test_every_page_needs_a_sign_in(page: Page, dash: Dash) -> None:
    for path in ("/", "/ui/jobs", f"/ui/jobs/{dash.story.dead}", "/ui/dead", "/ui/lanes",
                 "/ui/workers"):  # fmt: skip
        page.goto(dash.url(path))
        expect(page).to_have_title("Sign in · ferryq")
    with httpx.Client(base_url=dash.base) as client:
        fragment = client.get("/ui/jobs", headers={"X-Ferryq-Fragment": "1"})
        assert fragment.status_code == 401
        assert "user0@example.com" not in fragment.text


@SQLITE_ONLY
def test_a_wrong_password_is_refused_and_the_right_one_goes_where_asked(
    page: Page, dash: Dash
) -> None:
    page.goto(dash.url("/ui/dead"))
    page.fill("#admin-login input[name=user]", ADMIN[0])
    page.fill("#admin-login input[name=password]", "not-the-password")
    page.click("#admin-login button[type=submit]")
    expect(page.locator(".error")).to_have_text("Wrong credential or token.")
    expect(page).to_have_title("Sign in · ferryq")
    dash.shot(page, "login")
    page.fill("#admin-login input[name=user]", ADMIN[0])
    page.fill("#admin-login input[name=password]", ADMIN[1])
    page.click("#admin-login button[type=submit]")
    expect(page).to_have_title("Dead letters · ferryq")
    session = next(c for c in page.context.cookies() if c["name"] == "ferryq_session")
    assert session["httpOnly"] and session["sameSite"] == "Strict" and session["path"] == "/ui"
    page.get_by_role("button", name="Sign out").click()
    expect(page).to_have_title("Sign in · ferryq")
    page.goto(dash.url("/ui/dead"))
    expect(page).to_have_title("Sign in · ferryq")


@SQLITE_ONLY
def test_job_data_is_shown_as_text_and_never_runs(admin: Page, dash: Dash) -> None:
    dialogs: list[str] = []

    def dismiss(dialog: Dialog) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    admin.on("dialog", dismiss)
    response = admin.goto(dash.url(f"/ui/jobs/{dash.story.injected}"))
    assert response is not None
    policy = response.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy
    expect(admin.locator("#args")).to_contain_text("<script>window.__injected = 1</script><img")
    expect(admin.locator("#traceback")).to_contain_text(SCRIPT)
    assert admin.locator("#live script, #live img").count() == 0
    for path in ("/ui/jobs?ns=default&queue=uploads", "/ui/dead?ns=default", "/ui/?ns=default"):
        admin.goto(dash.url(path))
        expect(admin.get_by_text("window.__injected").first).to_be_visible()
        assert admin.locator("#live script, #live img").count() == 0
    admin.goto(dash.url(f"/ui/jobs/{dash.story.injected}"))
    expect(admin.locator("#live-status")).to_contain_text("·")  # a live update has come in
    assert admin.evaluate("window.__injected") is None
    assert dialogs == []


def test_a_namespace_token_sees_its_namespace_only(browser: Browser, dash: Dash) -> None:
    token = dash.token(OTHER_NAMESPACE)
    story = dash.story
    with browser_page(browser) as page:
        sign_in_token(page, dash, token)
        expect(page).to_have_title("Overview · ferryq")
        expect(page.locator(".viewer")).to_contain_text(f"namespace {OTHER_NAMESPACE}")
        expect(page.locator('tr[data-queue="private"]')).to_be_visible()
        expect(page.locator('tr[data-queue="mail"]')).to_have_count(0)
        dash.shot(page, "token-overview")

        page.goto(dash.url("/ui/jobs?ns=default"))  # asking for another namespace changes nothing
        rows = page.locator("tr[data-job]")
        expect(rows).to_have_count(len(story.secret))
        page.goto(dash.url(f"/ui/jobs/{story.secret[0]}"))
        expect(page.locator("#args")).to_contain_text("alpha")
        page.goto(dash.url(f"/ui/jobs/{story.dead}"))
        expect(page.locator("h1")).to_have_text("404")
        expect(page.get_by_text("storage refused")).to_have_count(0)
        page.goto(dash.url("/ui/dead"))
        expect(page.get_by_text("No dead letters.")).to_be_visible()
        page.goto(dash.url("/ui/lanes?ns=default"))
        expect(page.get_by_text("orders:1")).to_have_count(0)


def test_a_token_cannot_act_on_another_namespace(dash: Dash) -> None:
    token = dash.token(OTHER_NAMESPACE)
    with httpx.Client(base_url=dash.base, timeout=30) as client:
        csrf = _csrf(client.get("/ui/login").text)
        assert client.post("/ui/login", data={"csrf": csrf, "token": token}).status_code == 303
        csrf = _csrf(client.get("/ui/").text)
        answer = client.post("/ui/actions", data={"csrf": csrf, "action": "purge", "confirm": "yes",
                                                  "ids": str(dash.story.dead)})  # fmt: skip
        assert answer.status_code == 303
        assert "n=0" in answer.headers["location"]
    with signed_in_client(dash) as admin:
        assert "Job #" in admin.get(f"/ui/jobs/{dash.story.dead}").text


@SQLITE_ONLY
def test_a_revoked_token_ends_its_sessions(dash: Dash) -> None:
    token = dash.token(OTHER_NAMESPACE)
    with httpx.Client(base_url=dash.base, timeout=30) as client:
        csrf = _csrf(client.get("/ui/login").text)
        assert client.post("/ui/login", data={"csrf": csrf, "token": token}).status_code == 303
        assert client.get("/ui/jobs").status_code == 200
        with dash.server.admin_client() as admin:
            assert admin.delete(f"/token/{OTHER_NAMESPACE}/{token}").status_code == 204
        wait_until(lambda: client.get("/ui/jobs").status_code == 303, within=10,
                   interval=0.2, what="the session to end")  # fmt: skip


@SQLITE_ONLY
def test_forms_need_the_session_csrf_value_and_this_origin(dash: Dash) -> None:
    with signed_in_client(dash) as client:
        target = {"action": "respawn", "confirm": "yes", "ids": str(dash.story.dead)}
        assert client.post("/ui/actions", data=target).status_code == 403
        assert client.post("/ui/actions", data={**target, "csrf": "forged"}).status_code == 403
        csrf = _csrf(client.get("/ui/").text)
        cross = client.post("/ui/actions", data={**target, "csrf": csrf},
                            headers={"Origin": "http://evil.example"})  # fmt: skip
        assert cross.status_code == 403
        assert "dead since" in client.get(f"/ui/jobs/{dash.story.dead}").text


@pytest.fixture
def plain_server(tmp_path: Path, dash: Dash) -> Iterator[str]:
    """A second server on the same database, without an admin credential."""
    with running_server(dash.story.url, tmp_path) as server:
        yield server.api


@SQLITE_ONLY
def test_without_an_admin_credential_only_tokens_sign_in(plain_server: str, dash: Dash) -> None:
    with httpx.Client(base_url=plain_server, timeout=30) as client:
        form = client.get("/ui/login")
        assert 'id="admin-login"' not in form.text
        assert "Operator sign-in is off" in form.text
        refused = client.post("/ui/login", data={"csrf": _csrf(form.text), "user": "",
                                                 "password": ""})  # fmt: skip
        assert refused.status_code == 401
        token = dash.token(OTHER_NAMESPACE)
        signed = client.post("/ui/login", data={"csrf": _csrf(refused.text), "token": token})
        assert signed.status_code == 303
        assert "secret" in client.get("/ui/jobs").text


@SQLITE_ONLY
def test_servers_sharing_a_session_secret_share_sessions(tmp_path: Path, dash: Dash) -> None:
    def server(secret: str | None) -> AbstractContextManager[ServerProcess]:
        return running_server(dash.story.url, tmp_path, credential=f"{ADMIN[0]}:{ADMIN[1]}",
                              session_secret_env=secret)  # fmt: skip

    secret = "a-session-secret-of-32-characters!"
    with server(secret) as first, httpx.Client(base_url=first.api, timeout=30) as client:
        form = client.get("/ui/login").text
        signed = client.post("/ui/login", data={"csrf": _csrf(form), "user": ADMIN[0],
                                                "password": ADMIN[1]})  # fmt: skip
        assert signed.status_code == 303
        cookies = dict(client.cookies)
    # The first server has stopped: its twin, or itself restarted, knows the session.
    job = f"/ui/jobs/{dash.story.dead}"
    with server(secret) as second, httpx.Client(base_url=second.api, cookies=cookies) as client:
        assert "dead since" in client.get(job, timeout=30).text
    with server(None) as other, httpx.Client(base_url=other.api, cookies=cookies) as client:
        refused = client.get(job, timeout=30)
        assert refused.status_code == 303 and "/ui/login" in refused.headers["location"]


@pytest.mark.parametrize(("option", "variable"), [("too-short", None), (None, "")])
def test_a_short_or_empty_session_secret_is_refused_at_start(
    tmp_path: Path, option: str | None, variable: str | None
) -> None:
    url = f"sqlite:///{tmp_path}/refused.db"
    argv = server_command(url) + ([] if option is None else ["--session-secret", option])
    done = subprocess.run(argv, cwd=ROOT, env=server_env(session_secret_env=variable),
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode != 0
    assert "the session secret must be at least 32 characters" in done.stderr


def _csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found is not None, html[:500]
    return found[1]


def test_bad_input_is_a_400_that_changes_nothing(dash: Dash) -> None:
    with signed_in_client(dash) as client:
        csrf = _csrf(client.get("/ui/").text)
        beyond = "9999999999999999999"  # past the largest id a database holds
        for path in (f"/ui/jobs?after={beyond}", f"/ui/dead?after={beyond}", "/ui/jobs?queue=%00",
                     "/ui/jobs?task=%00", "/ui/jobs?lane=%00", "/ui/jobs?q=%00", "/ui/jobs?ns=%00",
                     "/ui/dead?queue=%00", "/ui/lanes?ns=%00", "/ui/?ns=bad%20ns"):  # fmt: skip
            answer = client.get(path)
            assert answer.status_code == 400, (path, answer.status_code)
            assert "content-security-policy" in answer.headers
        assert client.get("/ui/jobs/9223372036854775808").status_code == 404
        purge = {"csrf": csrf, "action": "purge", "confirm": "yes", "ids": beyond}
        assert client.post("/ui/actions", data=purge).status_code == 400
        for form in ({"pattern": "p\x00q", "limit": "1", "on_dead": "halt"},
                     {"ns": "bad ns/<x>", "pattern": "p", "limit": "1", "on_dead": "halt"},
                     {"pattern": "p", "limit": "1", "on_dead": "halt", "op": "bogus"}):  # fmt: skip
            answer = client.post("/ui/lanes/rules", data={"csrf": csrf, **form})
            assert answer.status_code == 400, form
        # A rule refused, or a rule to remove that is not there: the lanes page says why.
        for form in ({"pattern": "bad*x", "limit": "1", "on_dead": "halt"},
                     {"pattern": "never-set", "op": "delete"}):  # fmt: skip
            refused = client.post("/ui/lanes/rules", data={"csrf": csrf, **form})
            assert refused.status_code == 303 and "rule_error" in refused.headers["location"]
            shown = client.get(refused.headers["location"])
            assert shown.status_code == 200 and 'class="error"' in shown.text
        assert "dead since" in client.get(f"/ui/jobs/{dash.story.dead}").text


def test_a_page_that_fails_is_the_dashboards_500_page(tmp_path: Path) -> None:
    """A real failure underneath (the jobs table gone from under the server) is a 500
    page with the dashboard's headers, logged, on a connection that stays usable."""
    path = tmp_path / "broken.db"
    app = ferryq.App(f"sqlite:///{path}")
    job = app.enqueue("anything").id
    app.close()
    credential = f"{ADMIN[0]}:{ADMIN[1]}"
    with running_server(f"sqlite:///{path}", tmp_path, credential=credential) as server:
        with httpx.Client(base_url=server.api, timeout=30) as client:
            form = client.get("/ui/login").text
            signed = client.post("/ui/login", data={"csrf": _csrf(form), "user": ADMIN[0],
                                                    "password": ADMIN[1]})  # fmt: skip
            assert signed.status_code == 303
            assert client.get(f"/ui/jobs/{job}").status_code == 200
            with sqlite3.connect(path) as db:
                db.execute("ALTER TABLE ferryq_jobs RENAME TO ferryq_jobs_away")
            failed = client.get(f"/ui/jobs/{job}")
            assert failed.status_code == 500
            assert "Something went wrong; it is logged." in failed.text
            assert "ferryq_jobs" not in failed.text  # the cause is in the log, not the page
            assert "content-security-policy" in failed.headers
            assert failed.headers["content-type"].startswith("text/html")
            with sqlite3.connect(path) as db:
                db.execute("ALTER TABLE ferryq_jobs_away RENAME TO ferryq_jobs")
            assert client.get(f"/ui/jobs/{job}").status_code == 200  # same connection
        assert f"dashboard page /ui/jobs/{job} failed" in server.stderr()
