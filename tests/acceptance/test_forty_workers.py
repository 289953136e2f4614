"""Forty worker processes on one PostgreSQL server of ``max_connections = 100``:
directly, each within a budget of ``connections=3``, and through a real PgBouncer in
transaction mode (``default_pool_size = 10``, ``?pooler=transaction``).

The module starts a server of its own (tests/pg.py ``local_cluster``), since the
session's has room for 200, and, for the pooled case, a PgBouncer in front of it
(tests/pgbouncer.py ``local_bouncer``). Forty worker processes of
tests/acceptance/lanes_app.py, 3 slots each, start; once every one of them runs, the
test enqueues JOBS jobs in ROUNDS rounds while they claim: plain ones, and lane jobs
in 20 lanes of limit 1 and 20 of limit 3 (rules ``l1:*`` and ``l3:*``). When every job
has succeeded the workers stop with SIGTERM, and the test proves:

1. Every job ran exactly once: one attempt logged for each (lane_checks.py reads
   them), with the fence the database kept, and nothing lost (every id stored,
   succeeded).
2. Every lane kept its limit and its claim order (lane_checks.py, lane_order.py).
3. Every worker claimed something: forty processes competed, not a few of them.
4. No worker logged a connection error (refused, lost, a duty that failed and was
   retried), an error or a traceback, and each exited 0. A warning that the machine
   is slow (a maintenance round late) is no connection error.
5. The connections: directly, the workers held at most two each from the moment all
   ran (the session's, to LISTEN and lead, and a pool of one; they never enqueue, so
   the third of the budget is never opened): 80 of the server's 100. Through the
   pooler (no session connection: a pool of two), at most two clients each, and the
   server saw at most the pooler's ten for the database.

The count makes no difference to what is proven beyond its being enough for every
worker to claim: 720 jobs are 6 a slot (each worker ran 9 to 32 in trials). Forty
Python processes starting are most of the time: an interpreter that imports ferryq,
asyncpg and the app takes about 0.6 s of a core, half a minute of a busy 2-core
machine for forty. ``--processes`` would not start them more cheaply (each child is a
new interpreter, and its supervisor imports the app too), so the workers are forked
from one process that has imported them (tests/acceptance/forked_workers.py): each an
ordinary ``ferryq.Worker`` with its own event loop, connections and stderr. Leases are
long (TTR), so that a slow renewal on a busy machine never runs a job twice. The test
prints the timings and the connections it saw (pytest -s).
"""

from __future__ import annotations

import asyncio
import random
import re
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest
from psycopg.rows import TupleRow

import ferryq
from ferryq.job import Job
from tests.acceptance.conftest import Workers
from tests.acceptance.lane_checks import (
    all_jobs,
    assert_lane_kept,
    attempts_by_job,
    read_attempts,
)
from tests.acceptance.lanes_app import lane_step
from tests.conftest import POOLED, pooled_url
from tests.pg import LocalCluster, fresh_database, local_cluster
from tests.pgbouncer import POOL_SIZE, Bouncer, local_bouncer
from tests.processes import START_SECONDS, WORKER_STARTED, Process, python, tail, wait_until

MAX_CONNECTIONS = 100
PROCESSES = 40
SLOTS = 3
BUDGET = 3
HELD = 2  # of the budget, by a worker that does not enqueue: session and pool
LANES = {**{f"l1:{n}": 1 for n in range(20)}, **{f"l3:{n}": 3 for n in range(20)}}
PER_LANE = 8
PLAIN = 400
JOBS = PLAIN + PER_LANE * len(LANES)
ROUNDS = 2
TTR = 60.0  # seconds: a lease that a busy machine never lets pass
MAX_SLEEP = 0.005
DRAIN_TIMEOUT = 120.0  # a bound for a hang
SAMPLE_EVERY = 0.05  # seconds between two counts of the connections
WORKERS_NAME = "ferryq-forty"  # the workers' application_name, directly
TEST_NAME = "ferryq-forty-test"  # the test's own App's
#: What a worker logs when a connection fails it: refused, lost, timed out, any duty
#: that failed ("claiming jobs failed: ...; retrying", ferryq/faults.py), and any error.
#: A warning of a slow machine ("the database answered after 2.6 s without a
#: maintenance round") is none: the test runs on busy 2-core machines.
COMPLAINT = re.compile(
    r"\s(ERROR|CRITICAL)\s|Traceback|too many clients|cannot connect|connection lost"
    r"|lost the connection| failed: "
)


@pytest.fixture(scope="module")
def small_server() -> Iterator[LocalCluster]:
    """A server of this module's own, with room for 100 connections only."""
    with local_cluster({"max_connections": str(MAX_CONNECTIONS)}) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def small_server_pooler(small_server: LocalCluster) -> Iterator[Bouncer]:
    with local_bouncer(small_server) as bouncer:
        yield bouncer


@dataclass
class Route:
    """How the workers reach the database, and how their connections are counted."""

    database: str
    server_url: str  # the database, directly, for the test's own connections
    workers_url: str
    bouncer: Bouncer | None = None


@pytest.fixture(params=["postgres", POOLED])
def route(request: pytest.FixtureRequest, small_server: LocalCluster) -> Iterator[Route]:
    with fresh_database(small_server) as url:
        database = url.rsplit("/", 1)[1]
        if request.param == POOLED:
            bouncer: Bouncer = request.getfixturevalue("small_server_pooler")
            workers_url = f"{pooled_url(bouncer.through(url))}&connections={BUDGET}"
            yield Route(database, url, workers_url, bouncer)
        else:
            workers_url = f"{url}?connections={BUDGET}&application_name={WORKERS_NAME}"
            yield Route(database, url, workers_url)


@dataclass
class Counts:
    """The most connections seen at once: ``workers``, the workers' own (directly:
    server connections; through the pooler: its clients); ``database``, the server's
    connections to the test's database but the test's own; ``server``, all the
    server's client connections, the test's included."""

    workers: int = 0
    database: int = 0
    server: int = 0
    samples: int = 0


@dataclass
class Sampler:
    """Counts the connections every SAMPLE_EVERY seconds, in a thread, while the
    workers run; ``steady`` from the moment every worker has started."""

    route: Route
    starting: Counts = field(default_factory=Counts)
    steady: Counts = field(default_factory=Counts)
    settled: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    failures: list[BaseException] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self._run, name="connections", daemon=True)

    def __enter__(self) -> Sampler:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.done.set()
        self.thread.join()

    def _run(self) -> None:
        try:
            url = f"{self.route.server_url}?application_name={TEST_NAME}"
            with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
                while not self.done.wait(SAMPLE_EVERY):
                    into = self.steady if self.settled.is_set() else self.starting
                    self._sample(conn, into)
        except BaseException as exc:
            self.failures.append(exc)

    def _sample(self, conn: psycopg.Connection[TupleRow], into: Counts) -> None:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE application_name = %s),"
            " count(*) FILTER (WHERE datname = %s AND application_name <> %s),"
            " count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'",
            (WORKERS_NAME, self.route.database, TEST_NAME),
        ).fetchone()
        assert row is not None
        workers, database, server = (int(str(n)) for n in row)
        if self.route.bouncer is not None:
            workers = self.route.bouncer.clients(self.route.database)
        into.workers = max(into.workers, workers)
        into.database = max(into.database, database)
        into.server = max(into.server, server)
        into.samples += 1


@pytest.mark.slow
async def test_forty_workers_on_a_server_of_a_hundred_connections(
    route: Route, tmp_path: Path
) -> None:
    with psycopg.connect(route.server_url, autocommit=True, connect_timeout=10) as conn:
        row = conn.execute("SHOW max_connections").fetchone()
    assert row == (str(MAX_CONNECTIONS),)
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    workers = Workers(route.workers_url, log_dir)
    app = ferryq.App(f"{route.server_url}?connections=3&application_name={TEST_NAME}")
    try:
        await _run(app, route, workers)
    finally:
        workers.close()
        await app.aclose()
        app.close()


async def _run(app: ferryq.App, route: Route, workers: Workers) -> None:
    rng = random.Random(0)
    await app.set_lane_limit_async("l1:*", 1)
    await app.set_lane_limit_async("l3:*", 3)
    began = time.monotonic()
    with Sampler(route) as sampler:
        launcher = workers.start(
            python("tests.acceptance.forked_workers", str(PROCESSES), str(workers.log_dir),
                   "--concurrency", str(SLOTS)),
            name="launcher",
        )  # fmt: skip
        children = _started(launcher, workers.log_dir)
        sampler.settled.set()
        started = time.monotonic()
        ids = await _enqueue(app, rng)
        enqueued = time.monotonic()
        counts = await _drain(app)
        drained = time.monotonic()
    assert not sampler.failures, sampler.failures
    assert counts == Counter({"succeeded": JOBS}), counts
    assert launcher.stop() == 0, launcher.describe()  # every worker exited 0
    stopped = time.monotonic()

    print(
        f"\n{PROCESSES} workers {'through PgBouncer' if route.bouncer else 'directly'}: "
        f"started in {started - began:.1f} s, {JOBS} jobs enqueued in "
        f"{enqueued - started:.1f} s and drained {drained - enqueued:.1f} s after, stopped "
        f"in {stopped - drained:.1f} s; connections at most, while starting {sampler.starting}"
        f", then {sampler.steady}"
    )
    ran = _check(ids, children, await all_jobs(app, lane_step.name), workers.log_dir)
    print(f"jobs a worker ran: {min(ran.values())} to {max(ran.values())}")
    _check_connections(route, sampler)


@dataclass(frozen=True)
class Child:
    """A worker process forked by tests/acceptance/forked_workers.py."""

    pid: int
    stderr_path: Path

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""

    def describe(self) -> str:
        return f"worker pid {self.pid}\n--- stderr ---\n{tail(self.stderr())}"


def _started(launcher: Process, log_dir: Path) -> list[Child]:
    """The launcher's children, once every one of them runs (its first log line)."""
    listed = launcher.wait_for(lambda out: out.count("\n") >= PROCESSES, stream="stdout")
    children = [
        Child(int(pid), log_dir / f"worker-{number}.stderr")
        for number, pid in re.findall(r"^worker (\d+) pid (\d+)$", listed, re.MULTILINE)
    ]
    assert len(children) == PROCESSES, listed

    def running() -> bool:
        assert launcher.running(), launcher.describe()
        return all(WORKER_STARTED.search(child.stderr()) for child in children)

    wait_until(running, within=START_SECONDS, what=f"{PROCESSES} workers running")
    return children


async def _enqueue(app: ferryq.App, rng: random.Random) -> set[int]:
    """Every lane's jobs and the plain ones in ROUNDS rounds; a round's calls at once,
    which the store commits together, with one wake-up for the forty workers."""

    def args(key: str, numbers: range) -> list[tuple[str, int, float, bool]]:
        return [(key, n, round(rng.uniform(0, MAX_SLEEP), 4), False) for n in numbers]

    ids: set[int] = set()
    step = PER_LANE // ROUNDS
    for first in range(0, PER_LANE, step):
        numbers = range(first * PLAIN // PER_LANE, (first + step) * PLAIN // PER_LANE)
        calls = [
            app.enqueue_many_async(lane_step.name, args(lane, range(first, first + step)),
                                   lane=lane, ttr=TTR)
            for lane in LANES
        ]  # fmt: skip
        calls.append(app.enqueue_many_async(lane_step.name, args("-", numbers), ttr=TTR))
        for handles in await asyncio.gather(*calls):
            ids.update(h.id for h in handles)
    assert len(ids) == JOBS
    return ids


async def _drain(app: ferryq.App) -> Counter[str]:
    """The counts by state once every job has succeeded, or at DRAIN_TIMEOUT."""
    store = await app.store()
    deadline = time.monotonic() + DRAIN_TIMEOUT
    while True:
        counts: Counter[str] = Counter()
        for (_ns, _queue, state), n in (await store.job_counts(app.namespace)).items():
            counts[state] += n
        if counts["succeeded"] == JOBS or time.monotonic() > deadline:
            return counts
        await store.wait_for_finish(0.2, 0.1)


def _check(ids: set[int], procs: list[Child], jobs: dict[int, Job], log_dir: Path) -> Counter[int]:
    """1 to 4 of the module docstring; the jobs each worker ran, by its pid."""
    assert set(jobs) == ids, f"missing: {sorted(ids - set(jobs))[:20]}"
    by_job = attempts_by_job(read_attempts(log_dir))
    assert set(by_job) == ids, f"never run: {sorted(ids - set(by_job))[:20]}"
    for job in jobs.values():
        runs = by_job[job.id]
        assert job.state == "succeeded", job
        assert len(runs) == 1 and runs[0].fence == job.fence, (job, runs)
        assert runs[0].outcome == "ok", runs
    lanes: defaultdict[str, list[Job]] = defaultdict(list)
    for job in jobs.values():
        if job.lane is not None:
            lanes[job.lane].append(job)
    assert set(lanes) == set(LANES)
    for lane, members in lanes.items():
        members.sort(key=lambda job: job.id)
        assert [j.args[1] for j in members] == list(range(PER_LANE)), f"{lane} order"
        assert_lane_kept("", lane, LANES[lane], members, jobs, by_job)
    ran = Counter(runs[0].pid for runs in by_job.values())
    idle = [proc.describe() for proc in procs if proc.pid not in ran]
    assert not idle, f"{len(idle)} workers claimed nothing: {idle[:2]}"
    for proc in procs:
        complaints = [line for line in proc.stderr().splitlines() if COMPLAINT.search(line)]
        assert not complaints, proc.describe()
    return ran


def _check_connections(route: Route, sampler: Sampler) -> None:
    """5 of the module docstring."""
    steady = sampler.steady
    assert steady.samples, "no count of the connections while the workers ran"
    assert steady.workers <= HELD * PROCESSES, sampler
    if route.bouncer is not None:
        assert steady.database <= POOL_SIZE, sampler
