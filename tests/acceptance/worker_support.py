"""What the acceptance tests' worker processes share: how they start, and how their
handlers report what they did."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from typing import Any

import ferryq


def serve(app: ferryq.App, **options: Any) -> None:
    """Run a worker of ``app`` until it is stopped: ``--concurrency N`` (8) from the
    command line, INFO logs to stderr, the rest of the Worker's ``options`` as given."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--concurrency", type=int, default=8)
    parsed = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    worker = ferryq.Worker(app, concurrency=parsed.concurrency, **options)
    asyncio.run(worker.run())


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
