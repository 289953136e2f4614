"""``ferryq worker --processes 2`` against ``--processes 1``, CPU-bound jobs on PostgreSQL.

    python -m bench.processes [--jobs N] [--rounds N] [--work-ms MS] [--concurrency N]

Each job is a sync handler that keeps a core busy for ``--work-ms`` (2 ms, a loop, not
a sleep), so one worker process is bound by the interpreter lock and a second one can
use a second core. The loop counts the CPU time of its own thread (time.thread_time):
wall time (time.perf_counter) would count the time a handler waits for the lock
while another slot's handler runs, and several slots of one process would then seem
to do several jobs' work at once. Each drain starts from a fresh
database filled beforehand; the rate is ``(n - 1) / (last start - first start)`` from
the handlers' own clocks, so start-up is excluded (as in bench/ferryq_runs.py). The
figures are medians of ``--rounds`` rounds, each measuring both in turn. PostgreSQL:
FERRYQ_BENCH_PG_URL, or a durable throwaway cluster (bench/pg_cluster.py).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import threading
import time

import ferryq
from bench import ferryq_runs as runs
from bench.ferryq_tasks import TICKS_ENV
from bench.pg_cluster import cluster
from tests.pg import fresh_database

ROOT = pathlib.Path(__file__).resolve().parents[1]
PROCESSES = (1, 2)

app = ferryq.App(os.environ.get("FERRYQ_URL"))
_ticks: int | None = None
_ticks_lock = threading.Lock()


@app.task(name="bench.burn")
def burn(ms: float) -> None:
    """Write this start's time as one line, then use ``ms`` of CPU time."""
    began = time.thread_time()
    _tick()
    while time.thread_time() - began < ms / 1000:
        pass


def _tick() -> None:
    global _ticks
    with _ticks_lock:
        if _ticks is None:
            _ticks = os.open(os.environ[TICKS_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(_ticks, b"%017.6f\n" % time.time())


def fill(url: str, jobs: int, work_ms: float) -> None:
    async def batches() -> None:
        filler = ferryq.App(url)
        for first in range(0, jobs, 1000):
            count = min(1000, jobs - first)
            await filler.enqueue_many_async(burn.name, [[work_ms]] * count)
        await filler.aclose()

    asyncio.run(batches())


def drain(url: str, jobs: int, processes: int, concurrency: int, workdir: pathlib.Path) -> float:
    """Jobs/s of ``ferryq worker --processes N`` through a queue filled beforehand."""
    ticks = runs.ticks_file(workdir)
    env = {**os.environ, "FERRYQ_URL": url, TICKS_ENV: str(ticks), "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "ferryq", "worker", "bench.processes:app",
               "--processes", str(processes), "--concurrency", str(concurrency)]  # fmt: skip
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        runs.wait_ticks(ticks, jobs, proc)
    finally:
        proc.send_signal(signal.SIGTERM)
        if proc.wait(60) != 0:
            raise RuntimeError(f"ferryq worker --processes {processes} exited {proc.returncode}")
    stamps = runs.read_ticks(ticks)
    return (jobs - 1) / (max(stamps) - min(stamps))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=4_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work-ms", type=float, default=2.0)
    parser.add_argument("--concurrency", type=int, default=10, help="slots a process")
    options = parser.parse_args()
    rates: dict[int, list[float]] = {n: [] for n in PROCESSES}
    with cluster() as pg, tempfile.TemporaryDirectory() as tmp:
        for round_no in range(1, options.rounds + 1):
            for processes in PROCESSES:
                with fresh_database(pg) as url:
                    fill(url, options.jobs, options.work_ms)
                    rate = drain(url, options.jobs, processes, options.concurrency,
                                 pathlib.Path(tmp))  # fmt: skip
                rates[processes].append(rate)
            figures = " | ".join(f"--processes {n} {rates[n][-1]:,.0f} jobs/s" for n in PROCESSES)
            print(f"round {round_no}: {figures}", flush=True)
    one, two = (runs.median(rates[n]) for n in PROCESSES)
    print(f"\nmedians of {options.rounds} rounds on one local PostgreSQL, {os.cpu_count()} "
          f"cores; {options.jobs:,} sync jobs of {options.work_ms:g} ms of CPU each, "
          f"{options.concurrency} slots a process")  # fmt: skip
    print(f"--processes 1: {one:,.0f} jobs/s")
    print(f"--processes 2: {two:,.0f} jobs/s")
    print(f"ratio: {two / one:.2f}x")


if __name__ == "__main__":
    main()
