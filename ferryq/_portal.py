"""Runs coroutines for sync callers on one background event loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class Portal:
    """A daemon thread with its own event loop; ``call`` blocks until a coroutine is done.

    Sync entry points (``task.enqueue``, ``handle.result``) go through here, so the
    logic exists once, async, and sync code pays one thread hop for it.
    """

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="ferryq-portal")
        self._thread.daemon = True
        self._thread.start()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("a sync ferryq call cannot run inside ferryq's own portal loop")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
