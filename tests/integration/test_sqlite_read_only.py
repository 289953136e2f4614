"""A SQLite database this process cannot write: the commands that read still read
it, and those that write say why they cannot, in one line, exiting 2.

The tests run as root, which file modes do not stop: they mount a file system read-only,
or run the command without root's power to override file modes (setpriv)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.commands import run_ferryq
from tests.integration.volumes import WITHOUT_OVERRIDE, remount_read_only, require_setpriv, tmpfs

ROOT = Path(__file__).resolve().parents[2]
TASKS = "tests.integration.cli_tasks:app"
#: Commands that only read, and what their output holds.
READS = [
    (["jobs", "ls"], "send"),
    (["jobs", "show", "1"], "send"),
    (["jobs", "explain", "1"], "ready"),
    (["dead", "ls"], "no jobs"),
    (["lanes", "ls"], "no lanes"),
    (["lanes", "limit"], "no lane rules"),
    (["stats"], "default"),
    (["token", "ls"], ""),
]
#: Commands that write.
WRITES = [
    ["enqueue", "send", "[]"],
    ["jobs", "cancel", "1"],
    ["lanes", "limit", "x", "2"],
    ["worker", TASKS, "--burst"],
]


def ferryq(db: Path, *args: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """``ferryq --url DB ARGS``: in this process (tests/commands.py) but for the worker and
    a command run with ``prefix`` (setpriv, without root's power over file modes)."""
    url = f"sqlite:///{db}"
    if not prefix and "worker" not in args:
        return run_ferryq(["--url", url, *args], env={"FERRYQ_URL": url})
    return subprocess.run(
        [*prefix, sys.executable, "-m", "ferryq", "--url", url, *args],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
        env={**os.environ, "FERRYQ_URL": url},
    )  # fmt: skip


def with_a_job(db: Path) -> None:
    made = ferryq(db, "enqueue", "send", '["a"]')
    assert made.returncode == 0, made.stderr


def check_reads_and_refused_writes(db: Path, why: str, prefix: tuple[str, ...] = ()) -> None:
    for command, shown in READS:
        result = ferryq(db, *command, prefix=prefix)
        assert result.returncode == 0, f"{command}: {result.stderr}"
        assert shown in result.stdout
    listed = json.loads(ferryq(db, "jobs", "ls", "--json", prefix=prefix).stdout)
    assert [(job["id"], job["args"]) for job in listed] == [(1, ["a"])]
    said = (
        f"Error: SQLite database {db} is read-only ({why}): commands that write need write access"
    )
    for command in WRITES:
        result = ferryq(db, *command, prefix=prefix)
        assert result.returncode == 2, f"{command}: {result.stderr}"
        assert "Traceback" not in result.stderr
        assert result.stderr.strip().splitlines()[-1] == said, command


@pytest.fixture
def volume(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "volume", "4m") as folder:
        yield folder


def test_a_database_on_a_read_only_file_system(volume: Path) -> None:
    db = volume / "ferryq.db"
    with_a_job(db)
    remount_read_only(volume)
    check_reads_and_refused_writes(db, "its file system is mounted read-only")


def test_a_database_file_without_write_permission(tmp_path: Path) -> None:
    require_setpriv()
    db = tmp_path / "ferryq.db"
    with_a_job(db)
    db.chmod(0o444)
    check_reads_and_refused_writes(db, "the file is not writable", tuple(WITHOUT_OVERRIDE))


def test_a_database_in_a_folder_without_write_permission(tmp_path: Path) -> None:
    require_setpriv()
    folder = tmp_path / "data"
    folder.mkdir()
    db = folder / "ferryq.db"
    with_a_job(db)  # its last connection closed: no -wal or -shm left beside it
    folder.chmod(0o555)
    try:
        check_reads_and_refused_writes(
            db,
            "its folder is not writable, and SQLite makes its -wal and -shm files there",
            tuple(WITHOUT_OVERRIDE),
        )
    finally:
        folder.chmod(0o755)
