"""The fan-in chaos test's tasks and worker process (tests/acceptance/test_fan_in_chaos.py).

python -m tests.acceptance.fan_in_app [--concurrency N]

The App reads FERRYQ_URL. ``member`` sleeps 20 to 80 ms and returns its square; the
``album`` callback writes one line per attempt, when it starts, to
``$FERRYQ_TEST_LOG_DIR/<pid>.log`` (one ``os.write`` on an ``O_APPEND`` descriptor):

    C <job_id> <attempt> <fence> <number of results> <sum of results> <time.time()>
"""

from __future__ import annotations

import asyncio
import os
import random
import time

import ferryq
from tests.acceptance.worker_support import log_line, serve

app = ferryq.App(os.environ.get("FERRYQ_URL"))
TTR = 1.5  # seconds: a killed attempt is recovered about this long after its worker died
MAX_TRIES = 20  # kills never use up a member's tries


@app.task(ttr=TTR, max_tries=MAX_TRIES, retry=ferryq.backoff.fixed(0.05))
async def member(n: int) -> int:
    await asyncio.sleep(random.uniform(0.02, 0.08))
    return n * n


@app.task(ttr=TTR, max_tries=MAX_TRIES)
def album(ctx: ferryq.Context, results: list[int | None]) -> int:
    total = sum(r for r in results if r is not None)
    log_line(f"C {ctx.job_id} {ctx.attempt} {ctx.fence} {len(results)} {total} {time.time():.6f}")
    return total


def main() -> None:
    # Run as __main__, this module's tasks would be registered under "__main__"; the
    # worker must serve the names the test enqueues, those of the imported module.
    from tests.acceptance import fan_in_app

    serve(fan_in_app.app, leader_ttl=1.0, maintenance_interval=0.1, heartbeat_interval=0.1)


if __name__ == "__main__":
    main()
