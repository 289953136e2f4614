"""A worker's server connections stay within its budget (``?connections=N``,
docs/operations.md "Connections"), whatever its ``--concurrency``: a real worker process
with 50 slots, every one of them busy, then every job enqueueing another, counted from
the server's side (pg_stat_activity) and from PgBouncer's (SHOW CLIENTS)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

import ferryq
from tests.conftest import pooled_url
from tests.pgbouncer import Bouncer
from tests.processes import Processes, python, wait_until

TASKS = "tests.integration.budget_tasks:app"
SLOTS = 50
BUDGET = 3
WORKER_NAME = "ferryq-budget-test"
COMPLAINT = re.compile(r"\s(warning|error|critical)\s")


def _scalar(url: str, query: str) -> int:
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        row = conn.execute(query).fetchone()
    assert row is not None
    return int(row[0])


def _running(pg_url: str) -> int:
    return _scalar(pg_url, "SELECT count(*) FROM ferryq_jobs WHERE state = 'running'")


async def _enqueue_held(url: str, gate: Path) -> None:
    app = ferryq.App(url)
    try:
        await app.enqueue_many_async("hold", [[str(gate)]] * SLOTS)
    finally:
        await app.aclose()


def _run_held_jobs(
    worker_url: str, pg_url: str, count: Callable[[], int], processes: Processes, gate: Path
) -> list[int]:
    """A worker with SLOTS slots runs SLOTS held jobs; the connections ``count()`` finds
    while all of them run, then while each enqueues another and those run, until every
    job has succeeded (its steady state: its stop is not counted); then it stops, with
    exit code 0."""
    asyncio.run(_enqueue_held(worker_url, gate))
    worker = processes.start(
        python("ferryq", "worker", TASKS, "--concurrency", str(SLOTS)),
        env={"FERRYQ_URL": worker_url}, name="worker",
    )  # fmt: skip
    wait_until(lambda: _running(pg_url) == SLOTS, within=60, what="every slot busy")
    seen = [count() for _ in range(3)]
    gate.touch()
    while _succeeded(pg_url) < 2 * SLOTS:
        assert worker.popen.poll() is None, worker.describe()
        seen.append(count())
    seen.append(count())
    assert worker.stop() == 0, worker.describe()
    complaints = [line for line in worker.stderr().splitlines() if COMPLAINT.search(line)]
    assert not complaints, worker.describe()  # no connection refused, lost or waited for
    return seen


def _succeeded(pg_url: str) -> int:
    return _scalar(pg_url, "SELECT count(*) FROM ferryq_history WHERE state = 'succeeded'")


def test_a_worker_with_fifty_slots_holds_its_budget_of_server_connections(
    pg_url: str, processes: Processes, tmp_path: Path
) -> None:
    """Direct: one connection to listen and lead, one for enqueues, one for the rest.
    The worker's connections are told apart by their ``application_name`` (the test's
    own, closed, may linger a moment on the server)."""
    worker_url = f"{pg_url}?connections={BUDGET}&application_name={WORKER_NAME}"
    with psycopg.connect(pg_url, autocommit=True, connect_timeout=10) as sampler:

        def count() -> int:
            query = "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
            row = sampler.execute(query, (WORKER_NAME,)).fetchone()
            assert row is not None
            return int(row[0])

        seen = _run_held_jobs(worker_url, pg_url, count, processes, tmp_path / "gate")
    assert max(seen) <= BUDGET, seen  # (with connections=8, five were seen)


def test_through_a_transaction_pooler_the_budget_is_the_poolers_clients(
    pg_url: str, pgbouncer: Bouncer, processes: Processes, tmp_path: Path
) -> None:
    """Through PgBouncer without a direct URL: no listening connection (waits poll, the
    leadership is a lease row), so the whole budget is the pool's and the enqueues'."""
    database = pg_url.rsplit("/", 1)[1].split("?")[0]

    def count() -> int:
        return pgbouncer.clients(database)

    worker_url = f"{pooled_url(pgbouncer.through(pg_url))}&connections={BUDGET}"
    seen = _run_held_jobs(worker_url, pg_url, count, processes, tmp_path / "gate")
    assert max(seen) <= BUDGET, seen


@pytest.mark.parametrize("connections", ["2", "0", "three", "3,4"])
async def test_a_budget_too_small_or_not_a_number_is_refused_at_start(
    pg_url: str, connections: str
) -> None:
    app = ferryq.App(f"{pg_url}?connections={connections}")
    with pytest.raises(ferryq.StoreError, match="connections="):
        await app.store()
    await app.aclose()


def test_a_worker_whose_budget_the_server_refuses_exits_at_start_naming_connections(
    pg_url: str, processes: Processes
) -> None:
    """A role allowed two connections (a superuser has no limit), a worker whose budget
    asks for four: it opens those it claims with as it starts, and stops there with one
    line, nothing run."""
    role = f"ferryq_two_{urlsplit(pg_url).path.lstrip('/')}"
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN CONNECTION LIMIT 2 "
                      "IN ROLE pg_read_all_data, pg_write_all_data")  # fmt: skip
        admin.execute(f"GRANT CREATE ON SCHEMA public TO {role}")
        try:
            worker = processes.start(
                python("ferryq", "worker", TASKS, "--burst"),
                env={"FERRYQ_URL": f"{_as_role(pg_url, role)}?connections=4"}, name="worker",
            )  # fmt: skip
            code = worker.wait()
        finally:
            admin.execute(f"DROP OWNED BY {role}")
            admin.execute(f"DROP ROLE {role}")
    errors = [line for line in worker.stderr().splitlines() if line.startswith("Error:")]
    assert code != 0 and len(errors) == 1, worker.describe()
    assert "too many connections" in errors[0] and "connections=3 at the least" in errors[0]


def _as_role(url: str, role: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{role}@{parts.netloc.rpartition('@')[2]}"))
