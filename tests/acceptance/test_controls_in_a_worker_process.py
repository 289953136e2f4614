"""Time limits, cancellation and the attempt log in a real ``ferryq worker`` process, on
real time: what an operator sees with ``--log-format json``."""

from __future__ import annotations

import json
from typing import Any

import ferryq
from tests.acceptance.conftest import Workers
from tests.acceptance.controls_app import app as tasks_app
from tests.processes import START_SECONDS, Process, wait_until

TARGET = "tests.acceptance.controls_app:app"


def _worker(workers: Workers, *args: str, level: str = "info") -> Process:
    return workers.worker("worker", TARGET, "--log-format", "json", "--log-level", level,
                          *args, module="ferryq")  # fmt: skip


def _json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _starts(workers: Workers) -> list[tuple[str, int, int, float]]:
    starts = []
    for line in workers.log_lines():
        name, job_id, attempt, at = line.split()
        starts.append((name, int(job_id), int(attempt), float(at)))
    return starts


def _enqueue(app: ferryq.App, name: str) -> int:
    """Enqueue a task of controls_app with its options, from an App on the test's URL."""
    task = tasks_app.tasks[f"tests.acceptance.controls_app.{name}"]
    options = task.defaults
    return app.enqueue(task.name, [], timeout=options.timeout, max_tries=options.max_tries,
                       retry=options.retry).id  # fmt: skip


def test_time_limits_and_the_attempt_log_in_a_real_worker(workers: Workers) -> None:
    app = ferryq.App(workers.url)
    try:
        jobs = {name: _enqueue(app, name) for name in ("sleepy", "spin", "flaky", "bad_input")}
        worker = _worker(workers, "--burst", "--concurrency", "4")
        assert worker.wait() == 0, worker.describe()
        lines = _json_lines(worker.stderr())
        attempts = [line for line in lines if line["logger"] == "ferryq.attempts"]
        by_job: dict[int, list[dict[str, Any]]] = {}
        for line in attempts:
            by_job.setdefault(line["job_id"], []).append(line)
        for name in ("sleepy", "spin"):  # each try stopped at its limit, then dead
            job = app.get_job(jobs[name])
            assert job.state == "dead" and [e["type"] for e in job.errors] == ["TimedOut"] * 2
            said = by_job[jobs[name]]
            assert [(x["attempt"], x["outcome"], x["timed_out"]) for x in said] == [
                (1, "retry", True), (2, "dead", True)
            ]  # fmt: skip
            for line in said:  # stopped at its limit, not before (how soon after: with
                assert line["duration"] >= 1.0, line  # time injected, tests/integration)
                assert line["error"].startswith("TimedOut: timed out")
                assert line["task"] == f"tests.acceptance.controls_app.{name}"
                assert line["max_tries"] == 2 and line["queue"] == "default"
        assert [(x["outcome"], x["level"]) for x in by_job[jobs["flaky"]]] == [
            ("retry", "WARNING"), ("succeeded", "INFO")
        ]  # fmt: skip
        assert by_job[jobs["flaky"]][0]["error"] == "ConnectionError: first try fails"
        (dead,) = by_job[jobs["bad_input"]]  # fail_on: dead at its first try
        assert (dead["outcome"], dead["level"], dead["attempt"]) == ("dead", "ERROR", 1)
        assert dead["error"] == "ValueError: not a number: 'x'"
    finally:
        app.close()


def test_cancel_stops_a_sync_handler_that_never_looks(workers: Workers) -> None:
    app = ferryq.App(workers.url)
    try:
        job_id = _enqueue(app, "deaf")
        worker = _worker(workers)
        wait_until(lambda: any(start[0] == "deaf" for start in _starts(workers)),
                   within=START_SECONDS, what="the handler started")  # fmt: skip
        app.cancel(job_id)
        # The handler never ends by itself: only the worker's interruption, at the
        # heartbeat that brings it the cancel, ends the attempt (how soon, with time
        # injected: tests/integration/test_controls.py).
        wait_until(lambda: app.get_job(job_id).state == "cancelled", within=START_SECONDS,
                   what="the job cancelled")  # fmt: skip
        assert worker.stop() == 0, worker.describe()
    finally:
        app.close()


def test_at_warning_the_worker_logs_failed_attempts_only(workers: Workers) -> None:
    app = ferryq.App(workers.url)
    try:
        _enqueue(app, "flaky")
        worker = _worker(workers, "--burst", level="warning")
        assert worker.wait() == 0, worker.describe()
        outcomes = [x.get("outcome") for x in _json_lines(worker.stderr())]
        assert outcomes == ["retry"]
    finally:
        app.close()
