"""Another process on the same SQLite file, for the wake-up tests
(``python -m tests.integration.wake_peer COMMAND URL``):

- ``enqueue``: one job enqueued;
- ``vanish``: starts waiting, then exits at once, its socket left behind;
- ``wait``: prints "waiting", waits up to 60 s for a write, prints what it saw as JSON.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys

import ferryq
from ferryq.store.sqlite.store import SQLiteStore

START = 1_700_000_000.0


def enqueue(url: str) -> None:
    app = ferryq.App(url)
    app.enqueue("peer.task")
    app.close()


async def vanish(url: str) -> None:
    store = SQLiteStore.from_url(url)
    await store.open()
    await store.wait_for_change(0.0)  # makes its bell
    os._exit(0)  # no clean-up: as a process that was killed


async def wait(url: str) -> None:
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("ferryq").addHandler(handler)
    logging.getLogger("ferryq").setLevel(logging.INFO)
    store = SQLiteStore.from_url(url)
    await store.open()
    await store.job_take("ns", "q", 1, "peer", 30.0, START)  # what is new from here
    waiting = asyncio.ensure_future(store.wait_for_change(60.0))
    await asyncio.sleep(0)  # the wait has begun
    print("waiting", flush=True)
    woken = await waiting
    print(json.dumps({"woken": woken, "bell": store._waits._bell is not None, "log": records}))
    await store.close()


if __name__ == "__main__":
    command, url = sys.argv[1:3]
    if command == "enqueue":
        enqueue(url)
    else:
        asyncio.run({"vanish": vanish, "wait": wait}[command](url))
