"""The periodic acceptance test's App and worker process (test_periodic_across_restarts.py).

python -m tests.acceptance.periodic_app

The App reads FERRYQ_URL. ``every_second`` is a periodic task with a one-second
schedule; its jobs are counted, tick by tick, from the database.
"""

from __future__ import annotations

import asyncio
import logging
import os

import ferryq

app = ferryq.App(os.environ.get("FERRYQ_URL"))


@app.periodic(every=1, name="every_second", ttr=2)
async def every_second(ctx: ferryq.Context) -> int:
    return os.getpid()


def main() -> None:
    # Run as __main__, the task would be registered twice; serve the imported module's.
    from tests.acceptance import periodic_app

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    worker = ferryq.Worker(
        periodic_app.app, concurrency=4, leader_ttl=1.0, maintenance_interval=0.1,
        heartbeat_interval=0.1, grace=5,
    )  # fmt: skip
    asyncio.run(worker.run())


if __name__ == "__main__":
    main()
