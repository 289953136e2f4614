"""The lane rate test's task and worker process (tests/acceptance/test_lane_rates.py).

python -m tests.acceptance.rate_app [--concurrency N]

The App reads FERRYQ_URL. ``call`` writes one line when it starts, to
``$FERRYQ_TEST_LOG_DIR/<pid>.log`` (one ``os.write`` on an ``O_APPEND`` descriptor):

    S <job_id> <lane> <time.time()>
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import time

import ferryq
from tests.acceptance.worker_log import log_line

app = ferryq.App(os.environ.get("FERRYQ_URL"))


@app.task(max_tries=1)
def call(ctx: ferryq.Context) -> None:
    log_line(f"S {ctx.job_id} {ctx.lane} {time.time():.6f}")


def main() -> None:
    # Run as __main__, this module's task would be registered under "__main__"; the
    # worker must serve the name the test enqueues, that of the imported module.
    from tests.acceptance import rate_app

    parser = argparse.ArgumentParser()
    parser.add_argument("--concurrency", type=int, default=8)
    options = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    worker = ferryq.Worker(rate_app.app, concurrency=options.concurrency)
    asyncio.run(worker.run())


if __name__ == "__main__":
    main()
