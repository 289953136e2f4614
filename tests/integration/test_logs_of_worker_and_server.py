"""Logs as an operator reads them: a real ``ferryq worker`` and ``ferryq server``, with
``--log-format json``, every stderr line parsed."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest

import ferryq
from ferryq.store import safe_url
from tests.conftest import FrozenClock
from tests.processes import Process, Processes, python
from tests.server.harness import ServerProcess, server_env, start_server

TASKS = "tests.integration.log_tasks:app"
PASSWORD = "s3cret-pw"
KEYS = ["ts", "level", "logger", "msg"]
LOG_ENV = ("FERRYQ_LOG_LEVEL", "FERRYQ_LOG_FORMAT")


def ferryq_cli(
    processes: Processes, url: str, *args: str, env: dict[str, str] | None = None
) -> Process:
    """``ferryq --url URL args``, run to its end (exit 0), with the log level and format
    of ``env`` or of ferryq's defaults, not of the environment the tests run in."""
    unset = [name for name in LOG_ENV if env is None or name not in env]
    done = processes.start(python("ferryq", "--url", url, *args),
                           env={"FERRYQ_URL": url, **(env or {})}, clean_env=unset)  # fmt: skip
    assert done.wait(120) == 0, done.describe()
    return done


def enqueue(processes: Processes, url: str, task: str, args: str = "[]") -> int:
    enqueued = ferryq_cli(processes, url, "enqueue", task, args, "--app", TASKS, "--json")
    return int(json.loads(enqueued.stdout())["id"])


def json_lines(stderr: str) -> list[dict[str, Any]]:
    """Every line of ``stderr``, each one JSON object starting with the stable keys."""
    lines = []
    for text in stderr.splitlines():
        parsed = json.loads(text)
        assert isinstance(parsed, dict) and list(parsed)[:4] == KEYS, text
        lines.append(parsed)
    return lines


def burst(
    processes: Processes, url: str, *options: str, env: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    worker = ferryq_cli(processes, url, "worker", TASKS, "--burst", *options, env=env)
    return json_lines(worker.stderr())


def one(lines: list[dict[str, Any]], logger: str, says: str) -> dict[str, Any]:
    found = [line for line in lines if line["logger"] == logger and says in line["msg"]]
    assert len(found) == 1, (says, lines)
    return found[0]


@pytest.fixture
def url(backend_url: str) -> str:
    """The test's database; on PostgreSQL with a password in the URL, which the test
    cluster's trust authentication accepts as any other."""
    parts = urlsplit(backend_url)
    if parts.scheme == "sqlite" or parts.password is not None:
        return backend_url
    netloc = f"{parts.username}:{PASSWORD}@{parts.hostname}:{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


def test_a_json_worker_logs_its_start_and_stop_as_json_lines(
    processes: Processes, url: str
) -> None:
    job_id = enqueue(processes, url, "echo", "[1]")
    result = ferryq_cli(processes, url, "worker", TASKS, "--burst", "--concurrency", "3",
                        "--log-format", "json", "--log-level", "info")  # fmt: skip
    lines = json_lines(result.stderr())
    assert PASSWORD not in result.stderr()
    start = one(lines, "ferryq.worker", " started: ")
    assert start["level"] == "INFO"
    assert start["database"] == safe_url(url)
    assert start["database"] in start["msg"]
    if url.startswith("postgresql"):
        assert "@" in start["database"] and PASSWORD not in start["database"]
    assert (start["queues"], start["concurrency"], start["version"]) == (
        ["default"], 3, ferryq.__version__,
    )  # fmt: skip
    stop = one(lines, "ferryq.worker", " stopped after ")
    assert (stop["worker"], stop["finished"], stop["stale"], stop["unwritten"]) == (
        start["worker"], 1, 0, 0,
    )  # fmt: skip
    assert lines.index(start) < lines.index(stop) == len(lines) - 1
    leader = one(lines, "ferryq.leadership", " is now the maintenance leader")
    assert (leader["event"], leader["worker"]) == ("acquired", start["worker"])
    assert ferryq.App(url).get_job(job_id).state == "succeeded"


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/logs.db"


async def test_a_lease_recovery_and_a_stale_completion_are_warnings_with_job_ids(
    processes: Processes, sqlite_url: str
) -> None:
    # A job claimed an hour ago by a worker since gone: its lease passed long ago.
    past = ferryq.App(sqlite_url, clock=FrozenClock(time.time() - 3600))
    try:
        abandoned = (await past.enqueue_async("echo", ["left"], ttr=60)).id
        store = await past.store()
        claimed = await store.job_claim("default", ["default"], 10, "gone:1:0", past.clock())
        assert [c.id for c in claimed] == [abandoned]
    finally:
        await past.aclose()
    recovered_meanwhile = enqueue(processes, sqlite_url, "recovered_meanwhile")
    lines = burst(processes, sqlite_url, "--log-format", "json", "--log-level", "warning")
    assert {line["level"] for line in lines} <= {"WARNING", "ERROR"}, lines
    recovery = one(lines, "ferryq.maintenance", "whose lease expired")
    assert (recovery["level"], recovery["count"], recovery["job_ids"]) == (
        "WARNING", 1, [abandoned],
    )  # fmt: skip
    assert f": {abandoned}" in recovery["msg"]
    stale = one(lines, "ferryq.worker", "stale completion")
    assert (stale["level"], stale["job_id"], stale["fence"], stale["outcome"]) == (
        "WARNING", recovered_meanwhile, 1, "succeeded",
    )  # fmt: skip
    assert f"job {recovered_meanwhile} " in stale["msg"]


def test_log_level_info_shows_what_warning_hides(processes: Processes, sqlite_url: str) -> None:
    enqueue(processes, sqlite_url, "echo", "[1]")
    at_info = burst(processes, sqlite_url, "--log-format", "json", "--log-level", "info")
    assert any(line["level"] == "INFO" for line in at_info)
    enqueue(processes, sqlite_url, "echo", "[2]")
    assert burst(processes, sqlite_url, "--log-format", "json", "--log-level", "warning") == []
    enqueue(processes, sqlite_url, "echo", "[3]")
    at_debug = burst(processes, sqlite_url, "--log-format", "json", "--log-level", "DEBUG")
    assert len(at_debug) >= len(at_info)


def test_the_environment_sets_the_default_level_and_format(
    processes: Processes, sqlite_url: str
) -> None:
    enqueue(processes, sqlite_url, "echo", "[1]")
    lines = burst(
        processes, sqlite_url, env={"FERRYQ_LOG_FORMAT": "json", "FERRYQ_LOG_LEVEL": "info"}
    )
    one(lines, "ferryq.worker", " started: ")
    # The command line wins over the environment.
    both = {"FERRYQ_LOG_FORMAT": "json", "FERRYQ_LOG_LEVEL": "info"}
    assert burst(processes, sqlite_url, "--log-level", "error", env=both) == []
    text = ferryq_cli(processes, sqlite_url, "worker", TASKS, "--burst", "--log-format", "text",
                      env={"FERRYQ_LOG_FORMAT": "json"}).stderr()  # fmt: skip
    assert " INFO    ferryq.worker: worker " in text and "{" not in text


# -- the server ------------------------------------------------------------------


def serve(url: str, log_dir: Path, *options: str) -> ServerProcess:
    """A ``ferryq server`` with ``options``, at ferryq's default log level and format."""
    environ = {k: v for k, v in server_env().items() if k not in LOG_ENV}
    return start_server(url, log_dir, options=options, env=environ)


def test_the_server_logs_every_request_as_a_json_line(sqlite_url: str, tmp_path: Path) -> None:
    server = serve(sqlite_url, tmp_path, "--log-format", "json")
    api, admin = server.api, server.admin
    try:
        with httpx.Client(timeout=30) as client:
            assert client.get(f"{api}/healthz", params={"token": "in-the-query"}).status_code == 200
            assert client.get(f"{api}/api/ns/q/size").status_code in (200, 401)
            token = "abcdefghijklmnopqrstuvwxyz"
            client.delete(f"{admin}/token/ns/{token}")
    finally:
        assert server.stop() == 0, server.stderr()
    text = server.stderr()
    lines = json_lines(text)
    assert "in-the-query" not in text and "abcdefghijklmnopqrstuvwxyz" not in text
    access = [line for line in lines if line["logger"] == "ferryq.server.access"]
    assert [(a["method"], a["path"], a["listener"]) for a in access] == [
        ("GET", "/healthz", "api"), ("GET", "/api/ns/q/size", "api"),
        ("DELETE", "/token/ns/***", "admin"),
    ]  # fmt: skip
    health = access[0]
    assert (health["level"], health["status"]) == ("INFO", 200)
    assert isinstance(health["duration_ms"], float) and health["duration_ms"] >= 0
    assert health["client"].startswith("127.0.0.1:")
    assert health["request_id"]
    assert health["msg"].startswith("GET /healthz 200 ")
    listening = one(lines, "ferryq.server", "server listening")
    assert (listening["api"], listening["admin"]) == (api, admin)
    assert (listening["database"], listening["version"]) == (sqlite_url, ferryq.__version__)
    one(lines, "ferryq.server", "server stopped")


def test_a_server_at_warning_logs_no_requests(sqlite_url: str, tmp_path: Path) -> None:
    server = serve(sqlite_url, tmp_path, "--log-format", "json", "--log-level", "warning")
    api = server.api
    try:
        with httpx.Client(timeout=30) as client:
            assert client.get(f"{api}/healthz").status_code == 200
    finally:
        assert server.stop() == 0, server.stderr()
    assert json_lines(server.stderr()) == []
