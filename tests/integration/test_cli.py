"""The command line on a real SQLite file (and PostgreSQL where said).

Commands run in this process, through the root command as the ``ferryq`` script calls
it, with their own stdin, stdout, stderr and environment: what they print and their exit
code are all a test reads, and a process would only add its start-up to each. The
worker and the demo run in a subprocess, as users run them, since the process is part of
what they do (its logging, its signals, its interpreter's settings, a PATH without
.venv/bin); so do a command in a folder without a database, and the installed ``ferryq``
script itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import re
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ferryq import App
from ferryq.cli import settings
from ferryq.cli.enqueue import FLAGS
from ferryq.cli.worker import WORKER_SWITCH_INTERVAL
from ferryq.policy import OPTION_NAMES
from ferryq.store import open_store
from ferryq.store.base import Finish
from tests.commands import run_ferryq
from tests.integration.volumes import fill, tmpfs

ROOT = Path(__file__).resolve().parents[2]
TASKS = "tests.integration.cli_tasks:app"
#: Commands run in a process of their own (see the module's docstring).
IN_A_PROCESS = {"worker", "demo"}

Run = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/t.db"


@pytest.fixture
def ferryq(tmp_path: Path, url: str) -> Run:
    """``ferryq --url URL ARGS...`` with FERRYQ_URL set to the same database."""
    return runner(url, tmp_path)


@pytest.fixture
def ferryq_each(tmp_path: Path, backend_url: str) -> Run:
    """The same, once on SQLite and once on PostgreSQL."""
    return runner(backend_url, tmp_path)


def runner(url: str, tmp_path: Path) -> Run:
    def run(
        *args: str, input: str | None = None, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        environ = {"FERRYQ_URL": url, "TMPDIR": str(tmp_path), **(env or {})}
        argv = ["--url", url, *args]
        if IN_A_PROCESS.intersection(args):
            return subprocess.run(
                [sys.executable, "-m", "ferryq", *argv], capture_output=True, text=True,
                input=input, env={**os.environ, **environ}, cwd=ROOT, timeout=120,
            )  # fmt: skip
        return run_ferryq(argv, input=input, env=environ)

    return run


def ok(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr
    return result


def as_json(result: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(ok(result).stdout)


def failed(result: subprocess.CompletedProcess[str], code: int) -> str:
    """The one-line error message of a command that had to fail with ``code``."""
    assert result.returncode == code, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def enqueue(ferryq: Run, *args: str) -> int:
    reply = as_json(ferryq("enqueue", *args, "--json"))
    assert reply["created"] is True
    return int(reply["id"])


def job(ferryq: Run, job_id: int) -> dict[str, Any]:
    found: dict[str, Any] = as_json(ferryq("jobs", "show", str(job_id), "--json"))
    return found


def ids(jobs: list[dict[str, Any]]) -> list[int]:
    return [j["id"] for j in jobs]


# -- basics --------------------------------------------------------------------


def test_help_and_version(ferryq: Run) -> None:
    assert "jobs" in ok(ferryq("--help")).stdout
    assert "0.1.0" in ok(ferryq("--version")).stdout


def test_the_installed_script_and_python_m_ferryq_run_the_command_line(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "ferryq"
    if not script.exists():
        pytest.skip(f"no ferryq script beside {sys.executable}: ferryq is not installed there")
    url = f"sqlite:///{tmp_path}/t.db"
    for command in ([str(script)], [sys.executable, "-m", "ferryq"]):
        enqueued = subprocess.run([*command, "--url", url, "enqueue", "send", "[1]"],
                                  capture_output=True, text=True, timeout=120)  # fmt: skip
        assert "enqueued job" in ok(enqueued).stdout
        missing = subprocess.run([*command, "--url", url, "jobs", "show", "99"],
                                 capture_output=True, text=True, timeout=120)  # fmt: skip
        assert failed(missing, 1) == "Error: no job with id 99"


def test_migrate_reports_the_schema_version(ferryq: Run) -> None:
    assert "schema version" in ok(ferryq("migrate")).stdout
    reply = as_json(ferryq("migrate", "--json"))
    assert reply["schema_version"] >= 1
    assert reply["applied"] == []  # already up to date


# -- enqueue -------------------------------------------------------------------


def test_enqueue_prints_the_job_id(ferryq: Run) -> None:
    result = ok(ferryq("enqueue", "send", '["a@example.com"]'))
    assert "enqueued job 1" in result.stdout
    stored = job(ferryq, 1)
    assert stored["task"] == "send"
    assert stored["args"] == ["a@example.com"]
    assert stored["state"] == "ready"


def test_enqueue_keyword_args_and_options(ferryq: Run) -> None:
    job_id = enqueue(
        ferryq, "send", '{"to": "b@example.com"}', "--queue", "mail", "--delay", "30",
        "--priority", "10", "--ttr", "5", "--ttl", "3600", "--max-tries", "4", "--retry", "-2",
    )  # fmt: skip
    stored = job(ferryq, job_id)
    assert stored["args"] == {"to": "b@example.com"}
    assert stored["queue"] == "mail"
    assert stored["state"] == "scheduled"
    assert stored["priority"] == 10
    assert stored["ttr"] == 5
    assert stored["max_tries"] == 4
    assert stored["retry"]["kind"] == "fixed"
    assert stored["retry"]["seconds"] == [2]
    assert stored["expires_at"] == pytest.approx(stored["created_at"] + 3600)


def test_enqueue_with_a_unique_key_says_it_deduplicated(ferryq: Run) -> None:
    first = enqueue(ferryq, "send", "[1]", "--unique-key", "k")
    again = ferryq("enqueue", "send", "[2]", "--unique-key", "k")
    assert f"job {first} already exists" in ok(again).stdout
    reply = as_json(ferryq("enqueue", "send", "[3]", "--unique-key", "k", "--json"))
    assert reply == {"id": first, "created": False}
    assert len(as_json(ferryq("jobs", "ls", "--json"))) == 1


def test_enqueue_after_other_jobs_and_show_the_graph(ferryq_each: Run) -> None:
    first, second = enqueue(ferryq_each, "send", "[1]"), enqueue(ferryq_each, "send", "[2]")
    last = enqueue(ferryq_each, "send", "[3]", "--after", str(first), "--after", str(second),
                   "--after-failed", "run")  # fmt: skip
    assert job(ferryq_each, last)["state"] == "scheduled"
    explained = as_json(ferryq_each("jobs", "explain", str(last), "--json"))
    assert explained["reason"] == "dependencies"
    assert as_json(ferryq_each("jobs", "deps", str(last), "--json")) == {
        "after": [{"id": first, "ended": None}, {"id": second, "ended": None}],
        "dependents": [],
    }
    text = ok(ferryq_each("jobs", "deps", str(first))).stdout
    assert "waits for no job" in text and f"waited for by 1 job(s):\n  {last}  waiting" in text
    refused = ferryq_each("enqueue", "send", "[4]", "--after", "999999")
    assert refused.returncode != 0 and "--after: no job 999999" in refused.stderr
    assert len(as_json(ferryq_each("jobs", "ls", "--json"))) == 3


def test_enqueue_with_app_uses_the_task_defaults(ferryq: Run) -> None:
    job_id = enqueue(ferryq, "always_fails", '["x"]', "--app", TASKS)
    stored = job(ferryq, job_id)
    assert stored["max_tries"] == 2
    assert stored["retry"]["kind"] == "fixed"
    message = failed(ferryq("enqueue", "nope", "[]", "--app", TASKS), 2)
    assert "no task named 'nope'" in message


@pytest.mark.parametrize(
    ("args_json", "options", "named"),
    [
        ("not json", [], "ARGS_JSON"),
        ('"a string"', [], "ARGS_JSON"),
        ("42", [], "ARGS_JSON"),
        ("[]", ["--ttr", "0"], "--ttr"),
        ("[]", ["--timeout", "0"], "--timeout"),
        ("[]", ["--max-tries", "0"], "--max-tries"),
        ("[]", ["--priority", "40000000"], "--priority"),
        ("[]", ["--delay", "-1"], "--delay"),
        ("[]", ["--ttl", "0"], "--ttl"),
        ("[]", ["--delay", "30", "--ttl", "10"], "--ttl must be at least --delay"),
        ("[]", ["--unique-for", "10"], "--unique-for"),
        ("[]", ["--queue", "no spaces"], "--queue"),
        ("[]", ["--lane", ""], "lane"),
        ("[NaN]", [], "JSON"),
    ],
)
def test_invalid_enqueue_is_refused_and_writes_nothing(
    ferryq: Run, tmp_path: Path, args_json: str, options: list[str], named: str
) -> None:
    message = failed(ferryq("enqueue", "send", args_json, *options), 2)
    assert named in message
    assert not (tmp_path / "t.db").exists()  # refused before the database was opened


# -- jobs ----------------------------------------------------------------------


def test_jobs_ls_filters_and_pages(ferryq: Run) -> None:
    first = enqueue(ferryq, "send", '["alice"]', "--queue", "mail")
    second = enqueue(ferryq, "resize", '["bob.png"]')
    third = enqueue(ferryq, "send", '["carol"]', "--queue", "mail")
    assert ids(as_json(ferryq("jobs", "ls", "--json"))) == [third, second, first]
    assert ids(as_json(ferryq("jobs", "ls", "--queue", "mail", "--json"))) == [third, first]
    assert ids(as_json(ferryq("jobs", "ls", "--task", "resize", "--json"))) == [second]
    assert ids(as_json(ferryq("jobs", "ls", "--text", "bob", "--json"))) == [second]
    assert as_json(ferryq("jobs", "ls", "--state", "dead", "--json")) == []
    page = ok(ferryq("jobs", "ls", "--limit", "2"))
    assert f"--after {second}" in page.stdout
    after = as_json(ferryq("jobs", "ls", "--limit", "2", "--after", str(second), "--json"))
    assert ids(after) == [first]
    assert "send" in ok(ferryq("jobs", "ls")).stdout


def app_at(now: float) -> type[App]:
    """An App whose clock stands still at ``now``."""

    class Frozen(App):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, clock=lambda: now, **kwargs)

    return Frozen


def test_a_job_list_reads_the_time_from_the_apps_clock(
    ferryq: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job created today, by the App's clock, shows its time of day; else its date."""
    created = job(ferryq, enqueue(ferryq, "send", "[]"))["created_at"]
    moment = datetime.fromtimestamp(created, UTC)
    for now, shown in [(created, moment.strftime("%H:%M:%S")),
                       (created + 2 * 86400, moment.strftime("%Y-%m-%d %H:%M"))]:  # fmt: skip
        monkeypatch.setattr(settings, "App", app_at(now))
        assert shown in ok(ferryq("jobs", "ls")).stdout


def test_a_piped_table_prints_each_row_as_one_whole_line(ferryq: Run) -> None:
    task = "reports.monthly." + "t" * 134  # 150 characters
    lane = "tenant:" + "l" * 143
    enqueue(ferryq, task, "[]", "--lane", lane)
    ok(ferryq("lanes", "limit", lane, "2"))
    narrow = {"COLUMNS": "80"}  # rich's width for a pipe, unless told otherwise
    for command, name in [(("jobs", "ls"), task), (("jobs", "ls"), lane),
                          (("lanes", "ls"), lane), (("lanes", "limit"), lane)]:  # fmt: skip
        shown = ok(ferryq(*command, env=narrow)).stdout
        rows = [line for line in shown.splitlines() if name in line]
        assert len(rows) == 1, shown
        assert "…" not in shown
    [row] = [line for line in ok(ferryq("jobs", "ls")).stdout.splitlines() if task in line]
    assert row.split()[:4] == ["1", "ready", "default", task]


def test_jobs_show_and_explain(ferryq: Run) -> None:
    job_id = enqueue(ferryq, "send", '{"to": "a"}', "--delay", "600")
    shown = job(ferryq, job_id)
    for name in ("id", "state", "task", "queue", "lane", "attempts", "stage", "fence",
                 "created_at", "started_at", "finished_at", "result", "error"):  # fmt: skip
        assert name in shown
    page = ok(ferryq("jobs", "show", str(job_id))).stdout
    assert "scheduled" in page
    assert '"to": "a"' in page
    explained = as_json(ferryq("jobs", "explain", str(job_id), "--json"))
    assert explained["job_id"] == job_id
    assert explained["state"] == "scheduled"
    assert explained["reason"] == "scheduled"
    assert "scheduled until" in ok(ferryq("jobs", "explain", str(job_id))).stdout


def running_with_progress(url: str, job_id: int, report: dict[str, Any] | None) -> int:
    """Claim the job as worker w1 does, with ``report`` stored as its attempt's last
    progress (as a lease renewal writes it); the fence."""

    async def claim() -> int:
        store = open_store(url)
        await store.open()
        try:
            (claimed,) = await store.job_claim("default", ["default"], 1, "w1", time.time())
            assert claimed.id == job_id
            progress = {} if report is None else {job_id: json.dumps(report)}
            await store.job_leases([(job_id, claimed.fence)], [job_id], time.time(),
                                   progress=progress)  # fmt: skip
            return claimed.fence
        finally:
            await store.close()

    return asyncio.run(claim())


def finish_timed_out(url: str, job_id: int, fence: int) -> None:
    """End the attempt as a worker does when its time limit passed, with no try left."""
    error = {"type": "TimedOut", "message": "timed out: the attempt ran past its time limit "
             "of 30 s and was stopped", "traceback": None, "attempt": 1, "stage": None,
             "worker": "w1", "at": time.time()}  # fmt: skip

    async def finish() -> None:
        store = open_store(url)
        await store.open()
        try:
            now = time.time()
            await store.job_finish_many([Finish("dead", job_id, fence, now, now, error=error)])
        finally:
            await store.close()

    asyncio.run(finish())


def test_a_time_limit_and_progress_in_jobs_show_ls_and_explain(ferryq: Run, url: str) -> None:
    job_id = enqueue(ferryq, "resize", '["a.png"]', "--timeout", "30", "--max-tries", "1")
    assert job(ferryq, job_id)["timeout"] == 30
    page = ok(ferryq("jobs", "show", str(job_id))).stdout
    assert re.search(r"^timeout +30 s per attempt\s*$", page, re.M), page
    assert "progress" not in page  # not running, and nothing reported
    untimed = enqueue(ferryq, "resize", "[]", "--queue", "other")
    assert job(ferryq, untimed)["timeout"] is None
    assert re.search(r"^timeout +-\s*$", ok(ferryq("jobs", "show", str(untimed))).stdout, re.M)

    report = {"done": 4000, "total": 10000, "note": "resizing", "at": time.time() - 3}
    fence = running_with_progress(url, job_id, report)
    shown = job(ferryq, job_id)
    assert shown["state"] == "running" and shown["progress"] == report
    assert shown["timeout"] == 30
    page = ok(ferryq("jobs", "show", str(job_id))).stdout
    running = r"^progress +4,000 / 10,000 \(40%\) — resizing, \d+ s ago\s*$"
    assert re.search(running, page, re.M), page
    [row] = [line for line in ok(ferryq("jobs", "ls")).stdout.splitlines() if "resize" in line
             and line.split()[0] == str(job_id)]  # fmt: skip
    assert row.rstrip().endswith("on w1: 4,000 / 10,000 (40%)"), row
    explained = ok(ferryq("jobs", "explain", str(job_id))).stdout
    assert "running on worker w1 since" in explained
    assert "time limit 30 s: stopped at" in explained and "if still running" in explained
    assert "progress 4,000 / 10,000 (40%) — resizing, reported" in explained
    assert "timeout: 30 s" in explained
    data = as_json(ferryq("jobs", "explain", str(job_id), "--json"))["data"]
    assert data["timeout"] == 30 and data["progress"] == report
    assert data["deadline"] == pytest.approx(shown["started_at"] + 30)

    finish_timed_out(url, job_id, fence)
    page = ok(ferryq("jobs", "show", str(job_id))).stdout
    assert re.search(r"^timed out after 30 s \(TimedOut\)  \(attempt 1, worker w1, at ", page,
                     re.M), page  # fmt: skip
    assert re.search(r"^last progress report +4,000 / 10,000 \(40%\) — resizing, reported at "
                     r"\d{4}-", page, re.M), page  # fmt: skip
    assert re.search(r"^ *1 .* w1 +timed out after 30 s\s*$", page, re.M), page  # errors table
    assert "dead" in ok(ferryq("jobs", "ls", "--state", "dead")).stdout
    assert "timed out after 30 s" in ok(ferryq("dead", "ls")).stdout
    assert ok(ferryq("jobs", "explain", str(job_id))).stdout.startswith(
        f"job {job_id}: dead since "
    )


def test_a_running_job_without_a_report_or_with_a_count_alone(ferryq: Run, url: str) -> None:
    job_id = enqueue(ferryq, "crawl", "[]")
    running_with_progress(url, job_id, None)
    page = ok(ferryq("jobs", "show", str(job_id))).stdout
    assert re.search(r"^progress +none reported\s*$", page, re.M), page
    other = enqueue(ferryq, "crawl", "[]")
    running_with_progress(url, other, {"done": 17, "total": None, "note": None,
                                       "at": time.time()})  # fmt: skip
    page = ok(ferryq("jobs", "show", str(other))).stdout
    assert re.search(r"^progress +17, \d+ s ago\s*$", page, re.M), page


def store_times(url: str, job_id: int, **times: float) -> None:
    """Write times into a stored job as they are, past every check of enqueue."""
    assignments = ", ".join(f"{name} = %s" for name in times)
    values = [*times.values(), job_id]
    if url.startswith("sqlite:"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as lite:
            lite.execute(
                f"UPDATE ferryq_jobs SET {assignments.replace('%s', '?')} WHERE id = ?", values
            )
        lite.close()
    else:
        with psycopg.connect(url) as pg:
            pg.execute(f"UPDATE ferryq_jobs SET {assignments} WHERE id = %s", values)


def test_jobs_at_times_beyond_any_calendar_are_shown(ferryq_each: Run, backend_url: str) -> None:
    job_id = enqueue(ferryq_each, "send", "[]", "--delay", "60", "--ttl", "120")
    store_times(backend_url, job_id, run_at=1e300, expires_at=math.inf, created_at=-1e300)
    listed = ok(ferryq_each("jobs", "ls")).stdout
    assert "due Unix time 1e+300" in listed
    assert "Unix time -1e+300" in listed
    page = ok(ferryq_each("jobs", "show", str(job_id))).stdout
    assert "Unix time 1e+300" in page and "Unix time inf" in page
    explained = ok(ferryq_each("jobs", "explain", str(job_id))).stdout
    assert "scheduled until Unix time 1e+300" in explained
    assert job(ferryq_each, job_id)["run_at"] == 1e300


#: The commands that take job ids.
BY_ID = [
    ["jobs", "show"],
    ["jobs", "explain"],
    ["jobs", "cancel"],
    ["jobs", "retry"],
    ["dead", "respawn"],
    ["dead", "purge", "--yes"],
]


@pytest.mark.parametrize("command", BY_ID)
def test_an_unknown_job_is_not_found(ferryq: Run, command: list[str]) -> None:
    ok(ferryq("migrate"))
    assert failed(ferryq(*command, "999"), 1) == "Error: no job with id 999"


@pytest.mark.parametrize("command", [*BY_ID, ["jobs", "ls", "--after"], ["dead", "ls", "--after"]])
@pytest.mark.parametrize("job_id", ["9223372036854775808", "0"])
def test_a_job_id_beyond_what_the_database_stores_is_a_usage_error(
    ferryq_each: Run, command: list[str], job_id: str
) -> None:
    result = ferryq_each(*command, job_id)
    assert result.returncode == 2, f"{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr
    assert "9223372036854775807" in result.stderr.strip().splitlines()[-1]


def test_cancel_then_retry(ferryq: Run) -> None:
    job_id = enqueue(ferryq, "send", "[]")
    assert f"job {job_id} cancelled" in ok(ferryq("jobs", "cancel", str(job_id))).stdout
    assert job(ferryq, job_id)["state"] == "cancelled"
    assert f"respawned 1 job(s): {job_id}" in ok(ferryq("jobs", "retry", str(job_id))).stdout
    assert job(ferryq, job_id)["state"] == "ready"


def test_retry_of_a_job_that_did_not_end_changes_nothing(ferryq: Run) -> None:
    done = enqueue(ferryq, "send", "[]")
    ok(ferryq("jobs", "cancel", str(done)))
    waiting = enqueue(ferryq, "send", "[]")
    message = failed(ferryq("jobs", "retry", str(done), str(waiting)), 2)
    assert f"job {waiting} is ready" in message
    assert "cannot be retried (only dead, cancelled or expired jobs)" in message
    assert job(ferryq, done)["state"] == "cancelled"


# -- worker and dead letters ---------------------------------------------------


def run_burst(ferryq: Run, **env: str) -> str:
    return ok(ferryq("worker", TASKS, "--burst", "--concurrency", "4", env=env)).stderr


def make_dead(ferryq: Run, count: int) -> list[int]:
    made = [
        enqueue(ferryq, "always_fails", f'["reason {i}"]', "--app", TASKS) for i in range(count)
    ]
    run_burst(ferryq)
    return made


def test_worker_runs_jobs_and_logs(ferryq: Run, tmp_path: Path) -> None:
    job_id = enqueue(ferryq, "echo", '[{"n": 1}]')
    # The module's App reads FERRYQ_URL; --url, given explicitly, wins over it.
    log = run_burst(ferryq, FERRYQ_URL=f"sqlite:///{tmp_path}/other.db")
    assert "ferryq.worker" in log
    assert job(ferryq, job_id)["state"] == "succeeded"
    assert job(ferryq, job_id)["result"] == {"n": 1}


def test_the_worker_shares_the_interpreter_between_its_threads_every_millisecond(
    ferryq: Run,
) -> None:
    job_id = enqueue(ferryq, "switch_interval", "[]", "--app", TASKS)
    run_burst(ferryq)
    assert job(ferryq, job_id)["result"] == WORKER_SWITCH_INTERVAL != sys.getswitchinterval()


def test_dead_jobs_show_their_errors(ferryq: Run) -> None:
    [job_id] = make_dead(ferryq, 1)
    dead = as_json(ferryq("dead", "ls", "--json"))
    assert ids(dead) == [job_id]
    stored = job(ferryq, job_id)
    assert stored["state"] == "dead"
    assert stored["attempts"] == 2
    assert stored["error"]["message"] == "reason 0"
    assert "RuntimeError" in stored["error"]["traceback"]
    assert len(stored["errors"]) == 2
    page = ok(ferryq("jobs", "show", str(job_id))).stdout
    assert "Traceback" in page
    assert "reason 0" in ok(ferryq("dead", "ls")).stdout
    explained = as_json(ferryq("jobs", "explain", str(job_id), "--json"))
    assert explained["reason"] == "dead"


def test_dead_respawn_and_purge_by_id(ferryq: Run) -> None:
    first, second = make_dead(ferryq, 2)
    assert "respawned 1 job(s)" in ok(ferryq("dead", "respawn", str(first))).stdout
    assert job(ferryq, first)["state"] == "ready"
    assert job(ferryq, first)["attempts"] == 0
    message = failed(ferryq("dead", "purge", str(first), "--yes"), 2)
    assert f"job {first} is ready" in message
    declined = ferryq("dead", "purge", str(second), input="n\n")
    assert declined.returncode == 1
    assert job(ferryq, second)["state"] == "dead"
    assert "purged 1" in ok(ferryq("dead", "purge", str(second), input="y\n")).stdout
    failed(ferryq("jobs", "show", str(second)), 1)


def test_dead_respawn_and_purge_all(ferryq: Run) -> None:
    made = make_dead(ferryq, 3)
    ok(ferryq("enqueue", "echo", "[1]"))
    assert "respawned 3" in ok(ferryq("dead", "respawn", "--all")).stdout
    assert as_json(ferryq("dead", "ls", "--json")) == []
    run_burst(ferryq)
    assert sorted(ids(as_json(ferryq("dead", "ls", "--json")))) == made
    assert "no dead jobs" in ok(ferryq("dead", "purge", "--all", "--queue", "other")).stdout
    assert "purged 3" in ok(ferryq("dead", "purge", "--all", "--yes")).stdout
    assert as_json(ferryq("dead", "ls", "--json")) == []
    assert "no dead jobs" in ok(ferryq("dead", "purge", "--all")).stdout


def test_retry_respawn_and_purge_speak_json(ferryq: Run) -> None:
    first, second, third = make_dead(ferryq, 3)
    assert as_json(ferryq("dead", "respawn", str(first), "--json")) == {"respawned": [first]}
    ok(ferryq("jobs", "cancel", str(first)))
    assert as_json(ferryq("jobs", "retry", str(first), "--json")) == {"respawned": [first]}
    assert as_json(ferryq("dead", "purge", str(second), "--yes", "--json")) == {"purged": 1}
    assert as_json(ferryq("dead", "respawn", "--all", "--json")) == {"respawned": 1}
    assert job(ferryq, third)["state"] == "ready"
    assert as_json(ferryq("dead", "purge", "--all", "--yes", "--json")) == {"purged": 0}


def test_dead_respawn_needs_ids_or_all(ferryq: Run) -> None:
    assert ferryq("dead", "respawn").returncode == 2
    assert ferryq("dead", "respawn", "1", "--all").returncode == 2


def test_stats(ferryq: Run) -> None:
    enqueue(ferryq, "send", "[]", "--queue", "mail")
    enqueue(ferryq, "send", "[]", "--queue", "mail")
    enqueue(ferryq, "echo", "[1]")
    run_burst(ferryq)
    stats = as_json(ferryq("stats", "--json"))
    assert stats["queues"]["mail"]["ready"] == 2
    assert stats["queues"]["default"]["succeeded"] == 1
    assert stats["workers"] == []  # the burst worker left
    table = ok(ferryq("stats")).stdout
    assert "mail" in table
    assert "no live workers" in table


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("no_such_module:app", "cannot import module 'no_such_module'"),
        ("tests.integration.nothing_here:app", "cannot import module"),
        ("tests.integration.cli_tasks:nope", "has no attribute 'nope'"),
        ("tests.integration.cli_tasks:echo", "not a ferryq.App"),
        ("json", "has no attribute 'app'"),
        (":app", "is not MODULE:APP"),
    ],
)
def test_worker_with_a_bad_target_says_why(ferryq: Run, target: str, expected: str) -> None:
    assert expected in failed(ferryq("worker", target, "--burst"), 2)


def test_worker_with_a_bad_queue_name_says_why(ferryq: Run) -> None:
    assert "queue" in failed(ferryq("worker", TASKS, "--burst", "--queues", "a b"), 2)


# -- lanes ---------------------------------------------------------------------


def rules(ferryq: Run) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = as_json(ferryq("lanes", "limit", "--json"))
    return found


def lanes(ferryq: Run) -> dict[str, dict[str, Any]]:
    return {info["lane"]: info for info in as_json(ferryq("lanes", "ls", "--json"))}


def test_lane_limits_are_set_shown_and_cleared(ferryq_each: Run) -> None:
    ferryq = ferryq_each
    ok(ferryq("migrate"))
    assert "no lane rules" in ok(ferryq("lanes", "limit")).stdout
    assert rules(ferryq) == []
    said = ok(ferryq("lanes", "limit", "tenant:*", "2", "--on-dead", "halt")).stdout
    assert "tenant:*: limit 2, on dead halt" in said
    set_reply = as_json(ferryq("lanes", "limit", "post:1", "3", "--json"))
    assert set_reply == {"pattern": "post:1", "limit": 3, "on_dead": "continue", "rate": None}
    assert rules(ferryq) == [
        {"pattern": "post:1", "limit": 3, "on_dead": "continue", "rate": None},
        {"pattern": "tenant:*", "limit": 2, "on_dead": "halt", "rate": None},
    ]
    listed = ok(ferryq("lanes", "limit")).stdout
    assert "tenant:*" in listed
    assert "post:1" in listed
    # A lane name shows the rule it follows: its own, a prefix's, or the default.
    shown = ok(ferryq("lanes", "limit", "tenant:acme")).stdout
    assert "tenant:acme: limit 2, on dead halt (rule tenant:*)" in shown
    assert as_json(ferryq("lanes", "limit", "tenant:acme", "--json")) == {
        "pattern": "tenant:acme",
        "rule": {"pattern": "tenant:*", "limit": 2, "on_dead": "halt", "rate": None},
        "default": False,
    }
    assert "(the default)" in ok(ferryq("lanes", "limit", "post:2")).stdout
    assert as_json(ferryq("lanes", "limit", "post:2", "--json"))["default"] is True
    assert "cleared the rule for post:1" in ok(ferryq("lanes", "limit", "post:1", "--clear")).stdout
    assert "nothing changed" in ok(ferryq("lanes", "limit", "post:1", "--clear")).stdout
    cleared = as_json(ferryq("lanes", "limit", "post:1", "--clear", "--json"))
    assert cleared == {"pattern": "post:1", "cleared": False}
    assert [rule["pattern"] for rule in rules(ferryq)] == ["tenant:*"]


def test_lane_rates_are_set_shown_and_cleared(ferryq_each: Run) -> None:
    ferryq = ferryq_each
    ok(ferryq("lanes", "limit", "api:*", "3", "--on-dead", "halt"))
    said = ok(ferryq("lanes", "rate", "api:*", "10", "--per", "2")).stdout
    assert "api:*: limit 3, on dead halt, rate 10 per 2 s" in said
    rated = {"pattern": "api:*", "limit": 3, "on_dead": "halt", "rate": {"n": 10, "per": 2.0}}
    assert rules(ferryq) == [rated]
    assert "10 per 2 s" in ok(ferryq("lanes", "limit")).stdout
    ok(ferryq("lanes", "limit", "api:*", "4"))  # a limit keeps the rate
    assert rules(ferryq) == [{**rated, "limit": 4}]
    assert as_json(ferryq("lanes", "rate", "new", "1", "--json"))["limit"] == 1
    for bad, named in ((["api:*", "0"], "rate's n"), (["api:*", "1", "--per", "0"], "--per"),
                       (["api:*"], "N or --clear"), (["api:*", "2", "--clear"], "N or --clear"),
                       (["a*b", "2"], "may only end"),
                       (["a*b", "--clear"], "may only end")):  # fmt: skip
        result = ferryq("lanes", "rate", *bad)
        assert result.returncode == 2, f"{result.stdout}\n{result.stderr}"
        assert named in result.stderr.strip().splitlines()[-1]
    assert rules(ferryq)[0] == {**rated, "limit": 4}
    assert "limit 4, on dead halt" in ok(ferryq("lanes", "rate", "api:*", "--clear")).stdout
    assert rules(ferryq)[0] == {**rated, "limit": 4, "rate": None}
    assert "nothing changed" in ok(ferryq("lanes", "rate", "none:*", "--clear")).stdout


def test_a_changed_lane_limit_keeps_its_policy(ferryq_each: Run) -> None:
    ferryq = ferryq_each
    ok(ferryq("lanes", "limit", "import:*", "1", "--on-dead", "halt"))
    assert "import:*: limit 2, on dead halt" in ok(ferryq("lanes", "limit", "import:*", "2")).stdout
    ok(ferryq("lanes", "limit", "import:*", "3", "--on-dead", "continue"))
    assert rules(ferryq) == [
        {"pattern": "import:*", "limit": 3, "on_dead": "continue", "rate": None}
    ]


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        (["x", "0"], "lane limit"),
        (["x", "100001"], "lane limit"),
        (["x", "two"], "LIMIT"),
        (["a*b", "2"], "'*' may only end a pattern"),
        (["a*b", "--clear"], "'*' may only end a pattern"),
        (["a*b"], "'*' may only end a pattern"),
        (["", "2"], "lane pattern"),
        (["x", "2", "--on-dead", "stop"], "--on-dead"),
        (["x", "--on-dead", "halt"], "--on-dead goes with LIMIT"),
        (["x", "2", "--clear"], "LIMIT or --clear"),
        (["--clear"], "--clear needs a PATTERN"),
    ],
)
def test_invalid_lane_limits_are_refused_and_change_nothing(
    ferryq: Run, arguments: list[str], named: str
) -> None:
    ok(ferryq("lanes", "limit", "x", "5"))
    result = ferryq("lanes", "limit", *arguments)
    assert result.returncode == 2, f"{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr
    assert named in result.stderr.strip().splitlines()[-1]
    assert rules(ferryq) == [{"pattern": "x", "limit": 5, "on_dead": "continue", "rate": None}]


def test_lanes_ls_and_explain_of_waiting_jobs(ferryq_each: Run) -> None:
    ferryq = ferryq_each
    ok(ferryq("migrate"))
    assert "no lanes" in ok(ferryq("lanes", "ls")).stdout
    ok(ferryq("lanes", "limit", "tenant:*", "2"))
    slow = [enqueue(ferryq, "send", f"[{i}]", "--lane", "tenant:a") for i in range(4)]
    quick = enqueue(ferryq, "send", "[]", "--lane", "tenant:b")
    assert [job(ferryq, i)["state"] for i in slow] == ["ready", "ready", "waiting", "waiting"]
    assert job(ferryq, quick)["state"] == "ready"
    found = lanes(ferryq)
    assert list(found) == ["tenant:a", "tenant:b"]  # busiest first
    assert found["tenant:a"] == {
        "lane": "tenant:a", "waiting": 2, "admitted": 2, "running": 0, "halted_by": None,
        "rule": {"pattern": "tenant:*", "limit": 2, "on_dead": "continue", "rate": None},
    }  # fmt: skip
    assert found["tenant:b"]["admitted"] == 1
    table = ok(ferryq("lanes", "ls")).stdout
    assert "tenant:a" in table  # as it is: no emoji for ":a"
    assert "tenant:*" in table
    assert "add --limit" in ok(ferryq("lanes", "ls", "--limit", "1")).stdout
    assert list(as_json(ferryq("lanes", "ls", "--limit", "1", "--json"))[0]) == list(
        found["tenant:a"]
    )

    explained = as_json(ferryq("jobs", "explain", str(slow[3]), "--json"))
    assert explained["state"] == "waiting"
    assert explained["reason"] == "lane_limit"
    data = explained["data"]
    assert (data["lane"], data["position"], data["limit"]) == ("tenant:a", 2, 2)
    assert [held["id"] for held in data["held"]] == slow[:2]
    assert "at its limit of 2" in ok(ferryq("jobs", "explain", str(slow[3]))).stdout

    # Lowering the limit sends a job not started yet back to waiting, behind the first.
    ok(ferryq("lanes", "limit", "tenant:a", "1"))
    assert job(ferryq, slow[1])["state"] == "waiting"
    explained = as_json(ferryq("jobs", "explain", str(slow[1]), "--json"))
    assert explained["reason"] == "lane_order"
    assert explained["data"]["waiting_for"] == slow[0]
    assert lanes(ferryq)["tenant:a"]["rule"]["pattern"] == "tenant:a"


def test_a_halted_lane_shows_and_purge_releases_it(ferryq_each: Run) -> None:
    ferryq = ferryq_each
    ok(ferryq("lanes", "limit", "import:*", "1", "--on-dead", "halt"))
    first = enqueue(ferryq, "always_fails", '["bad row"]', "--app", TASKS, "--lane", "import:7")
    second = enqueue(ferryq, "echo", "[2]", "--lane", "import:7")
    run_burst(ferryq)
    assert job(ferryq, first)["state"] == "dead"
    assert job(ferryq, second)["state"] == "waiting"
    assert lanes(ferryq)["import:7"]["halted_by"] == first
    assert str(first) in ok(ferryq("lanes", "ls")).stdout
    explained = as_json(ferryq("jobs", "explain", str(second), "--json"))
    assert explained["reason"] == "lane_halted"
    assert explained["data"] == {"lane": "import:7", "halted_by": first}
    assert "respawn or purge" in ok(ferryq("jobs", "explain", str(second))).stdout
    ok(ferryq("dead", "purge", str(first), "--yes"))
    assert job(ferryq, second)["state"] == "ready"
    run_burst(ferryq)
    assert job(ferryq, second)["state"] == "succeeded"
    assert lanes(ferryq) == {}


# -- demo ----------------------------------------------------------------------


def test_demo_runs_the_story_and_prints_a_summary(ferryq: Run) -> None:
    # As a new user runs it: .venv not activated, so no ferryq on the PATH; and not at
    # a terminal (stdin and stdout are pipes), so the demo ends by itself.
    scripts = Path(sys.executable).parent
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if Path(p) != scripts)
    shown = ok(ferryq("demo", "--seconds", "20", input="", env={"PATH": path})).stdout
    assert "jobs finished" in shown
    assert "the flaky upload" in shown
    assert "jobs explain" in shown
    assert "dead ls" in shown
    assert "one at a time, in the order written" in shown  # whole lines: stdout is a pipe
    assert "lane 'tenant:slowco' is at its limit of 2" in shown
    assert "lanes ls" in shown
    # The commands it suggests work as printed, pasted into that shell.
    lines = [line.strip() for line in shown.splitlines()]
    suggested = lines[lines.index("try next:") + 1]
    assert suggested.startswith(".venv/bin/ferryq --url sqlite:///")
    listed = subprocess.run(["sh", "-c", suggested], cwd=ROOT, capture_output=True, text=True,
                            env={**os.environ, "PATH": path}, timeout=60)  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    assert "succeeded" in listed.stdout
    assert "(or first . .venv/bin/activate, then plain ferryq)" in lines
    # Its dashboard stopped with it: it says so, and how to serve the database again.
    assert "the dashboard stopped with the demo; to serve it again (Ctrl-C stops it), run" in lines
    [serve] = [line for line in lines if line.startswith("FERRYQ_ADMIN_CREDENTIAL=admin:")]
    database = suggested.split()[2]
    assert serve.endswith(f" .venv/bin/ferryq server --url {database}")


def test_stages_in_jobs_show_and_explain_and_periodic_tasks_in_stats(ferryq: Run) -> None:
    tasks = "tests.integration.cli_pipeline:app"
    job_id = enqueue(ferryq, "two_stages", "[]", "--app", tasks)
    ok(ferryq("worker", tasks, "--burst"))
    shown = job(ferryq, job_id)
    assert shown["state"] == "succeeded" and shown["result"] == {"from": "first"}
    assert [(s["stage"], s["outcome"]) for s in shown["stages"]] == [
        (None, "next"), ("finish", "succeeded"),
    ]  # fmt: skip
    page = ok(ferryq("jobs", "show", str(job_id))).stdout
    assert "stages (2)" in page and "finish" in page and "tries" in page
    explained = ok(ferryq("jobs", "explain", str(job_id))).stdout
    assert "(stage 2, 'finish')" in explained
    assert "first stage: next (1 try); finish: succeeded (1 try)" in explained
    (periodic,) = as_json(ferryq("stats", "--json"))["periodic"]
    assert periodic["task"] == "daily_report" and periodic["schedule"] == "every 86400 s"
    assert periodic["next_tick"] % 86400 == 0 and periodic["last_job"] is None
    table = ok(ferryq("stats")).stdout
    assert "periodic tasks" in table and "daily_report" in table


@pytest.mark.parametrize("query", ["synchronus=full", "synchronous=full&journal=off", "x"])
def test_an_unknown_sqlite_url_option_is_refused(ferryq: Run, tmp_path: Path, query: str) -> None:
    url = f"sqlite:///{tmp_path}/other.db?{query}"
    message = failed(ferryq("--url", url, "migrate"), 2)
    assert "unknown SQLite URL option" in message and "the options are synchronous" in message
    assert not (tmp_path / "other.db").exists()
    ok(ferryq("--url", f"sqlite:///{tmp_path}/other.db?synchronous=full", "migrate"))


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e400"])
@pytest.mark.parametrize(
    ("command", "option"),
    [
        (["enqueue", "send", "[]"], "--delay"),
        (["enqueue", "send", "[]"], "--priority"),
        (["enqueue", "send", "[]"], "--ttl"),
        (["enqueue", "send", "[]"], "--ttr"),
        (["enqueue", "send", "[]"], "--timeout"),
        (["enqueue", "send", "[]"], "--retry"),
        (["enqueue", "send", "[]", "--unique-key", "k"], "--unique-for"),
        (["worker", TASKS, "--burst"], "--grace"),
        (["worker", TASKS, "--burst"], "--retention-days"),
        (["demo"], "--seconds"),
    ],
)
def test_float_options_refuse_what_is_not_a_finite_number(
    ferryq: Run, tmp_path: Path, command: list[str], option: str, value: str
) -> None:
    result = ferryq(*command, option, value)
    assert result.returncode == 2, f"{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr
    said = result.stderr.strip().splitlines()[-1]
    assert said.startswith(f"Error: Invalid value for '{option}': ")
    assert f"'{value}' is not a finite number." in said or "is not in the range" in said
    assert not (tmp_path / "t.db").exists()


def test_an_option_name_in_the_refused_value_stays_as_given(ferryq: Run) -> None:
    message = failed(ferryq("enqueue", "send", "[]", "--queue", "bad queue"), 2)
    assert message.startswith("Error: --queue must be")
    assert message.endswith("(got 'bad queue')")
    message = failed(ferryq("enqueue", "send", "[]", "--unique-for", "5"), 2)
    assert message == "Error: --unique-for needs a --unique-key"


def test_every_job_option_is_one_of_enqueue_or_left_out_on_purpose() -> None:
    """A new job option fails this until ``enqueue`` takes it, or it is listed here."""
    left_out = {"namespace", "run_at", "stage", "context", "meta"}  # --namespace is global
    assert set(OPTION_NAMES) - set(FLAGS) == left_out
    assert FLAGS["max_tries"] == "--max-tries"


@pytest.mark.parametrize("task", ["", " "])
def test_an_empty_task_name_is_refused(ferryq: Run, tmp_path: Path, task: str) -> None:
    assert failed(ferryq("enqueue", task, "[]"), 2) == "Error: TASK must be a task name, not empty"
    assert not (tmp_path / "t.db").exists()


def test_args_json_is_optional_and_shown_so(ferryq: Run) -> None:
    assert "Usage: ferryq enqueue [OPTIONS] TASK [ARGS_JSON]" in ok(ferryq("enqueue", "-h")).stdout
    assert job(ferryq, enqueue(ferryq, "send"))["args"] == []


@pytest.mark.parametrize("command", [["worker", TASKS, "--burst"], ["jobs", "ls"], ["migrate"]])
def test_an_unreachable_database_exits_2(ferryq: Run, command: list[str]) -> None:
    unreachable = "postgresql://ferryq@127.0.0.1:1/nothing"
    message = failed(ferryq("--url", unreachable, *command), 2)
    assert message.startswith("Error: cannot connect to PostgreSQL at ")


#: Commands that only read: none of them creates a database.
READ_ONLY = [
    ["jobs", "ls"], ["jobs", "show", "1"], ["jobs", "explain", "1"], ["dead", "ls"],
    ["lanes", "ls"], ["lanes", "limit"], ["lanes", "limit", "x"], ["stats"], ["token", "ls"],
]  # fmt: skip


@pytest.mark.parametrize("command", READ_ONLY)
def test_a_command_that_reads_creates_no_database(
    ferryq: Run, tmp_path: Path, command: list[str]
) -> None:
    message = failed(ferryq(*command), 2)
    assert message == f"Error: no ferryq database at {tmp_path}/t.db (set FERRYQ_URL or --url)"
    assert not list(tmp_path.glob("t.db*"))


def test_jobs_ls_in_a_folder_without_a_database_names_the_file_it_looked_for(
    tmp_path: Path,
) -> None:
    environ = {name: value for name, value in os.environ.items() if name != "FERRYQ_URL"}
    result = subprocess.run(
        [sys.executable, "-m", "ferryq", "jobs", "ls"],
        capture_output=True, text=True, env=environ, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    message = failed(result, 2)
    assert message == f"Error: no ferryq database at {tmp_path}/ferryq.db (set FERRYQ_URL or --url)"
    assert list(tmp_path.iterdir()) == []


#: Commands that write: each creates the database.
WRITING = [["migrate"], ["enqueue", "send"], ["worker", TASKS, "--burst"]]


@pytest.mark.parametrize("command", WRITING)
def test_a_command_that_writes_creates_the_database(
    ferryq: Run, tmp_path: Path, command: list[str]
) -> None:
    ok(ferryq(*command))
    assert (tmp_path / "t.db").is_file()


@pytest.mark.parametrize("doing", ["opening", "writing"])
def test_a_full_disk_is_said_in_one_line_and_reads_go_on(tmp_path: Path, doing: str) -> None:
    with tmpfs(tmp_path / "volume", "2m") as volume, contextlib.ExitStack() as stack:
        ferryq = runner(f"sqlite:///{volume}/t.db", tmp_path)
        ok(ferryq("enqueue", "echo", "[1]"))
        if doing == "writing":  # another process has it open: its -shm file stays
            held = stack.enter_context(contextlib.closing(sqlite3.connect(volume / "t.db")))
            held.execute("SELECT count(*) FROM ferryq_jobs").fetchone()
        filler = fill(volume)
        for command in (["enqueue", "echo", "[2]"], ["worker", TASKS, "--burst"]):
            result = ferryq(*command)
            assert result.returncode == 2, f"{command}: {result.stderr}"
            assert "Traceback" not in result.stderr
            said = result.stderr.strip().splitlines()[-1]
            full = f"Error: SQLite database {volume}/t.db: the disk is full ({doing}: "
            assert said.startswith(full), said
        assert [job["args"] for job in as_json(ferryq("jobs", "ls", "--json"))] == [[1]]
        filler.unlink()
        ok(ferryq("enqueue", "echo", "[3]"))
