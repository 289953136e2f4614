"""The lane chaos test's task and worker process (tests/acceptance/test_lanes_chaos.py).

python -m tests.acceptance.lanes_app [--concurrency N]

The App reads FERRYQ_URL. Every attempt of ``lane_step`` writes a start line before its
work and an end line after it to ``$FERRYQ_TEST_LOG_DIR/<pid>.log``. Each line is one
``os.write`` on an ``O_APPEND`` descriptor, so it reaches the file (the kernel's page
cache) before the handler goes on, and SIGKILL can lose only lines never written:

    S <lane> <seq> <job_id> <attempt> <fence> <time.time()> <pid>
    E <lane> <seq> <job_id> <attempt> <fence> <time.time()> <pid> ok|fail|stopped

``stopped``: the worker cancelled the attempt, as it does when it could not renew the
lease in time (a busy machine) or stops with the attempt still running.
"""

from __future__ import annotations

import asyncio
import os
import time

import ferryq
from tests.acceptance.worker_support import serve

app = ferryq.App(os.environ.get("FERRYQ_URL"))
TTR = 1.5  # seconds: a killed attempt is recovered about this long after its worker died
MAX_TRIES = 4
RETRY_AFTER = 0.05
_fd: int | None = None


def _log(line: str) -> None:
    global _fd
    if _fd is None:
        path = os.path.join(os.environ["FERRYQ_TEST_LOG_DIR"], f"{os.getpid()}.log")
        _fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(_fd, (line + "\n").encode())


class FirstAttemptFails(Exception):
    """Raised on purpose by jobs enqueued with ``fail_first``."""


@app.task(ttr=TTR, max_tries=MAX_TRIES, retry=ferryq.backoff.fixed(RETRY_AFTER))
async def lane_step(
    ctx: ferryq.Context, lane: str, seq: int, seconds: float, fail_first: bool
) -> int:
    head = f"{lane} {seq} {ctx.job_id} {ctx.attempt} {ctx.fence}"
    _log(f"S {head} {time.time():.6f} {os.getpid()}")
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        _log(f"E {head} {time.time():.6f} {os.getpid()} stopped")
        raise
    if fail_first and ctx.attempt == 1:
        _log(f"E {head} {time.time():.6f} {os.getpid()} fail")
        raise FirstAttemptFails(f"job {ctx.job_id} fails its first attempt on purpose")
    _log(f"E {head} {time.time():.6f} {os.getpid()} ok")
    return seq


def main() -> None:
    # Run as __main__, this module's tasks would be registered under "__main__"; the
    # worker must serve the names the test enqueues, those of the imported module.
    from tests.acceptance import lanes_app

    serve(lanes_app.app, leader_ttl=1.0, maintenance_interval=0.1, heartbeat_interval=0.1)


if __name__ == "__main__":
    main()
