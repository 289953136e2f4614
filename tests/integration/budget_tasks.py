"""Tasks for the connection budget's tests: the worker subprocess imports this module.

``hold`` waits for the file the test names, then enqueues a ``noop``: while held, every
slot of the worker is busy; once let go, each enqueue needs the enqueues' connection.
"""

from __future__ import annotations

import asyncio
import os

import ferryq

app = ferryq.App(os.environ["FERRYQ_URL"])
#: How often a held job looks for its gate.
LOOK_SECONDS = 0.05


@app.task(name="noop")
async def noop() -> None:
    return None


@app.task(name="hold")
async def hold(gate: str) -> None:
    # The gate is a file the test makes, in another process: nothing to await but time.
    while not await asyncio.to_thread(os.path.exists, gate):  # noqa: ASYNC110
        await asyncio.sleep(LOOK_SECONDS)
    await noop.enqueue_async()
