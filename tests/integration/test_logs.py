"""Logs as an operator reads them: a real ``ferryq worker`` and ``ferryq server``, with
``--log-format json``, every stderr line parsed."""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest

import ferryq
from ferryq.store import safe_url
from tests.conftest import FrozenClock
from tests.server.harness import LISTENING, START_SECONDS, server_command, server_env

ROOT = Path(__file__).resolve().parents[2]
TASKS = "tests.integration.log_tasks:app"
PASSWORD = "s3cret-pw"
KEYS = ["ts", "level", "logger", "msg"]


def ferryq_cli(
    url: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "FERRYQ_URL": url, **(env or {})}
    for name in ("FERRYQ_LOG_LEVEL", "FERRYQ_LOG_FORMAT"):
        if env is None or name not in env:
            environ.pop(name, None)
    result = subprocess.run(
        [sys.executable, "-m", "ferryq", "--url", url, *args],
        capture_output=True, text=True, env=environ, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result


def enqueue(url: str, task: str, args: str = "[]") -> int:
    reply = json.loads(ferryq_cli(url, "enqueue", task, args, "--app", TASKS, "--json").stdout)
    return int(reply["id"])


def json_lines(stderr: str) -> list[dict[str, Any]]:
    """Every line of ``stderr``, each one JSON object starting with the stable keys."""
    lines = []
    for text in stderr.splitlines():
        parsed = json.loads(text)
        assert isinstance(parsed, dict) and list(parsed)[:4] == KEYS, text
        lines.append(parsed)
    return lines


def burst(url: str, *options: str, env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    return json_lines(ferryq_cli(url, "worker", TASKS, "--burst", *options, env=env).stderr)


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


def test_a_json_worker_logs_its_start_and_stop_as_json_lines(url: str) -> None:
    job_id = enqueue(url, "echo", "[1]")
    result = ferryq_cli(url, "worker", TASKS, "--burst", "--concurrency", "3",
                        "--log-format", "json", "--log-level", "info")  # fmt: skip
    lines = json_lines(result.stderr)
    assert PASSWORD not in result.stderr
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
    sqlite_url: str,
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
    recovered_meanwhile = enqueue(sqlite_url, "recovered_meanwhile")
    lines = burst(sqlite_url, "--log-format", "json", "--log-level", "warning")
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


def test_log_level_info_shows_what_warning_hides(sqlite_url: str) -> None:
    enqueue(sqlite_url, "echo", "[1]")
    at_info = burst(sqlite_url, "--log-format", "json", "--log-level", "info")
    assert any(line["level"] == "INFO" for line in at_info)
    enqueue(sqlite_url, "echo", "[2]")
    assert burst(sqlite_url, "--log-format", "json", "--log-level", "warning") == []
    enqueue(sqlite_url, "echo", "[3]")
    at_debug = burst(sqlite_url, "--log-format", "json", "--log-level", "DEBUG")
    assert len(at_debug) >= len(at_info)


def test_the_environment_sets_the_default_level_and_format(sqlite_url: str) -> None:
    enqueue(sqlite_url, "echo", "[1]")
    lines = burst(sqlite_url, env={"FERRYQ_LOG_FORMAT": "json", "FERRYQ_LOG_LEVEL": "info"})
    one(lines, "ferryq.worker", " started: ")
    # The command line wins over the environment.
    both = {"FERRYQ_LOG_FORMAT": "json", "FERRYQ_LOG_LEVEL": "info"}
    assert burst(sqlite_url, "--log-level", "error", env=both) == []
    text = ferryq_cli(sqlite_url, "worker", TASKS, "--burst", "--log-format", "text",
                      env={"FERRYQ_LOG_FORMAT": "json"}).stderr  # fmt: skip
    assert " INFO    ferryq.worker: worker " in text and "{" not in text


# -- the server ------------------------------------------------------------------


def serve(url: str, stderr: Path, *options: str) -> tuple[subprocess.Popen[bytes], str, str]:
    """A ``ferryq server`` with ``options``; its API and admin addresses once it listens."""
    environ = server_env()
    environ.pop("FERRYQ_LOG_LEVEL", None)
    environ.pop("FERRYQ_LOG_FORMAT", None)
    with stderr.open("wb") as errors:
        process = subprocess.Popen(
            [*server_command(url), *options], cwd=ROOT, env=environ,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=errors,
        )  # fmt: skip
    first = _first_line(process)
    match = LISTENING.match(first)
    if match is None:
        process.kill()
        _closed(process, process.wait())
        raise AssertionError(f"no listening line: {first!r}\n{stderr.read_text()}")
    return process, match[1], match[2]


def _first_line(process: subprocess.Popen[bytes]) -> str:
    """The first stdout line, or what came of it within START_SECONDS."""
    assert process.stdout is not None
    deadline = time.monotonic() + START_SECONDS
    line = b""
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while not line.endswith(b"\n") and (left := deadline - time.monotonic()) > 0:
            if selector.select(left):
                byte = os.read(process.stdout.fileno(), 1)
                if not byte:
                    break
                line += byte
    return line.decode(errors="replace").rstrip("\n")


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM; the server must exit 0."""
    process.terminate()
    assert _closed(process, process.wait(30)) == 0


def _closed(process: subprocess.Popen[bytes], code: int) -> int:
    assert process.stdout is not None
    process.stdout.close()
    return code


def test_the_server_logs_every_request_as_a_json_line(sqlite_url: str, tmp_path: Path) -> None:
    stderr = tmp_path / "server.stderr"
    process, api, admin = serve(sqlite_url, stderr, "--log-format", "json")
    try:
        with httpx.Client(timeout=30) as client:
            assert client.get(f"{api}/healthz", params={"token": "in-the-query"}).status_code == 200
            assert client.get(f"{api}/api/ns/q/size").status_code in (200, 401)
            token = "abcdefghijklmnopqrstuvwxyz"
            client.delete(f"{admin}/token/ns/{token}")
    finally:
        stop(process)
    text = stderr.read_text()
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
    stderr = tmp_path / "server.stderr"
    process, api, _ = serve(sqlite_url, stderr, "--log-format", "json", "--log-level", "warning")
    try:
        with httpx.Client(timeout=30) as client:
            assert client.get(f"{api}/healthz").status_code == 200
    finally:
        stop(process)
    assert json_lines(stderr.read_text()) == []
