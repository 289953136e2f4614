"""Concurrent requests that want the same kind of write share one transaction.

A request hands its part to a :class:`Coalescer` and awaits its own result. The first
one starts a flush at once; whatever arrives while that write is in flight goes
together in the next. Under light load every write goes alone, with no added delay;
under heavy load the writes grow instead of queueing one by one behind the
database's single writer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")
R = TypeVar("R")


class Coalescer(Generic[K, T, R]):
    """``run(key, items)`` must return one result per item, in order."""

    def __init__(self, run: Callable[[K, list[T]], Awaitable[list[R]]]) -> None:
        self._run = run
        self._pending: dict[K, list[tuple[T, asyncio.Future[R]]]] = {}
        self._flushing: dict[K, asyncio.Task[None]] = {}

    async def submit(self, key: K, item: T) -> R:
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._pending.setdefault(key, []).append((item, future))
        if key not in self._flushing:
            self._flushing[key] = asyncio.create_task(self._flush(key))
        return await future

    async def _flush(self, key: K) -> None:
        try:
            while batch := self._pending.pop(key, None):
                try:
                    results = await self._run(key, [item for item, _ in batch])
                except BaseException as exc:
                    for _, future in batch:
                        if future.done():
                            continue
                        if isinstance(exc, Exception):
                            future.set_exception(exc)
                        else:  # the server is stopping
                            future.cancel()
                    if not isinstance(exc, Exception):
                        raise
                    continue
                for (_, future), result in zip(batch, results, strict=True):
                    if not future.done():  # a request that went away drops its result
                        future.set_result(result)
        finally:
            del self._flushing[key]


def split(items: list[R], sizes: list[int]) -> list[list[R]]:
    """``items`` cut into consecutive pieces of ``sizes`` (the last ones may fall short)."""
    pieces, start = [], 0
    for size in sizes:
        pieces.append(items[start : start + size])
        start += size
    return pieces
