"""ferryq on SQLite against huey's SqliteHuey, side by side on this machine.

    python -m bench.sqlite_throughput [--jobs N] [--samples N] [--rounds N]

Both queues are measured the same way (see bench/peers/huey_sqlite.py): the queue is
filled first, one consumer process is started, and the drain rate is
``(n - 1) / (last task start - first task start)`` from the tasks' own timestamps,
so interpreter start-up is excluded. Pickup latency is enqueue → task start, one job
at a time, with a random 0-100 ms gap between jobs. Each figure is the median of
``--rounds`` runs, because a 2-core machine is noisy.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import ferryq
from bench import ferryq_tasks
from bench.peers import huey_sqlite

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONCURRENCY = 500


@dataclass
class Figures:
    enqueue: float = 0.0
    drain: float = 0.0
    p50: float = 0.0
    p99: float = 0.0


def _start_worker(url: str, ticks: pathlib.Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "FERRYQ_URL": url, ferryq_tasks.TICKS_ENV: str(ticks),
           "PYTHONPATH": str(ROOT)}  # fmt: skip
    cmd = [sys.executable, "-m", "ferryq", "worker", "bench.ferryq_tasks:app",
           "--concurrency", str(CONCURRENCY)]  # fmt: skip
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _wait_ticks(ticks: pathlib.Path, count: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 120
    while not ticks.exists() or ticks.stat().st_size < count * ferryq_tasks.LINE:
        if proc.poll() is not None:
            raise RuntimeError(f"ferryq worker exited with {proc.returncode}")
        if time.monotonic() > deadline:
            raise TimeoutError("ferryq worker did not finish in time")
        time.sleep(0.005)


def _read_ticks(ticks: pathlib.Path) -> list[float]:
    return [float(line) for line in ticks.read_bytes().split()]


def ferryq_drain(n: int, workdir: pathlib.Path) -> tuple[float, float]:
    """(enqueue jobs/s in batches of 1,000, drain jobs/s by one worker process)."""
    run = pathlib.Path(tempfile.mkdtemp(prefix="ferryq-", dir=workdir))
    url, ticks = f"sqlite:///{run}/bench.db", run / "ticks"
    app = ferryq.App(url)
    started = time.perf_counter()
    for first in range(0, n, 1000):
        app.enqueue_many(ferryq_tasks.tick.name, [[]] * min(1000, n - first))
    enqueue_rate = n / (time.perf_counter() - started)
    app.close()
    proc = _start_worker(url, ticks)
    try:
        _wait_ticks(ticks, n, proc)
    finally:
        _stop(proc)
    stamps = _read_ticks(ticks)
    return enqueue_rate, (n - 1) / (max(stamps) - min(stamps))


def ferryq_pickup(samples: int, workdir: pathlib.Path) -> tuple[float, float]:
    """(p50, p99) ms from enqueue to task start, one job in flight at a time."""
    run = pathlib.Path(tempfile.mkdtemp(prefix="ferryq-", dir=workdir))
    url, ticks = f"sqlite:///{run}/bench.db", run / "ticks"
    app = ferryq.App(url)
    proc = _start_worker(url, ticks)
    rng = random.Random(1)
    enqueued: list[float] = []
    try:
        app.enqueue(ferryq_tasks.tick.name)  # warm-up: start-up is not latency
        _wait_ticks(ticks, 1, proc)
        for i in range(samples):
            time.sleep(rng.uniform(0.0, 0.1))
            enqueued.append(time.time())
            app.enqueue(ferryq_tasks.tick.name)
            _wait_ticks(ticks, i + 2, proc)
    finally:
        _stop(proc)
        app.close()
    started = _read_ticks(ticks)[1:]
    latencies = sorted((s - e) * 1000 for s, e in zip(started, enqueued, strict=True))
    q = statistics.quantiles(latencies, n=100, method="inclusive")
    return q[49], q[98]


def _median(figures: list[Figures], name: str) -> float:
    return float(statistics.median(getattr(f, name) for f in figures))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    ours, peer = [], []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = pathlib.Path(tmp)
        for round_no in range(1, options.rounds + 1):
            mine, theirs = Figures(), Figures()
            mine.enqueue, mine.drain = ferryq_drain(options.jobs, workdir)
            theirs.drain = huey_sqlite.drain_throughput(options.jobs, workdir)
            mine.p50, mine.p99 = ferryq_pickup(options.samples, workdir)
            theirs.p50, theirs.p99 = huey_sqlite.pickup_latency(options.samples, workdir)
            ours.append(mine)
            peer.append(theirs)
            print(f"round {round_no}: ferryq drain {mine.drain:,.0f}/s p50 {mine.p50:.2f} ms "
                  f"p99 {mine.p99:.2f} ms | huey drain {theirs.drain:,.0f}/s "
                  f"p50 {theirs.p50:.1f} ms p99 {theirs.p99:.1f} ms", flush=True)  # fmt: skip
    _report(ours, peer, options)


def _report(ours: list[Figures], peer: list[Figures], options: argparse.Namespace) -> None:
    import huey

    print(f"\nmedians of {options.rounds} rounds, {options.jobs:,} no-op jobs, "
          f"{options.samples} latency samples; ferryq {ferryq.__version__} "
          f"(one worker process, concurrency {CONCURRENCY}), huey {huey.__version__} "
          "SqliteHuey (one consumer, its fastest single-process setting)")  # fmt: skip
    rows = [
        ("drain, jobs/s", "drain", True),
        ("pickup p50, ms", "p50", False),
        ("pickup p99, ms", "p99", False),
    ]
    print(f"{'':18}{'ferryq':>12}{'huey':>12}{'ferryq vs huey':>18}")
    for label, name, higher_is_better in rows:
        a, b = _median(ours, name), _median(peer, name)
        ratio = a / b if higher_is_better else b / a
        print(f"{label:18}{a:>12,.2f}{b:>12,.2f}{ratio:>17.1f}x")
    print(f"{'enqueue, jobs/s':18}{_median(ours, 'enqueue'):>12,.0f}{'-':>12}"
          "   (batches of 1,000)")  # fmt: skip


if __name__ == "__main__":
    main()
