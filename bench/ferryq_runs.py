"""ferryq's side of every benchmark: one worker process, the tasks' own clocks.

Measured as the peers are (see bench/peers/): the queue is filled first, then one
worker process drains it, and the rate is ``(n - 1) / (last task start - first task
start)`` from the tasks' own timestamps, so start-up is excluded. Pickup latency is
enqueue → task start, one job at a time, with a random 0-100 ms gap between jobs.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

import ferryq
from bench import ferryq_tasks

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONCURRENCY = 500


def ticks_file(workdir: pathlib.Path) -> pathlib.Path:
    return pathlib.Path(tempfile.mkdtemp(prefix="ferryq-", dir=workdir)) / "ticks"


def start_worker(
    url: str,
    ticks: pathlib.Path,
    queues: str = "default",
    args: Sequence[str] = (),
    stderr: pathlib.Path | None = None,
) -> subprocess.Popen[bytes]:
    """``ferryq worker`` with ``args`` added; its log goes to ``stderr`` (a file) if
    given, else nowhere."""
    env = {**os.environ, "FERRYQ_URL": url, ferryq_tasks.TICKS_ENV: str(ticks),
           "PYTHONPATH": str(ROOT)}  # fmt: skip
    cmd = [sys.executable, "-m", "ferryq", "worker", "bench.ferryq_tasks:app",
           "--concurrency", str(CONCURRENCY), "--queues", queues, *args]  # fmt: skip
    with open(stderr or os.devnull, "wb") as log:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                stderr=log)  # fmt: skip


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def wait_ticks(ticks: pathlib.Path, count: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 300
    while not ticks.exists() or ticks.stat().st_size < count * ferryq_tasks.LINE:
        if proc.poll() is not None:
            raise RuntimeError(f"ferryq worker exited with {proc.returncode}")
        if time.monotonic() > deadline:
            raise TimeoutError("ferryq worker did not finish in time")
        time.sleep(0.005)


def read_ticks(ticks: pathlib.Path) -> list[float]:
    return [float(line) for line in ticks.read_bytes().split()]


def enqueue(url: str, n: int) -> float:
    """Jobs/s enqueued in batches of 1,000 (each batch one transaction), from async
    code, as the peers' batch APIs are called."""

    async def batches() -> float:
        app = ferryq.App(url)
        await app.store()  # connecting is not enqueueing
        started = time.perf_counter()
        for first in range(0, n, 1000):
            await app.enqueue_many_async(ferryq_tasks.tick.name, [[]] * min(1000, n - first))
        rate = n / (time.perf_counter() - started)
        await app.aclose()
        return rate

    return asyncio.run(batches())


def drain(
    url: str,
    n: int,
    workdir: pathlib.Path,
    *,
    lanes: int = 0,
    args: Sequence[str] = (),
    stderr: pathlib.Path | None = None,
) -> float:
    """Jobs/s drained by one worker process from a queue filled beforehand; with
    ``lanes``, the jobs are spread evenly over that many lanes (of limit 1). ``args``
    and ``stderr``: as for ``start_worker``."""
    if lanes:
        enqueue_lanes(url, n, lanes)
    else:
        enqueue(url, n)
    ticks = ticks_file(workdir)
    proc = start_worker(url, ticks, args=args, stderr=stderr)
    try:
        wait_ticks(ticks, n, proc)
    finally:
        stop(proc)
    stamps = read_ticks(ticks)
    return (n - 1) / (max(stamps) - min(stamps))


def enqueue_lanes(url: str, n: int, lanes: int) -> None:
    """``n`` jobs over ``lanes`` lanes, one enqueue call per lane (not measured)."""

    async def fill() -> None:
        app = ferryq.App(url)
        for lane in range(lanes):
            count = n // lanes + (lane < n % lanes)
            await app.enqueue_many_async(ferryq_tasks.tick.name, [[]] * count, lane=f"l:{lane}")
        await app.aclose()

    asyncio.run(fill())


def pickup(
    url: str,
    samples: int,
    workdir: pathlib.Path,
    *,
    gap: tuple[float, float] = (0.0, 0.1),
    worker_args: Sequence[str] = (),
    **options: object,
) -> tuple[float, float]:
    """(p50, p99) ms from enqueue to task start, one job in flight at a time, a random
    ``gap`` (seconds, from, to) before each; ``worker_args`` as ``args`` of
    ``start_worker``; ``options`` go to every enqueue (a lane, say)."""
    ticks = ticks_file(workdir)
    app = ferryq.App(url)
    app.enqueue(ferryq_tasks.tick.name, **options)  # warm-up: start-up is not latency
    proc = start_worker(url, ticks, args=worker_args)
    rng = random.Random(1)
    enqueued: list[float] = []
    try:
        wait_ticks(ticks, 1, proc)
        for i in range(samples):
            time.sleep(rng.uniform(*gap))
            enqueued.append(time.time())
            app.enqueue(ferryq_tasks.tick.name, **options)
            wait_ticks(ticks, i + 2, proc)
    finally:
        stop(proc)
        app.close()
    started = read_ticks(ticks)[1:]
    latencies = sorted((s - e) * 1000 for s, e in zip(started, enqueued, strict=True))
    q = statistics.quantiles(latencies, n=100, method="inclusive")
    return q[49], q[98]


def load_average() -> str:
    """The machine's load averages (1, 5 and 15 min), for a run's figures."""
    return ", ".join(f"{load:.2f}" for load in os.getloadavg())


def cpu_seconds(pid: int) -> tuple[float, float]:
    """The CPU seconds a live process has used so far, user and system, from /proc;
    nothing elsewhere."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0, 0.0
    user, system = stat.rpartition(")")[2].split()[11:13]
    tick = os.sysconf("SC_CLK_TCK")
    return int(user) / tick, int(system) / tick


def median(values: list[float]) -> float:
    return float(statistics.median(values))
