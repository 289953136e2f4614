"""One side of bench/ab.py: the task its worker runs and the client work it measures.

It uses ferryq's public API alone (``ferryq.App``, ``@app.task``, ``enqueue``), so that
it runs against the code of any ref, old ones included. bench/ab.py copies this file
into a directory of its own and runs it there, with ``PYTHONPATH`` set to the side's
tree, so that ``import ferryq`` finds that side's code and nothing else of bench/::

    FERRYQ_URL=URL python ab_side.py fill N      fill the queue with N no-op jobs
    FERRYQ_URL=URL python ab_side.py enqueue N   N single enqueues, one job a call, as
                                                 web apps enqueue; prints "calls/s
                                                 CPU-seconds-per-call of-which-system"

and, as ``ab_side:app``, the app of the side's ``ferryq worker``. Its task appends
its start time to the file named by BENCH_TICKS, as bench/ferryq_tasks.py does, so
the drain is measured from the tasks' own clocks. Every process checks that the
ferryq it imported is the side's (AB_TREE), and exits if not.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import resource
import sys
import time

import ferryq

TICKS_ENV = "BENCH_TICKS"
TREE_ENV = "AB_TREE"
LINE = 18  # len(b"%017.6f\n" % time.time())
#: Single enqueues made before the timed ones: connecting and migrating are not enqueueing.
WARM_UP = 20
FILL_BATCH = 1000

if TREE_ENV in os.environ:
    _tree = pathlib.Path(os.environ[TREE_ENV]).resolve()
    if _tree not in pathlib.Path(ferryq.__file__).resolve().parents:
        sys.exit(f"ab_side: ferryq comes from {ferryq.__file__}, not from {_tree}")

app = ferryq.App(os.environ.get("FERRYQ_URL"))
_fd: int | None = None


@app.task(name="bench.tick")
async def tick() -> None:
    global _fd
    line = b"%017.6f\n" % time.time()
    if _fd is None:
        _fd = os.open(os.environ[TICKS_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(_fd, line)


def fill(count: int) -> None:
    """``count`` jobs of ``tick``, a thousand an enqueue call."""

    async def batches() -> None:
        for first in range(0, count, FILL_BATCH):
            await tick.enqueue_many_async([()] * min(FILL_BATCH, count - first))
        await app.aclose()

    asyncio.run(batches())


def enqueue(count: int) -> tuple[float, float, float]:
    """``count`` single enqueues from sync code: calls/s, and CPU seconds a call, all
    of it and that in the kernel, of the whole process (the App's threads included)."""
    try:
        for _ in range(WARM_UP):
            tick.enqueue()
        before, began = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        for _ in range(count):
            tick.enqueue()
        elapsed, after = time.perf_counter() - began, resource.getrusage(resource.RUSAGE_SELF)
    finally:
        app.close()
    system = after.ru_stime - before.ru_stime
    used = after.ru_utime - before.ru_utime + system
    return count / elapsed, used / count, system / count


def main(argv: list[str]) -> None:
    command, count = argv[0], int(argv[1])
    if command == "fill":
        fill(count)
    elif command == "enqueue":
        rate, cpu, system = enqueue(count)
        print(f"{rate} {cpu} {system}")
    else:
        sys.exit(f"ab_side: unknown command {command!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
