"""How the acceptance tests' worker processes report what their handlers did."""

from __future__ import annotations

import os


def log_line(line: str) -> None:
    """Append ``line`` to ``$FERRYQ_TEST_LOG_DIR/<pid>.log`` in one ``os.write`` on an
    ``O_APPEND`` descriptor: it reaches the file before the handler goes on, whole,
    whatever other processes write beside it (``Workers.log_lines`` reads them all)."""
    path = os.path.join(os.environ["FERRYQ_TEST_LOG_DIR"], f"{os.getpid()}.log")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)
