"""The server's start and stop contract, each test with a server of its own."""

from __future__ import annotations

import contextlib
from pathlib import Path

import httpx

from tests.server.harness import (
    HTTP_TIMEOUT,
    Lmstfy,
    new_namespace,
    start_server,
)


def test_sigterm_stops_an_idle_server_with_exit_code_0(server_db: str, tmp_path: Path) -> None:
    server = start_server(server_db, tmp_path)
    with httpx.Client(base_url=server.api, timeout=HTTP_TIMEOUT) as api:
        assert api.get("/healthz").status_code == 200
    with server.admin_client() as admin:
        assert admin.get("/pools").status_code == 200
    assert server.stop() == 0, server.stderr()  # within STOP_SECONDS, or it fails


def test_sigterm_stops_a_server_with_a_blocking_consume_in_flight(
    server_db: str, tmp_path: Path
) -> None:
    server = start_server(server_db, tmp_path)
    namespace = new_namespace()
    lm = Lmstfy(server, namespace, server.create_token(namespace))
    try:
        # The waiting client gets an answer or a closed connection, never silence.
        with contextlib.suppress(httpx.HTTPError), lm.consuming("q", timeout=10):
            code = server.stop()  # within STOP_SECONDS, or it fails
    finally:
        lm.close()
        server.process.kill()
    assert code == 0, server.stderr()
