"""The no-op task the benchmarks run, importable by worker processes.

Like the peer's task, it appends its start time as one fixed-width line to a file,
so every queue is measured by the same clock and the same few microseconds of work.
"""

from __future__ import annotations

import os
import time

import ferryq

TICKS_ENV = "BENCH_TICKS"
LINE = 18  # len(b"%017.6f\n" % time.time())

app = ferryq.App(os.environ.get("FERRYQ_URL"))
_fd: int | None = None


@app.task(name="bench.tick")
async def tick() -> None:
    global _fd
    line = b"%017.6f\n" % time.time()
    if _fd is None:
        _fd = os.open(os.environ[TICKS_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(_fd, line)
