"""Disks that fill up or cannot be written, made for real: a small tmpfs mounted for
the test (root only), and commands run without root's power to ignore file modes."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

#: Run a command as root without CAP_DAC_OVERRIDE and friends: file modes then apply
#: to it as to any user (the test suite runs as root, which ignores them).
WITHOUT_OVERRIDE = [
    "setpriv",
    "--bounding-set=-dac_override,-dac_read_search,-fowner",
    "--inh-caps=-dac_override,-dac_read_search,-fowner",
]


@contextlib.contextmanager
def tmpfs(folder: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (``2m``) mounted on ``folder`` for the duration; skips the
    test where mounting is not allowed (not root, or no mount in this container)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    folder.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
        capture_output=True, text=True,
    )  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        # Lazily if a file is still open: the test has failed already then.
        if subprocess.run(["umount", str(folder)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "--lazy", str(folder)], check=True)


def remount_read_only(folder: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)


def fill(folder: Path) -> Path:
    """Write a file in ``folder`` until its disk is full; the file, to free it again."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        for chunk in (1 << 16, 1 << 12, 1 << 9):  # to the last block
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, bytes(chunk))
        with pytest.raises(OSError) as full:
            os.write(fd, b"x")
        assert full.value.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return filler


def require_setpriv() -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run a command that file modes apply to")
    probe = subprocess.run([*WITHOUT_OVERRIDE, "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"setpriv cannot drop capabilities here: {probe.stderr.strip()}")
