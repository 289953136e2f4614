"""Peer figures for huey's ``SqliteHuey`` backend, measured on this machine.

``drain_throughput`` and ``pickup_latency`` run one ``huey_consumer`` in a separate OS
process against a fresh SQLite file inside ``workdir``, in WAL mode at synchronous FULL
(``fsync=True``: a commit is on disk when it returns, as ferryq's with
``?synchronous=full``). ``enqueue_calls`` times one job per task call, at any setting.
The consumer imports this module (it must be importable as ``bench.peers.huey_sqlite``,
i.e. the repo root is on ``sys.path``), and finds its database and tick file through
environment variables.

Every task runs :func:`tick`, which appends its start time (``time.time()``) as one
fixed-width line to a tick file: an O_APPEND write of 18 bytes, which is safe across
threads and processes and costs a few microseconds. The parent counts lines with
``os.stat`` instead of querying SQLite, so polling never takes the database lock.
The tasks return ``None``, which huey does not store (``store_none=False``), so no
result row is written.

The consumer runs with ``-q``: huey's default INFO logging writes two lines per
task, and we measure queueing overhead, not log formatting.
"""

from __future__ import annotations

import os
import pathlib
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from huey import SqliteHuey
from huey.storage import SqliteStorage

from bench import calls

_DB_ENV = "BENCH_HUEY_DB"
_TICKS_ENV = "BENCH_HUEY_TICKS"
_LINE = 18  # len(b"%017.6f\n" % time.time())
_ROOT = pathlib.Path(__file__).resolve().parents[2]

# The consumer gets its database from the environment. The parent process swaps in
# a storage for its own fresh file (see _attach); ":memory:" creates no file. fsync=True
# is synchronous FULL; huey's default (fsync=None) sets no pragma and leaves SQLite's
# build default, FULL for the stdlib's SQLite here too (see default_synchronous).
huey = SqliteHuey("bench", filename=os.environ.get(_DB_ENV, ":memory:"), fsync=True)


@huey.task()  # type: ignore[untyped-decorator]  # huey ships no type hints
def tick() -> None:
    """No-op task: record the time its execution started."""
    line = b"%017.6f\n" % time.time()
    fd = os.open(os.environ[_TICKS_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def _attach(workdir: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """Point ``huey`` at a fresh database in a new subfolder of ``workdir``."""
    run = pathlib.Path(tempfile.mkdtemp(prefix="huey-", dir=workdir))
    db, ticks = run / "huey.db", run / "ticks"
    huey.storage.close()
    huey.storage = huey.get_storage(filename=str(db), fsync=True)
    ticks.touch()
    return db, ticks


def _start_consumer(db: pathlib.Path, ticks: pathlib.Path, *args: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, _DB_ENV: str(db), _TICKS_ENV: str(ticks)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_ROOT), env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "huey.bin.huey_consumer", f"{__name__}.huey", "-q", *args]
    with open(db.with_suffix(".log"), "wb") as log:
        return subprocess.Popen(cmd, cwd=_ROOT, env=env, stdout=log, stderr=log)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)  # huey: SIGTERM = stop now, SIGINT = graceful
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_ticks(
    ticks: pathlib.Path, count: int, proc: subprocess.Popen[bytes], interval: float, timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    while ticks.stat().st_size < count * _LINE:
        if proc.poll() is not None:
            raise RuntimeError(f"huey consumer exited with {proc.returncode}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"huey ran {ticks.stat().st_size // _LINE}/{count} tasks")
        time.sleep(interval)


def _read_ticks(ticks: pathlib.Path) -> list[float]:
    return [float(line) for line in ticks.read_bytes().split()]


def drain_throughput(
    n: int, workdir: pathlib.Path, *, workers: int = 1, worker_type: str = "thread"
) -> float:
    """Jobs/s for one huey consumer draining ``n`` pre-enqueued no-op tasks.

    The queue is filled first, then the consumer is started. The figure is
    ``(n - 1) / (last task start - first task start)`` from the tasks' own
    timestamps, so interpreter start-up and huey import are excluded exactly and
    neither the enqueue phase nor our 20 ms completion polling is mixed in.

    Enqueueing inserts ``huey.serialize_task(tick.s())`` messages with one
    ``executemany`` in a single transaction; a plain ``tick()`` call would commit
    (and fsync) once per task. Both write the same rows.

    Worker setting: ``-k thread -w 1`` (huey's default) was the fastest here. On
    this 2-core machine (20k tasks, jobs/s): thread x1 3300-3500, x2/x3 2300-2700;
    greenlet x1/x8 3400-3600 (SQLite blocks and is not monkey-patched, so that is
    one worker in effect); process x2-x6 3250-3450 (several OS processes, so not a
    single-process setting). Extra threads share one SQLite connection and its lock,
    so they only add contention.
    """
    db, ticks = _attach(workdir)
    rows = [(huey.name, huey.serialize_task(tick.s()), 0) for _ in range(n)]  # own ids
    with huey.storage.db(commit=True) as cursor:
        cursor.executemany("insert into task (queue, data, priority) values (?, ?, ?)", rows)
    huey.storage.close()
    proc = _start_consumer(db, ticks, "-w", str(workers), "-k", worker_type)
    try:
        _wait_ticks(ticks, n, proc, interval=0.02, timeout=60 + n / 100)
    finally:
        _stop(proc)
    stamps = _read_ticks(ticks)
    return (n - 1) / (max(stamps) - min(stamps))


def pickup_latency(samples: int, workdir: pathlib.Path) -> tuple[float, float]:
    """(p50, p99) ms from enqueue to task start, one task in flight at a time.

    The consumer runs with huey's default settings (one thread worker, polling
    ``initial_delay`` ``-d 0.1`` s, multiplied by ``backoff`` ``-b 1.15`` after every
    empty poll, capped at ``max_delay`` ``-m 10`` s, reset to 0.1 s whenever a task is
    dequeued). After running a task the worker polls once more, finds nothing and
    sleeps 0.1 s, so a task enqueued ``g`` ms after the previous one ran (g < 100)
    waits about ``100 - g`` ms, and up to 115 ms more once ``g`` passes 100 ms (the
    sleep has grown to 0.115 s): huey's pickup latency is set by its poll timer.

    One warm-up task runs first, so consumer start-up is excluded. Then each sample
    is enqueued with a plain ``tick()`` call (one committed insert), its enqueue time
    taken just before that call, and the next one follows a uniform 0-100 ms gap
    (mean 50 ms) after the previous one has run. That gap samples huey's whole
    100 ms poll cycle evenly; a fixed gap would only ever see one point of it.
    """
    db, ticks = _attach(workdir)
    proc = _start_consumer(db, ticks)
    rng = random.Random(1)
    try:
        tick()
        _wait_ticks(ticks, 1, proc, interval=0.01, timeout=30)
        enqueued: list[float] = []
        for i in range(samples):
            time.sleep(rng.uniform(0.0, 0.1))
            enqueued.append(time.time())
            tick()
            _wait_ticks(ticks, i + 2, proc, interval=0.005, timeout=30)
    finally:
        _stop(proc)
        huey.storage.close()
    started = _read_ticks(ticks)[1:]
    lat = sorted((s - e) * 1000 for s, e in zip(started, enqueued, strict=True))
    q = statistics.quantiles(lat, n=100, method="inclusive")
    return q[49], q[98]


class _SynchronousStorage(SqliteStorage):  # type: ignore[misc]  # huey ships no type hints
    """``SqliteStorage`` at any ``synchronous``: huey's own ``fsync`` option only sets
    FULL (True) or OFF (False), and its default (None) sets nothing, which leaves the
    SQLite build's default (FULL for the stdlib's SQLite here: read it back with
    :func:`default_synchronous`)."""

    def __init__(self, *args: Any, synchronous: str, **kwargs: Any) -> None:
        self._synchronous = synchronous
        super().__init__(*args, **kwargs)

    def _create_connection(self) -> Any:
        conn = super()._create_connection()
        conn.execute(f"pragma synchronous = {self._synchronous}")
        return conn


def _enqueuing_huey(db: pathlib.Path, synchronous: str | None) -> SqliteHuey:
    """A SqliteHuey on ``db`` at ``synchronous`` (None: huey's default settings)."""
    if synchronous is None:
        return SqliteHuey("enqueue", filename=str(db))
    return SqliteHuey("enqueue", filename=str(db), storage_class=_SynchronousStorage,
                      synchronous=synchronous)  # fmt: skip


def default_synchronous(workdir: pathlib.Path) -> str:
    """``PRAGMA synchronous`` of a SqliteHuey made with huey's defaults, as read back."""
    db = pathlib.Path(tempfile.mkdtemp(prefix="huey-", dir=workdir)) / "huey.db"
    queue = _enqueuing_huey(db, None)
    try:
        with queue.storage.db() as cursor:
            level = cursor.execute("pragma synchronous").fetchone()[0]
    finally:
        queue.storage.close()
    return {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}.get(level, str(level))


def enqueue_calls(n: int, workdir: pathlib.Path, *, threads: int, synchronous: str | None) -> float:
    """Enqueues/s of ``n`` calls of a huey task, one job a call (each its own
    ``begin exclusive`` ... commit), from one thread in a loop or from ``threads``
    threads at once, on a fresh database at ``synchronous`` (None: huey's default).
    A SqliteHuey has one connection behind a lock: its threads take turns."""
    db = pathlib.Path(tempfile.mkdtemp(prefix="huey-", dir=workdir)) / "huey.db"
    queue = _enqueuing_huey(db, synchronous)

    @queue.task()  # type: ignore[untyped-decorator]
    def noop(x: int) -> None:
        """Enqueued only: no consumer runs here."""

    try:
        if threads == 1:
            return calls.loop(noop, n)
        return calls.threads([noop] * threads, n)
    finally:
        queue.storage.close()


def _main() -> None:
    import huey as huey_pkg

    with tempfile.TemporaryDirectory() as tmp:
        rate = drain_throughput(20_000, pathlib.Path(tmp))
        p50, p99 = pickup_latency(100, pathlib.Path(tmp))
    print(f"huey {huey_pkg.__version__} SqliteHuey")
    print(f"drain: {rate:,.0f} jobs/s")
    print(f"pickup latency: p50 {p50:.1f} ms, p99 {p99:.1f} ms")


if __name__ == "__main__":
    # Import under the real module name so task names match the consumer's.
    from bench.peers import huey_sqlite

    huey_sqlite._main()
