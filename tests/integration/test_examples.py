"""The examples run as their docstrings say, and do what they claim."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx

import ferryq
from tests.processes import Processes, python

ROOT = Path(__file__).resolve().parents[2]


def test_video_pipeline(backend_url: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "examples.video_pipeline"], cwd=ROOT, capture_output=True,
        text=True, timeout=120, env={**os.environ, "FERRYQ_URL": backend_url},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "holiday.mov: succeeded: {'url': 'https://cdn.example/holiday.mp4', 'seconds': 110}",
        "    stages (tries): audit next (1), transcode next (1), publish succeeded (1)",
        "shaky-interview.mkv: succeeded: "
        "{'url': 'https://cdn.example/shaky-interview.mp4', 'seconds': 190}",
        "    stages (tries): audit next (1), transcode next (2), publish succeeded (1)",
        "notes.txt: dead: notes.txt is not a video",
        "    stages (tries): audit dead (1)",
    ]


def test_fastapi_sqlalchemy(backend_url: str, processes: Processes) -> None:
    """The service as its docstring starts it, over HTTP: an order and its job commit
    together, and the worker sends its receipt; an order refused after its enqueue
    leaves no job behind."""
    env = {"FERRYQ_URL": backend_url}
    service = processes.start(
        python("uvicorn", "examples.fastapi_sqlalchemy.api:api", "--port", "0"),
        env=env, name="service",
    )  # fmt: skip
    started = service.wait_for(re.compile(r"Uvicorn running on http://127\.0\.0\.1:\d+"))
    base = re.findall(r"Uvicorn running on (http://127\.0\.0\.1:\d+)", started)[0]
    service.wait_for("Application startup complete")
    with httpx.Client(base_url=base, timeout=30) as http:
        placed = http.post("/orders", json={"item": "tea", "quantity": 2})
        assert placed.status_code == 201, placed.text
        refused = http.post("/orders", json={"item": "cake", "quantity": 0})
        assert refused.status_code == 422, refused.text
        worker = processes.start(
            python("ferryq", "worker", "examples.fastapi_sqlalchemy.jobs:queue", "--burst"),
            env=env, name="worker",
        )  # fmt: skip
        assert worker.wait() == 0, worker.describe()
        order = http.get(f"/orders/{placed.json()['order']}").json()
    assert order == {"item": "tea", "quantity": 2, "receipt_sent": True}
    app = ferryq.App(backend_url)
    try:
        jobs = app.list_jobs(task="examples.fastapi_sqlalchemy.jobs.send_receipt")
        assert [(job.id, job.result) for job in jobs] == [
            (placed.json()["job"], "receipt for 2 x tea")
        ]
    finally:
        app.close()
