"""Helpers for testing code that uses ferryq: drain queues without a worker process."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from ferryq.app import App
from ferryq.worker import Worker


async def drain_async(
    app: App, queues: Sequence[str] | None = None, *, concurrency: int = 10, **options: object
) -> Worker:
    """Run every job that is due now, in this process, then return the worker used.

    Jobs that become due later (delays, backoff) stay queued: advance the app's
    clock and drain again. ``worker.finished`` counts the attempts it completed.
    """
    worker = Worker(
        app, queues=queues, concurrency=concurrency, burst=True, handle_signals=False,
        **options,  # type: ignore[arg-type]
    )  # fmt: skip
    await worker.run()
    return worker


def drain(
    app: App, queues: Sequence[str] | None = None, *, concurrency: int = 10, **options: object
) -> Worker:
    """The sync twin of :func:`drain_async`, for tests without an event loop."""

    async def drain_and_close() -> Worker:
        try:
            return await drain_async(app, queues, concurrency=concurrency, **options)
        finally:
            await app.aclose()

    return asyncio.run(drain_and_close())
