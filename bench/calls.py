"""Timing one enqueue per call: in a loop, from threads, from concurrent coroutines.

Each function takes the callers, one callable each, and ``n`` calls in all, shared as
evenly as the callers allow; a call gets its number (0 to n - 1) as its argument. Every
caller first makes one warm-up call (numbered from -1 down), outside the timing, so
connecting, preparing statements and first-use costs are not counted. The rate is
``n / elapsed`` by ``time.perf_counter``, from the moment all callers are warm to the
moment the last one is done. The first exception of any caller is raised after all
have stopped.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Sequence

SyncCall = Callable[[int], object]
AsyncCall = Callable[[int], Awaitable[object]]


def shares(n: int, callers: int) -> list[range]:
    """The call numbers of each caller: ``n`` in all, as even as can be."""
    size, extra = divmod(n, callers)
    bounds = [k * size + min(k, extra) for k in range(callers + 1)]
    return [range(bounds[k], bounds[k + 1]) for k in range(callers)]


def loop(call: SyncCall, n: int) -> float:
    """Calls/s of one caller calling ``n`` times in a loop."""
    call(-1)
    started = time.perf_counter()
    for i in range(n):
        call(i)
    return n / (time.perf_counter() - started)


async def loop_async(call: AsyncCall, n: int) -> float:
    """Calls/s of one coroutine awaiting ``n`` calls one after another."""
    await call(-1)
    started = time.perf_counter()
    for i in range(n):
        await call(i)
    return n / (time.perf_counter() - started)


def threads(calls: Sequence[SyncCall], n: int) -> float:
    """Calls/s of one thread per element of ``calls``, all started together."""
    ready = threading.Barrier(len(calls) + 1)
    errors: list[BaseException] = []

    def run(call: SyncCall, numbers: range, warm_up: int) -> None:
        try:
            call(warm_up)
        except BaseException as exc:
            errors.append(exc)
        ready.wait()
        if errors:
            return
        try:
            for i in numbers:
                call(i)
        except BaseException as exc:
            errors.append(exc)

    numbered = enumerate(zip(calls, shares(n, len(calls)), strict=True))
    workers = [threading.Thread(target=run, args=(call, numbers, -1 - k), daemon=True)
               for k, (call, numbers) in numbered]  # fmt: skip
    for worker in workers:
        worker.start()
    ready.wait()
    started = time.perf_counter()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise errors[0]
    return n / elapsed


async def gather(calls: Sequence[AsyncCall], n: int) -> float:
    """Calls/s of one coroutine per element of ``calls``, all run at once by gather."""
    await asyncio.gather(*(call(-1 - k) for k, call in enumerate(calls)))

    async def run(call: AsyncCall, numbers: range) -> None:
        for i in numbers:
            await call(i)

    started = time.perf_counter()
    await asyncio.gather(*(run(c, r) for c, r in zip(calls, shares(n, len(calls)), strict=True)))
    return n / (time.perf_counter() - started)
