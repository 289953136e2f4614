"""The examples run as their docstrings say, and do what they claim."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
