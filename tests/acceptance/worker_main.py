"""A worker process for acceptance tests, with short leader and heartbeat periods.

python -m tests.acceptance.worker_main [--burst] [--concurrency N] [--defaults]
                                       [--queues A,B] [--clock-skew S [--host-clock]]

``--clock-skew S``: this process's host clock is S seconds off (injected into the App;
the machine's clock is not touched), set to the database server's as ferryq does;
with ``--host-clock`` it is kept as it is, to see what the setting prevents.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time

import ferryq
from ferryq.clock import ServerClock
from tests.acceptance.tasks import app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--burst", action="store_true")
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--name", help="worker identity, as if on another machine")
    parser.add_argument("--queues", help="the queues it takes from, comma-separated")
    parser.add_argument("--defaults", action="store_true", help="the Worker's own periods")
    parser.add_argument("--clock-skew", type=float, default=0.0, help="host clock's error, s")
    parser.add_argument("--host-clock", action="store_true", help="keep the skewed clock as is")
    options = parser.parse_args()
    if options.clock_skew:
        skew = float(options.clock_skew)

        def skewed() -> float:
            return time.time() + skew

        app.clock = skewed if options.host_clock else ServerClock(skewed)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    fast = not options.defaults
    worker = ferryq.Worker(
        app, concurrency=options.concurrency, burst=options.burst, name=options.name,
        queues=options.queues.split(",") if options.queues else None,
        leader_ttl=1.0 if fast else 5.0, maintenance_interval=0.1 if fast else 0.5,
        heartbeat_interval=0.1 if fast else 1.0,
    )  # fmt: skip
    asyncio.run(worker.run())


if __name__ == "__main__":
    main()
