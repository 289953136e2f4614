"""A worker process for acceptance tests, with short leader and heartbeat periods.

python -m tests.acceptance.worker_main [--burst] [--concurrency N] [--defaults]
"""

from __future__ import annotations

import argparse
import asyncio
import logging

import ferryq
from tests.acceptance.tasks import app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--burst", action="store_true")
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--name", help="worker identity, as if on another machine")
    parser.add_argument("--defaults", action="store_true", help="the Worker's own periods")
    options = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    fast = not options.defaults
    worker = ferryq.Worker(
        app, concurrency=options.concurrency, burst=options.burst, name=options.name,
        leader_ttl=1.0 if fast else 5.0, maintenance_interval=0.1 if fast else 0.5,
        heartbeat_interval=0.1 if fast else 1.0,
    )  # fmt: skip
    asyncio.run(worker.run())


if __name__ == "__main__":
    main()
