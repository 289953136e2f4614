"""Peer figures for PGQueuer and Procrastinate on PostgreSQL, measured on this machine.

Every function takes ``dsn``, a ``postgresql://`` URL (asyncpg accepts no other
form) of an existing empty database, and installs the peer's schema into it first:
PGQueuer's ``Queries.install`` (default, fully logged tables) or Procrastinate's
``schema_manager.apply_schema_async``. Use a fresh database per call.

Consumers run in a separate OS process, ``python -m bench.peers.postgres_peers
consume PEER DSN [SETTING...]``, which registers the no-op tasks defined here. Each
task appends its start time (``time.time()``) as one fixed-width 18-byte line to a
tick file named by an environment variable: an O_APPEND write that costs a few
microseconds. The parent counts lines with ``os.stat`` instead of querying the
database, so polling adds no load to PostgreSQL. Consumers are stopped with SIGTERM,
then killed after 10 s.

Run ``python -m bench.peers.postgres_peers selftest ADMIN_DSN`` (repo root on
``sys.path``) to print every figure; it creates and drops one database per call.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import pathlib
import random
import signal
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

_TICKS_ENV = "BENCH_PG_PEER_TICKS"
_LINE = 18  # len(b"%017.6f\n" % time.time())
_BATCH = 1_000
_TASK = "bench_tick"
_ROOT = pathlib.Path(__file__).resolve().parents[2]

# Fastest single-process consumer settings found on this machine (see the sweeps
# in pgqueuer_drain and procrastinate_drain); pickup uses the same ones.
PGQUEUER_BATCH_SIZE = 100
PROCRASTINATE_CONCURRENCY = 10

Enqueue = Callable[[int], Awaitable[None]]  # enqueue k no-op jobs, in batches of _BATCH


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


# --- PGQueuer ---------------------------------------------------------------------


async def _pgq_install(dsn: str) -> None:
    import asyncpg
    from pgqueuer import Queries  # type: ignore[import-not-found, unused-ignore]

    conn = await asyncpg.connect(dsn)
    try:
        await Queries.from_asyncpg_connection(conn).install()
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def _pgq_session(dsn: str) -> AsyncIterator[Enqueue]:
    """One asyncpg connection; each batch is one ``Queries.enqueue`` call with lists."""
    import asyncpg
    from pgqueuer import Queries  # type: ignore[import-not-found, unused-ignore]

    conn = await asyncpg.connect(dsn)
    queries = Queries.from_asyncpg_connection(conn)

    async def enqueue(k: int) -> None:
        for start in range(0, k, _BATCH):
            size = min(_BATCH, k - start)
            await queries.enqueue([_TASK] * size, [None] * size, [0] * size)

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


# --- Procrastinate ----------------------------------------------------------------


def _procrastinate_app(dsn: str, pool_size: int = 4) -> Any:
    import procrastinate  # type: ignore[import-not-found, unused-ignore]

    connector = procrastinate.PsycopgConnector(conninfo=dsn, min_size=1, max_size=pool_size)
    app = procrastinate.App(connector=connector)
    app.task(name=_TASK)(procrastinate_task)
    return app


async def _procrastinate_install(dsn: str) -> None:
    async with _procrastinate_app(dsn).open_async() as app:
        await app.schema_manager.apply_schema_async()


@contextlib.asynccontextmanager
async def _procrastinate_session(dsn: str) -> AsyncIterator[Enqueue]:
    """An opened app; each batch is one ``Task.batch_defer_async`` call (one INSERT)."""
    async with _procrastinate_app(dsn).open_async() as app:
        task = app.tasks[_TASK]

        async def enqueue(k: int) -> None:
            for start in range(0, k, _BATCH):
                await task.batch_defer_async(*[{}] * min(_BATCH, k - start))

        yield enqueue


async def _procrastinate_consume(dsn: str, concurrency: int = PROCRASTINATE_CONCURRENCY) -> None:
    """``run_worker_async`` with a pool that has a connection per job slot to spare."""
    async with _procrastinate_app(dsn, pool_size=concurrency + 4).open_async() as app:
        await app.run_worker_async(concurrency=concurrency)


# --- Shared methodology -----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Peer:
    name: str
    install: Callable[[str], Coroutine[Any, Any, None]]
    session: Callable[[str], AbstractAsyncContextManager[Enqueue]]
    consume: Callable[..., Coroutine[Any, Any, None]]


_PEERS = {
    "pgqueuer": _Peer("pgqueuer", _pgq_install, _pgq_session, _pgq_consume),
    "procrastinate": _Peer(
        "procrastinate", _procrastinate_install, _procrastinate_session, _procrastinate_consume
    ),
}


async def _timed_enqueue(peer: _Peer, dsn: str, n: int) -> float:
    async with peer.session(dsn) as enqueue:
        start = time.perf_counter()
        await enqueue(n)
        return n / (time.perf_counter() - start)


async def _install_and_fill(peer: _Peer, dsn: str, n: int) -> None:
    await peer.install(dsn)
    async with peer.session(dsn) as enqueue:
        await enqueue(n)


@dataclasses.dataclass(frozen=True)
class _Run:
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
def _consumer(peer: _Peer, dsn: str, settings: list[int]) -> Iterator[_Run]:
    """Start one consumer process with a fresh tick file; stop it on exit."""
    with tempfile.TemporaryDirectory(prefix=f"{peer.name}-") as tmp:
        ticks = pathlib.Path(tmp, "ticks")
        ticks.touch()
        env = {**os.environ, _TICKS_ENV: str(ticks)}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_ROOT), env.get("PYTHONPATH")]))
        cmd = [sys.executable, "-m", __spec__.name if __spec__ else __name__, "consume"]
        cmd += [peer.name, dsn, *map(str, settings)]
        with open(pathlib.Path(tmp, "consumer.log"), "wb") as log:
            proc = subprocess.Popen(cmd, cwd=_ROOT, env=env, stdout=log, stderr=log)
        run = _Run(proc, ticks)
        try:
            yield run
        finally:
            _stop(proc)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _drain_rate(peer: _Peer, dsn: str, n: int, settings: list[int]) -> float:
    """Fill the queue, then time one consumer from its first task start to its last.

    ``(n - 1) / (last start - first start)`` uses the tasks' own timestamps, so
    interpreter start-up, imports, schema checks and our 20 ms completion polling are
    all excluded, and the enqueue phase is over before the consumer starts.
    """
    asyncio.run(_install_and_fill(peer, dsn, n))
    with _consumer(peer, dsn, settings) as run:
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

    One idle consumer with the default settings above; after a warm-up job, one job
    at a time is enqueued (one committed INSERT, which also issues the peer's NOTIFY),
    each a uniform 0-100 ms after the previous one ran (``random.Random(1)``), so the
    samples see the consumer at every point of any timer it may have.
    """
    asyncio.run(peer.install(dsn))
    with _consumer(peer, dsn, []) as run:
        enqueued = asyncio.run(_pickup_samples(peer, dsn, samples, run))
        started = run.stamps()[1:]
    lat = sorted((s - e) * 1000 for s, e in zip(started, enqueued, strict=True))
    q = statistics.quantiles(lat, n=100, method="inclusive")
    return q[49], q[98]


# --- Public functions -------------------------------------------------------------


def pgqueuer_enqueue(dsn: str, n: int) -> float:
    """Jobs/s enqueued by ``Queries.enqueue`` with lists of 1,000 (one INSERT each)."""
    asyncio.run(_pgq_install(dsn))
    return asyncio.run(_timed_enqueue(_PEERS["pgqueuer"], dsn, n))


def procrastinate_enqueue(dsn: str, n: int) -> float:
    """Jobs/s enqueued by ``Task.batch_defer_async`` with 1,000 jobs per call."""
    asyncio.run(_procrastinate_install(dsn))
    return asyncio.run(_timed_enqueue(_PEERS["procrastinate"], dsn, n))


def pgqueuer_drain(dsn: str, n: int, *, batch_size: int = PGQUEUER_BATCH_SIZE) -> float:
    """Jobs/s for one PGQueuer ``QueueManager`` draining ``n`` pre-enqueued no-op jobs.

    Settings: ``batch_size`` (jobs per dequeue query), no ``max_concurrent_tasks``
    cap, so every dequeued job runs as its own asyncio task at once.
    """
    return _drain_rate(_PEERS["pgqueuer"], dsn, n, [batch_size])


def procrastinate_drain(dsn: str, n: int, *, concurrency: int = PROCRASTINATE_CONCURRENCY) -> float:
    """Jobs/s for one Procrastinate worker draining ``n`` pre-enqueued no-op jobs.

    Settings: worker ``concurrency`` (job slots; each slot fetches one job per query),
    a psycopg pool of ``concurrency + 4`` connections, other worker options default
    (LISTEN/NOTIFY on, finished jobs kept with status ``succeeded``).
    """
    return _drain_rate(_PEERS["procrastinate"], dsn, n, [concurrency])


def pgqueuer_pickup(dsn: str, samples: int) -> tuple[float, float]:
    """(p50, p99) ms enqueue-to-start for an idle PGQueuer consumer; see :func:`_pickup`."""
    return _pickup(_PEERS["pgqueuer"], dsn, samples)


def procrastinate_pickup(dsn: str, samples: int) -> tuple[float, float]:
    """(p50, p99) ms enqueue-to-start for an idle Procrastinate worker; see :func:`_pickup`."""
    return _pickup(_PEERS["procrastinate"], dsn, samples)


# --- Command line -----------------------------------------------------------------


@contextlib.contextmanager
def _scratch_db(admin_dsn: str) -> Iterator[str]:
    """Create an empty database via ``admin_dsn``; yield its URL; drop it afterwards."""
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


def _selftest(admin_dsn: str, n: int = 20_000, samples: int = 100) -> None:
    peers: dict[
        str,
        tuple[
            Callable[[str, int], float],
            Callable[[str, int], float],
            Callable[[str, int], tuple[float, float]],
        ],
    ] = {
        "pgqueuer": (pgqueuer_enqueue, pgqueuer_drain, pgqueuer_pickup),
        "procrastinate": (procrastinate_enqueue, procrastinate_drain, procrastinate_pickup),
    }
    for peer, (enqueue, drain, pickup) in peers.items():
        print(f"{peer} {metadata.version(peer)}", flush=True)
        with _scratch_db(admin_dsn) as dsn:
            print(f"  enqueue: {enqueue(dsn, n):,.0f} jobs/s", flush=True)
        with _scratch_db(admin_dsn) as dsn:
            print(f"  drain: {drain(dsn, n):,.0f} jobs/s", flush=True)
        with _scratch_db(admin_dsn) as dsn:
            p50, p99 = pickup(dsn, samples)
        print(f"  pickup latency: p50 {p50:.1f} ms, p99 {p99:.1f} ms", flush=True)


def _main(argv: list[str]) -> None:
    match argv:
        case ["consume", peer, dsn, *settings]:
            asyncio.run(_PEERS[peer].consume(dsn, *map(int, settings)))
        case ["selftest", admin_dsn]:
            _selftest(admin_dsn)
        case _:
            sys.exit(
                f"usage: {__spec__.name if __spec__ else __name__} "
                "consume pgqueuer|procrastinate DSN [SETTING] | selftest ADMIN_DSN"
            )


if __name__ == "__main__":
    # Import under the real module name: Procrastinate warns about apps made in __main__.
    from bench.peers import postgres_peers

    postgres_peers._main(sys.argv[1:])
