"""A worker process for acceptance tests, with short leader and heartbeat periods.

python -m tests.acceptance.worker_main [--burst] [--concurrency N]
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
    options = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    worker = ferryq.Worker(
        app, concurrency=options.concurrency, burst=options.burst, leader_ttl=1.0,
        maintenance_interval=0.1, heartbeat_interval=0.1, name=options.name,
    )  # fmt: skip
    asyncio.run(worker.run())


if __name__ == "__main__":
    main()
