"""Runs coroutines for sync callers on one background event loop."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")
#: What a coroutine run by ``Portal.call_here`` awaits to have ``fn()`` run on the
#: calling thread: ``await here(fn)``.
Here = Callable[[Callable[[], T]], Awaitable[T]]


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

    def call_here(self, make: Callable[[Here[Any]], Coroutine[Any, Any, R]]) -> R:
        """Like ``call``, for a coroutine ``make(here)`` some of whose steps must run
        on the calling thread (a sync driver connection belongs to it): each
        ``await here(fn)`` runs ``fn()`` here, while the coroutine waits for it on the
        portal's loop, in one task from start to end."""
        steps: queue.SimpleQueue[tuple[Callable[[], Any], asyncio.Future[Any]] | None]
        steps = queue.SimpleQueue()

        async def here(fn: Callable[[], T]) -> T:
            done: asyncio.Future[T] = self._loop.create_future()
            steps.put((fn, done))
            return await done

        outcome = asyncio.run_coroutine_threadsafe(make(here), self._loop)
        outcome.add_done_callback(lambda _: steps.put(None))
        while (step := steps.get()) is not None:
            fn, done = step
            try:
                result = fn()
            except Exception as exc:
                self._loop.call_soon_threadsafe(_settle, done, None, exc)
            except BaseException:  # KeyboardInterrupt here: it would stop the loop there
                outcome.cancel()
                raise
            else:
                self._loop.call_soon_threadsafe(_settle, done, result, None)
        return outcome.result()

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


def _settle(done: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if done.done():  # its coroutine was cancelled meanwhile
        return
    if error is None:
        done.set_result(result)
    else:
        done.set_exception(error)
