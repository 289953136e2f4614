"""The lane rate test's task and worker process
(tests/acceptance/test_lane_rates_across_processes.py).

python -m tests.acceptance.rate_app [--concurrency N]

The App reads FERRYQ_URL. ``call`` writes one line when it starts, to
``$FERRYQ_TEST_LOG_DIR/<pid>.log`` (one ``os.write`` on an ``O_APPEND`` descriptor):

    S <job_id> <lane> <time.time()>
"""

from __future__ import annotations

import os
import time

import ferryq
from tests.acceptance.worker_support import log_line, serve

app = ferryq.App(os.environ.get("FERRYQ_URL"))


@app.task(max_tries=1)
def call(ctx: ferryq.Context) -> None:
    log_line(f"S {ctx.job_id} {ctx.lane} {time.time():.6f}")


def main() -> None:
    # Run as __main__, this module's task would be registered under "__main__"; the
    # worker must serve the name the test enqueues, that of the imported module.
    from tests.acceptance import rate_app

    serve(rate_app.app)


if __name__ == "__main__":
    main()
