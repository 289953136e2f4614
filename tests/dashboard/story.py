"""The jobs the dashboard tests look at, made with ferryq.App and run by real workers.

Every test module shares one server and one database per backend, so each story part
lives in a queue or namespace of its own, and tests that change jobs make their own.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import ferryq
from ferryq.testing import drain

PAGED = 120  # jobs in queue "mail": three pages of 50
SCRIPT = '<script>window.__injected = 1</script><img src=x onerror="window.__injected = 2">'
OTHER_NAMESPACE = "tenant-b"


def tasks(app: ferryq.App) -> dict[str, Any]:
    """Register the story's tasks on ``app``; the tasks by name."""

    @app.task(name="send", queue="mail")
    def send(to: str) -> dict[str, str]:
        return {"sent": to}

    @app.task(name="upload", queue="uploads", max_tries=2, retry=ferryq.backoff.fixed(0))
    def upload(path: str) -> None:
        raise ConnectionError(f"storage refused {path}")

    @app.task(name="publish", queue="comments")
    def publish(post: int, n: int) -> int:
        return n

    @app.task(name="secret", queue="private")
    def secret(word: str) -> str:
        return word

    return {"send": send, "upload": upload, "publish": publish, "secret": secret}


@dataclass(frozen=True, slots=True)
class Story:
    url: str
    mail: list[int]  # oldest first
    dead: int  # an upload that died after two attempts
    injected: int  # a dead upload whose args and error hold markup
    lane: list[int]  # three comments of lane post:7, in order
    halted_by: int  # the dead job halting lane orders:1
    halted_behind: int  # the job waiting behind it
    delayed: int
    secret: list[int]  # in OTHER_NAMESPACE


def tell(url: str) -> Story:
    """Enqueue the story on the database at ``url`` and run it to the end."""
    app = ferryq.App(url)
    t = tasks(app)
    addresses = [(f"user{i}@example.com",) for i in range(PAGED)]
    mail = [h.id for h in t["send"].enqueue_many(addresses)]
    dead = t["upload"].enqueue("backups/2026-11.tar.gz").id
    injected = t["upload"].enqueue(SCRIPT).id
    comments = t["publish"].options(lane="post:7").enqueue_many([(7, n) for n in range(3)])
    lane = [h.id for h in comments]
    app.set_lane_limit("orders:*", 1, on_dead="halt")
    halted_by = t["upload"].options(lane="orders:1").enqueue("orders/1.csv").id
    halted_behind = t["send"].options(lane="orders:1").enqueue("orders@example.com").id
    delayed = t["send"].options(delay=3600).enqueue("later@example.com").id
    run_all(app)
    app.close()

    other = ferryq.App(url, namespace=OTHER_NAMESPACE)
    secret = [h.id for h in tasks(other)["secret"].enqueue_many([("alpha",), ("beta",)])]
    run_all(other)
    other.close()
    return Story(url, mail, dead, injected, lane, halted_by, halted_behind, delayed, secret)


def fresh_namespace() -> str:
    """A namespace no other test uses, for tests that change jobs."""
    return f"t{uuid.uuid4().hex[:10]}"


def run_all(app: ferryq.App) -> None:
    """Every due job, by a burst worker, on a thread of its own: the test thread may be
    driving the browser, whose event loop must not meet another one."""
    with ThreadPoolExecutor(1) as pool:
        pool.submit(drain, app).result()


class BlockingWorker:
    """A real worker on a thread of its own, running jobs of queue ``hold`` that wait
    until :meth:`release`; ``started`` is set once one of them runs."""

    def __init__(self, url: str) -> None:
        self.app = ferryq.App(url)
        self.started = threading.Event()
        self._go = threading.Event()

        @self.app.task(name="hold", queue="hold")
        def hold(ctx: ferryq.Context) -> int:
            self.started.set()
            self._go.wait(60)
            return ctx.job_id

        self.hold = hold
        self.worker = ferryq.Worker(self.app, queues=["hold"], handle_signals=False,
                                    heartbeat_interval=0.2)  # fmt: skip
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._running = threading.Event()

    def _run(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._running.set()
            try:
                await self.worker.run()
            finally:
                await self.app.aclose()

        asyncio.run(main())

    def start(self) -> None:
        self._thread.start()
        self._running.wait(30)

    def release_and_stop(self) -> None:
        self._go.set()
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.worker.stop)
        self._thread.join(30)
        self.app.close()
