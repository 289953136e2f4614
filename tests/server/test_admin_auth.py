"""The admin credential: HTTP basic auth on the admin port, and the refusal to expose
the admin port beyond loopback without one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.processes import Processes
from tests.server.harness import (
    CREDENTIAL_ENV,
    SESSION_SECRET_ENV,
    ServerProcess,
    each,
    new_namespace,
    running_server,
    server_command,
)

USER, PASSWORD = "operator", "s3cret:with:colons"
CREDENTIAL = f"{USER}:{PASSWORD}"
WRONG = [None, (USER, "wrong"), ("someone", PASSWORD), (USER, ""), (PASSWORD, USER)]
SECRETS = (CREDENTIAL_ENV, SESSION_SECRET_ENV)  # none from the environment the tests run in


@pytest.fixture(scope="module")
def guarded(server_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server started with ``--admin-credential``."""
    logs = tmp_path_factory.mktemp("guarded-logs")
    with running_server(server_db, logs, credential=CREDENTIAL) as running:
        yield running


def admin_requests(namespace: str) -> list[tuple[str, str]]:
    return [
        ("POST", f"/token/{namespace}?description=d"),
        ("GET", f"/token/{namespace}"),
        ("GET", "/pools"),
        ("GET", "/info"),
        ("GET", "/version"),
    ]


def test_the_admin_port_refuses_requests_without_the_credential(guarded: ServerProcess) -> None:
    namespace = new_namespace()

    def check(auth: tuple[str, str] | None) -> None:
        with httpx.Client(base_url=guarded.admin, auth=auth, timeout=30) as admin:
            for method, path in admin_requests(namespace):
                answer = admin.request(method, path)
                assert answer.status_code == 401, (method, path, answer.status_code, answer.text)
                assert answer.headers.get("WWW-Authenticate", "").lower().startswith("basic")

    each(WRONG, check)
    with httpx.Client(base_url=guarded.admin, auth=(USER, PASSWORD), timeout=30) as admin:
        listed = admin.get(f"/token/{namespace}")
    assert listed.status_code == 200
    assert not listed.json()["tokens"]  # the refused POSTs created nothing


def test_a_malformed_authorization_header_is_refused(guarded: ServerProcess) -> None:
    with httpx.Client(base_url=guarded.admin, timeout=30) as admin:
        for header in ("Basic", "Basic !!!notbase64", "Bearer abc", "Basic b3BlcmF0b3I="):
            answer = admin.get("/pools", headers={"Authorization": header})
            assert answer.status_code == 401, (header, answer.status_code)


def test_the_admin_port_accepts_the_credential(guarded: ServerProcess) -> None:
    namespace = new_namespace()
    with httpx.Client(base_url=guarded.admin, auth=(USER, PASSWORD), timeout=30) as admin:
        for method, path in admin_requests(namespace):
            answer = admin.request(method, path)
            assert answer.status_code in (200, 201), (method, path, answer.text)
        token = admin.get(f"/token/{namespace}").json()["tokens"]
    assert len(token) == 1


def test_the_api_port_does_not_ask_for_the_admin_credential(guarded: ServerProcess) -> None:
    namespace = new_namespace()
    token = guarded.create_token(namespace)
    with guarded.api_client() as api:
        published = api.put(f"/api/{namespace}/q", content=b"x", headers={"X-Token": token})
        assert published.status_code == 201, published.text
        assert api.get(f"/api/{namespace}/q/size").json()["size"] == 1
        assert api.get("/healthz").status_code == 200


def test_the_credential_may_come_from_the_environment(server_db: str, tmp_path: Path) -> None:
    with (
        running_server(server_db, tmp_path, credential_env="envuser:envpass") as running,
        httpx.Client(base_url=running.admin, timeout=30) as admin,
    ):
        assert admin.get("/pools").status_code == 401
        assert admin.get("/pools", auth=("envuser", "wrong")).status_code == 401
        assert admin.get("/pools", auth=("envuser", "envpass")).status_code == 200


def unreachable(tmp_path: Path) -> str:
    """A database no server could open: a refusal at start names the credential, not
    the database, so the options are checked before any backend is reached (and these
    tests need not run on each)."""
    return f"sqlite:///{tmp_path}/no-such-folder/ferryq.db"


def test_the_admin_port_off_loopback_without_a_credential_is_refused_at_start(
    processes: Processes, tmp_path: Path
) -> None:
    def check(host: str) -> None:
        argv = server_command(unreachable(tmp_path), admin_host=host)
        refused = processes.start(argv, clean_env=SECRETS)
        assert refused.wait() == 2, refused.describe()
        assert "listening" not in refused.stdout(), refused.describe()
        said = refused.stderr().lower()
        assert "admin" in said and "credential" in said, refused.describe()

    each(["0.0.0.0", "::"], check)


@pytest.mark.parametrize(
    ("option", "env"),
    [(":", None), ("admin:", None), (":secret", None), ("nocolon", None), ("", None),
     (None, ""), (None, ":")],
)  # fmt: skip
def test_an_empty_user_or_password_is_refused_at_start(
    processes: Processes, tmp_path: Path, option: str | None, env: str | None
) -> None:
    argv = server_command(unreachable(tmp_path), credential=option)
    given = {} if env is None else {CREDENTIAL_ENV: env}
    refused = processes.start(argv, env=given, clean_env=SECRETS)
    assert refused.wait() == 2, refused.describe()
    assert "listening" not in refused.stdout(), refused.describe()
    assert "Traceback" not in refused.stderr()
    assert "the admin credential must be USER:PASSWORD" in refused.stderr(), refused.describe()
