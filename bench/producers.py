"""Many producer processes, one job per call: what the enqueue's NOTIFY costs.

    python -m bench.producers [--producers N] [--calls N] [--rounds N] [--peers pgqueuer]

An enqueue commits with a NOTIFY on ``ferryq_jobs`` (the wake-up of idle workers),
and PostgreSQL serializes the commits of transactions that notified (one lock, held
through the commit's flush), so a store sends one per queue at most every
``NOTIFY_EVERY`` and owes one to the enqueues between (ferryq.store.postgres.notices).
``--producers`` processes (default 8), each calling
``task.enqueue()`` ``--calls`` times in a loop, as web requests do, on the durable
throwaway cluster (bench/pg_cluster.py); the figure is the calls of all of them over
the time from the first call to the last, after each made one warm-up call. Measured
side by side, alternated, each on a fresh database:

- ``ferryq``: as shipped;
- ``ferryq, NOTIFY each``: a NOTIFY with every enqueue, as before the coalescing
  (``NOTIFY_EVERY`` 0, in this process tree only);
- ``ferryq, no NOTIFY``: none at all (an experiment in this process tree only, not a
  setting: without it an idle worker would wait for its poll);
- PGQueuer's one-job enqueue (its insert also notifies), if it is installed.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time
from collections.abc import Callable

import ferryq
from bench.pg_cluster import cluster
from tests.pg import fresh_database

TASK = "bench.noop"
KINDS = ("ferryq", "ferryq, NOTIFY each", "ferryq, no NOTIFY")


def _notify_as(kind: str) -> None:
    """The experiments: what this process's stores notify."""
    from ferryq.store.postgres import notices

    if kind == "ferryq, NOTIFY each":
        notices.NOTIFY_EVERY = 0.0
    elif kind == "ferryq, no NOTIFY":
        notices.Notices.wanted = lambda self, queues: False  # type: ignore[method-assign]
        notices.Notices.owe = lambda self, queues: None  # type: ignore[method-assign]


def _ferryq_producer(url: str, calls: int, kind: str, start: Callable[[], None]) -> float:
    _notify_as(kind)
    app = ferryq.App(url)
    task = app.task(name=TASK)(_noop)
    try:
        task.enqueue(-1)  # connects, prepares
        start()
        for n in range(calls):
            task.enqueue(n)
        return time.time()
    finally:
        app.close()


def _noop(n: int) -> None:
    return None


def _pgqueuer_producer(url: str, calls: int, start: Callable[[], None]) -> float:
    import asyncio

    import asyncpg
    from pgqueuer import Queries  # type: ignore[import-not-found, unused-ignore]

    async def produce() -> float:
        conn = await asyncpg.connect(url)
        try:
            queries = Queries.from_asyncpg_connection(conn)
            await queries.enqueue("bench_noop", b"-1")
            start()
            for n in range(calls):
                await queries.enqueue("bench_noop", b"%d" % n)
            return time.time()
        finally:
            await conn.close()

    return asyncio.run(produce())


def _child(kind: str, url: str, calls: int, barrier: object, began: object, out: object) -> None:
    def start() -> None:
        barrier.wait()  # type: ignore[attr-defined]
        with began.get_lock():  # type: ignore[attr-defined]
            if began.value == 0.0:  # type: ignore[attr-defined]
                began.value = time.time()  # type: ignore[attr-defined]

    if kind == "pgqueuer":
        ended = _pgqueuer_producer(url, calls, start)
    else:
        ended = _ferryq_producer(url, calls, kind, start)
    out.put(ended)  # type: ignore[attr-defined]


def measure(kind: str, url: str, producers: int, calls: int) -> float:
    """Calls a second of ``producers`` processes together."""
    if kind == "pgqueuer":
        import asyncio

        from bench.peers.postgres_peers import _pgq_install

        asyncio.run(_pgq_install(url))
    else:
        app = ferryq.App(url)
        app.portal_call(app.store())  # the schema, made once
        app.close()
    context = multiprocessing.get_context("spawn")
    barrier, began, out = context.Barrier(producers), context.Value("d", 0.0), context.Queue()
    children = [context.Process(target=_child, args=(kind, url, calls, barrier, began, out))
                for _ in range(producers)]  # fmt: skip
    for child in children:
        child.start()
    ends = [out.get(timeout=600) for _ in children]
    for child in children:
        child.join()
        if child.exitcode != 0:
            raise SystemExit(f"a {kind} producer failed ({child.exitcode})")
    return float(producers * calls / (max(ends) - began.value))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--producers", type=int, default=8)
    parser.add_argument("--calls", type=int, default=500, help="calls of each producer")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--peers", default="pgqueuer")
    options = parser.parse_args()
    kinds = list(KINDS)
    if "pgqueuer" in options.peers.split(","):
        try:
            import pgqueuer  # type: ignore[import-not-found, unused-ignore]  # noqa: F401
        except ImportError:
            print("PGQueuer is not installed (make bench installs it): left out")
        else:
            kinds.append("pgqueuer")
    figures: dict[str, list[float]] = {kind: [] for kind in kinds}
    with cluster() as pg:
        for round_no in range(1, options.rounds + 1):
            order = kinds if round_no % 2 else kinds[::-1]
            for kind in order:
                with fresh_database(pg) as url:
                    figures[kind].append(measure(kind, url, options.producers, options.calls))
            print(f"round {round_no}: " + " | ".join(
                f"{kind} {figures[kind][-1]:,.0f}" for kind in kinds), flush=True)  # fmt: skip
    print(f"\n{options.producers} producer processes, one job per call, {options.calls:,} calls "
          f"each; medians of {options.rounds} rounds, calls/s (durable PostgreSQL)")  # fmt: skip
    base = statistics.median(figures["ferryq"])
    for kind in kinds:
        rate = statistics.median(figures[kind])
        print(f"  {kind:<22} {rate:>10,.0f}   {rate / base:.2f}x ferryq's")


if __name__ == "__main__":
    main()
