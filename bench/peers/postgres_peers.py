"""Peer figures for PGQueuer and Procrastinate on PostgreSQL, measured on this machine.

Every function takes ``dsn``, a ``postgresql://`` URL (asyncpg takes no other form)
of an existing empty database, and first installs the peer's default schema there:
PGQueuer's ``Queries.install`` (logged tables) or Procrastinate's
``apply_schema_async``. Use a fresh database per call.

Consumers run in a separate OS process, ``python -m bench.peers.postgres_peers
consume PEER DSN [SETTING]``, which registers the no-op tasks defined here. Each task
appends its start time (``time.time()``) as one fixed-width 18-byte line to a tick
file named by an environment variable: an O_APPEND write costing a few microseconds.
The parent counts lines with ``os.stat`` instead of querying the database, so its
polling adds no load to PostgreSQL. Consumers get SIGTERM, then SIGKILL after 10 s.

``python -m bench.peers.postgres_peers selftest ADMIN_DSN`` prints every figure,
each measured in a database it creates through ``ADMIN_DSN`` and drops afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import pathlib
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from contextlib import AbstractAsyncContextManager
from importlib import metadata
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from bench import calls

_TICKS_ENV = "BENCH_PG_PEER_TICKS"
_LINE = 18  # len(b"%017.6f\n" % time.time())
_BATCH = 1_000
_TASK = "bench_tick"
_ROOT = pathlib.Path(__file__).resolve().parents[2]
_USAGE = "usage: consume pgqueuer|procrastinate DSN [SETTING] | selftest ADMIN_DSN"

# Fastest single-process consumer settings here (see pgqueuer_drain and
# procrastinate_drain for the sweeps); the pickup measurements use them too.
PGQUEUER_BATCH_SIZE = 500
PROCRASTINATE_CONCURRENCY = 5
#: Connections of the pool that concurrent one-job enqueues share (a loop uses one).
#: The peers' best here, 100 callers, 2,000 calls, medians of 3 (jobs/s; durable
#: server, 2 cores, a test suite running beside): PGQueuer 2: 1,753, 4: 1,588,
#: 8: 1,264, 16: 1,233, 32: 1,163; Procrastinate 2: 979, 4: 1,040, 8: 1,115,
#: 16: 1,093, 32: 1,073. Their clients use the CPU the server needs, so more
#: connections do not help.
ENQUEUE_CONNECTIONS = 4
_NOOP = "bench_noop"  # the task that one-job enqueues name: one int argument

_Enqueue = Callable[[int], Awaitable[None]]  # enqueue k no-op jobs, 1,000 per call
_Rate = Callable[[str, int], float]
_Latency = Callable[[str, int], tuple[float, float]]


def _tick() -> None:
    line = b"%017.6f\n" % time.time()
    fd = os.open(os.environ[_TICKS_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


async def pgqueuer_task(job: Any) -> None:
    """PGQueuer entrypoint ``bench_tick``: no-op, records its start time."""
    _tick()


async def procrastinate_task() -> None:
    """Procrastinate task ``bench_tick``: no-op, records its start time."""
    _tick()


async def procrastinate_noop(x: int) -> None:
    """Procrastinate task ``bench_noop``: enqueued only, never run here."""


async def _pgq_install(dsn: str) -> None:
    import asyncpg
    from pgqueuer import Queries  # type: ignore[import-not-found, unused-ignore]

    conn = await asyncpg.connect(dsn)
    try:
        await Queries.from_asyncpg_connection(conn).install()
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def _pgq_session(dsn: str) -> AsyncIterator[_Enqueue]:
    """One asyncpg connection; a batch is one ``Queries.enqueue`` call with lists."""
    import asyncpg
    from pgqueuer import Queries  # type: ignore[import-not-found, unused-ignore]

    conn = await asyncpg.connect(dsn)
    queries = Queries.from_asyncpg_connection(conn)

    async def enqueue(k: int) -> None:
        for start in range(0, k, _BATCH):
            size = min(_BATCH, k - start)
            payloads: list[bytes | None] = [None] * size
            await queries.enqueue([_TASK] * size, payloads, [0] * size)

    try:
        yield enqueue
    finally:
        await conn.close()


async def _pgq_consume(dsn: str, batch_size: int = PGQUEUER_BATCH_SIZE) -> None:
    """A bare ``QueueManager`` (no scheduler) on one asyncpg connection."""
    import asyncpg
    from pgqueuer import Queries, QueueManager  # type: ignore[import-not-found, unused-ignore]

    qm = QueueManager(Queries.from_asyncpg_connection(await asyncpg.connect(dsn)))
    qm.entrypoint(_TASK)(pgqueuer_task)
    await qm.run(batch_size=batch_size)


def _proc_app(dsn: str, pool_size: int = 4) -> Any:
    import procrastinate  # type: ignore[import-not-found, unused-ignore]

    connector = procrastinate.PsycopgConnector(conninfo=dsn, min_size=1, max_size=pool_size)
    app = procrastinate.App(connector=connector)
    app.task(name=_TASK)(procrastinate_task)
    app.task(name=_NOOP)(procrastinate_noop)
    return app


async def _proc_install(dsn: str) -> None:
    async with _proc_app(dsn).open_async() as app:
        await app.schema_manager.apply_schema_async()


@contextlib.asynccontextmanager
async def _proc_session(dsn: str) -> AsyncIterator[_Enqueue]:
    """An open app; a batch is one ``Task.batch_defer_async`` call (one statement)."""
    async with _proc_app(dsn).open_async() as app:
        task = app.tasks[_TASK]

        async def enqueue(k: int) -> None:
            for start in range(0, k, _BATCH):
                await task.batch_defer_async(*[{}] * min(_BATCH, k - start))

        yield enqueue


async def _proc_consume(dsn: str, concurrency: int = PROCRASTINATE_CONCURRENCY) -> None:
    """``run_worker_async`` with a pool that has a connection per job slot to spare."""
    async with _proc_app(dsn, pool_size=concurrency + 4).open_async() as app:
        await app.run_worker_async(concurrency=concurrency)


@dataclasses.dataclass(frozen=True)
class _Peer:
    name: str
    install: Callable[[str], Coroutine[Any, Any, None]]
    session: Callable[[str], AbstractAsyncContextManager[_Enqueue]]
    consume: Callable[..., Coroutine[Any, Any, None]]  # (dsn, optional int setting)


_PGQ = _Peer("pgqueuer", _pgq_install, _pgq_session, _pgq_consume)
_PROC = _Peer("procrastinate", _proc_install, _proc_session, _proc_consume)
_PEERS = {peer.name: peer for peer in (_PGQ, _PROC)}


@dataclasses.dataclass(frozen=True)
class _Run:
    """A running consumer process and its tick file."""

    proc: subprocess.Popen[bytes]
    ticks: pathlib.Path

    async def wait(self, count: int, interval: float, timeout: float) -> None:
        """Sleep until ``count`` tasks have started; fail if the consumer died."""
        deadline = time.monotonic() + timeout
        while self.ticks.stat().st_size < count * _LINE:
            if self.proc.poll() is not None:
                log = self.ticks.with_name("consumer.log").read_text(errors="replace")
                raise RuntimeError(f"consumer exited with {self.proc.returncode}:\n{log}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"ran {self.ticks.stat().st_size // _LINE}/{count} tasks")
            await asyncio.sleep(interval)

    def stamps(self) -> list[float]:
        return [float(line) for line in self.ticks.read_bytes().split()]


@contextlib.contextmanager
def _consumer(peer: _Peer, dsn: str, *settings: int) -> Iterator[_Run]:
    """Start one consumer process with a fresh tick file; stop it on exit."""
    with tempfile.TemporaryDirectory(prefix=f"{peer.name}-") as tmp:
        ticks = pathlib.Path(tmp, "ticks")
        ticks.touch()
        env = {**os.environ, _TICKS_ENV: str(ticks)}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_ROOT), env.get("PYTHONPATH")]))
        cmd = [sys.executable, "-m", __name__, "consume", peer.name, dsn, *map(str, settings)]
        with open(pathlib.Path(tmp, "consumer.log"), "wb") as log:
            proc = subprocess.Popen(cmd, cwd=_ROOT, env=env, stdout=log, stderr=log)
        try:
            yield _Run(proc, ticks)
        finally:
            proc.terminate()  # SIGTERM, unless it has already exited
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def _enqueue_rate(peer: _Peer, dsn: str, n: int) -> float:
    """Install the schema, then time enqueueing ``n`` jobs on an open session."""
    await peer.install(dsn)
    async with peer.session(dsn) as enqueue:
        start = time.perf_counter()
        await enqueue(n)
        return n / (time.perf_counter() - start)


def _drain_rate(peer: _Peer, dsn: str, n: int, setting: int) -> float:
    """Fill the queue, then time one consumer from its first task start to its last.

    ``(n - 1) / (last start - first start)`` from the tasks' own timestamps excludes
    interpreter start-up, imports and schema checks exactly, and neither the enqueue
    phase (over before the consumer starts) nor our 20 ms polling is mixed in.
    """
    asyncio.run(_enqueue_rate(peer, dsn, n))  # its rate is not used
    with _consumer(peer, dsn, setting) as run:
        asyncio.run(run.wait(n, interval=0.02, timeout=60 + n / 100))
        stamps = run.stamps()
    return (n - 1) / (max(stamps) - min(stamps))


async def _pickup_samples(peer: _Peer, dsn: str, samples: int, run: _Run) -> list[float]:
    rng = random.Random(1)
    enqueued: list[float] = []
    async with peer.session(dsn) as enqueue:
        await enqueue(1)  # warm-up: consumer start-up and first-use costs
        await run.wait(1, interval=0.005, timeout=60)
        for i in range(samples):
            await asyncio.sleep(rng.uniform(0.0, 0.1))
            enqueued.append(time.time())
            await enqueue(1)
            await run.wait(i + 2, interval=0.005, timeout=30)
    return enqueued


def _pickup(peer: _Peer, dsn: str, samples: int) -> tuple[float, float]:
    """(p50, p99) ms from just before the enqueue call to the task's start.

    One idle consumer with the settings above. After a warm-up job, jobs are
    enqueued one at a time (one committed INSERT each, whose trigger NOTIFYs the
    consumer; both peers LISTEN), each a uniform 0-100 ms (``random.Random(1)``)
    after the previous one ran, so the samples meet any consumer timer at every
    phase. The parent's 5 ms polling only delays the next sample, never a latency.
    """
    asyncio.run(peer.install(dsn))
    with _consumer(peer, dsn) as run:
        enqueued = asyncio.run(_pickup_samples(peer, dsn, samples, run))
        started = run.stamps()[1:]
    lat = sorted((s - e) * 1000 for s, e in zip(started, enqueued, strict=True))
    q = statistics.quantiles(lat, n=100, method="inclusive")
    return q[49], q[98]


def pgqueuer_enqueue(dsn: str, n: int) -> float:
    """Jobs/s enqueued by ``Queries.enqueue`` with lists of 1,000 (one INSERT each)."""
    return asyncio.run(_enqueue_rate(_PGQ, dsn, n))


def procrastinate_enqueue(dsn: str, n: int) -> float:
    """Jobs/s enqueued by ``Task.batch_defer_async`` with 1,000 jobs per call."""
    return asyncio.run(_enqueue_rate(_PROC, dsn, n))


def pgqueuer_drain(dsn: str, n: int, *, batch_size: int = PGQUEUER_BATCH_SIZE) -> float:
    """Jobs/s for one PGQueuer ``QueueManager`` draining ``n`` pre-enqueued no-op jobs.

    ``batch_size`` is the jobs per dequeue query; ``max_concurrent_tasks`` is left
    unlimited, so every dequeued job runs at once as its own asyncio task. Sweep
    (20k jobs; runs, median jobs/s): 10: 3, 4,500; 25: 3, 8,300; 50: 3, 12,100;
    100: 9, 12,900; 200: 9, 13,100; 300: 12, 13,600; 500: 15, 13,800; 1000: 12,
    13,400. Single runs spread 10,400-14,700 from 100 up: past 300 it is flat
    within this machine's noise.
    """
    return _drain_rate(_PGQ, dsn, n, batch_size)


def procrastinate_drain(dsn: str, n: int, *, concurrency: int = PROCRASTINATE_CONCURRENCY) -> float:
    """Jobs/s for one Procrastinate worker draining ``n`` pre-enqueued no-op jobs.

    ``concurrency`` is the worker's job slots, with a psycopg pool of
    ``concurrency + 4`` connections; other options are defaults (LISTEN/NOTIFY on,
    finished jobs kept as ``succeeded``). The worker fetches one job per
    ``procrastinate_fetch_job`` call, one call at a time, so slots beyond two only
    let fetching overlap job completion. Sweep (20k jobs; runs, median jobs/s):
    1: 10, 520; 2: 5, 574; 5: 9, 575; 10: 6, 455; 20: 12, 558; 50: 2, 488, with
    single runs anywhere in 410-750. ``delete_jobs="successful"`` and polling every
    10 ms instead of LISTEN changed nothing measurable in a 3k-job check.
    """
    return _drain_rate(_PROC, dsn, n, concurrency)


def pgqueuer_pickup(dsn: str, samples: int) -> tuple[float, float]:
    """(p50, p99) ms enqueue-to-start for an idle PGQueuer consumer; see ``_pickup``."""
    return _pickup(_PGQ, dsn, samples)


def procrastinate_pickup(dsn: str, samples: int) -> tuple[float, float]:
    """(p50, p99) ms enqueue-to-start for an idle Procrastinate worker; see ``_pickup``."""
    return _pickup(_PROC, dsn, samples)


async def _pgq_calls(dsn: str, n: int, callers: int) -> float:
    import asyncpg
    from pgqueuer import Queries  # type: ignore[import-not-found, unused-ignore]

    await _pgq_install(dsn)
    if callers == 1:
        conn = await asyncpg.connect(dsn)
        try:
            one = Queries.from_asyncpg_connection(conn)
            return await calls.loop_async(lambda i: one.enqueue(_NOOP, b"%d" % i), n)
        finally:
            await conn.close()
    size = ENQUEUE_CONNECTIONS
    async with asyncpg.create_pool(dsn, min_size=size, max_size=size) as pool:
        shared = Queries.from_asyncpg_pool(pool)
        return await calls.gather([lambda i: shared.enqueue(_NOOP, b"%d" % i)] * callers, n)


async def _proc_calls(dsn: str, n: int, callers: int) -> float:
    await _proc_install(dsn)
    pool = 1 if callers == 1 else ENQUEUE_CONNECTIONS
    async with _proc_app(dsn, pool_size=pool).open_async() as app:
        task = app.tasks[_NOOP]

        def call(i: int) -> Awaitable[int]:
            return task.defer_async(x=i)  # type: ignore[no-any-return]

        if callers == 1:
            return await calls.loop_async(call, n)
        return await calls.gather([call] * callers, n)


def pgqueuer_enqueue_calls(dsn: str, n: int, callers: int) -> float:
    """Jobs/s of ``n`` ``Queries.enqueue(entrypoint, payload)`` calls, one job (one
    autocommit INSERT) each: one coroutine on one connection in a loop, or ``callers``
    coroutines at once sharing a pool of ENQUEUE_CONNECTIONS connections."""
    return asyncio.run(_pgq_calls(dsn, n, callers))


def procrastinate_enqueue_calls(dsn: str, n: int, callers: int) -> float:
    """Jobs/s of ``n`` ``await task.defer_async(x=i)`` calls, one job each: one
    coroutine in a loop on a pool of one connection, or ``callers`` coroutines at once
    sharing a pool of ENQUEUE_CONNECTIONS connections."""
    return asyncio.run(_proc_calls(dsn, n, callers))


@contextlib.contextmanager
def _scratch_db(admin_dsn: str) -> Iterator[str]:
    """Create an empty database via ``admin_dsn``, yield its URL, then drop it."""
    import asyncpg

    name = f"peer_{uuid.uuid4().hex[:12]}"

    async def admin(sql: str) -> None:
        conn = await asyncpg.connect(admin_dsn)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(admin(f'CREATE DATABASE "{name}"'))
    try:
        yield urlunsplit(urlsplit(admin_dsn)._replace(path=f"/{name}"))
    finally:
        asyncio.run(admin(f'DROP DATABASE "{name}" WITH (FORCE)'))


def _selftest(admin_dsn: str, peer: str, enqueue: _Rate, drain: _Rate, pickup: _Latency) -> None:
    """Print one peer's figures for 20k jobs and 100 latency samples."""
    print(f"{peer} {metadata.version(peer)}", flush=True)
    with _scratch_db(admin_dsn) as dsn:
        print(f"  enqueue: {enqueue(dsn, 20_000):,.0f} jobs/s", flush=True)
    with _scratch_db(admin_dsn) as dsn:
        print(f"  drain: {drain(dsn, 20_000):,.0f} jobs/s", flush=True)
    with _scratch_db(admin_dsn) as dsn:
        p50, p99 = pickup(dsn, 100)
    print(f"  pickup latency: p50 {p50:.1f} ms, p99 {p99:.1f} ms", flush=True)


def _main(argv: list[str]) -> None:
    match argv:
        case ["consume", peer, dsn, *setting] if peer in _PEERS and len(setting) <= 1:
            asyncio.run(_PEERS[peer].consume(dsn, *map(int, setting)))
        case ["selftest", admin]:
            _selftest(admin, "pgqueuer", pgqueuer_enqueue, pgqueuer_drain, pgqueuer_pickup)
            p = (procrastinate_enqueue, procrastinate_drain, procrastinate_pickup)
            _selftest(admin, "procrastinate", *p)
        case _:
            sys.exit(_USAGE)


if __name__ == "__main__":
    # Import under the real module name: Procrastinate warns about apps made in
    # __main__, and _consumer runs the module by that name.
    from bench.peers import postgres_peers

    postgres_peers._main(sys.argv[1:])
