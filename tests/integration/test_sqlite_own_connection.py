"""Enqueue on the application's own sqlite3 connection to the App's file, inside its
transaction (``task.using(conn)``, ferryq/store/sqlite/external.py): the job and the
application's row commit or roll back together, and a store waiting in another
connection is woken at the application's commit, which ferryq does not see.

Where a wait must be ended by the wake-up and not by the waits' own look every second,
that look is pushed out of reach (``SAFETY_POLL``).
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

import ferryq
from ferryq.store.sqlite import wake
from ferryq.store.sqlite.store import SQLiteStore
from tests.conformance.jobs import NS
from tests.conftest import START


@pytest.fixture
def app(tmp_path: Path) -> Iterator[ferryq.App]:
    app = ferryq.App(f"sqlite:///{tmp_path / 'shop.db'}")
    app.portal_call(app.store())  # the schema
    yield app
    app.close()


@pytest.fixture
def conn(tmp_path: Path, app: ferryq.App) -> Iterator[sqlite3.Connection]:
    """The application's connection to the same file, with a table of its own."""
    conn = sqlite3.connect(tmp_path / "shop.db")
    conn.execute("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, item TEXT)")
    conn.commit()
    yield conn
    conn.close()


def _ship(app: ferryq.App) -> ferryq.Task[[int], None]:
    @app.task(name="ship")
    def ship(order: int) -> None:
        return None

    return ship


def _order(conn: sqlite3.Connection) -> int:
    row = conn.execute("INSERT INTO orders (item) VALUES ('tea') RETURNING id").fetchone()
    return int(row[0])


def _jobs(app: ferryq.App) -> list[object]:
    return sorted(job.args for job in app.list_jobs(task="ship"))


def test_the_job_commits_with_the_applications_row(
    app: ferryq.App, conn: sqlite3.Connection
) -> None:
    ship = _ship(app)
    with conn:  # Python's default: the first write begins the transaction
        order = _order(conn)
        handle = ship.using(conn).enqueue(order)
        with pytest.raises(ferryq.JobNotFound):  # not committed: no other connection sees it
            app.get_job(handle.id)
    assert _jobs(app) == [[order]]


def test_an_exception_rolls_the_job_back_with_the_row(
    app: ferryq.App, conn: sqlite3.Connection
) -> None:
    ship = _ship(app)
    with pytest.raises(RuntimeError), conn:
        order = _order(conn)
        ship.using(conn).enqueue(order)
        raise RuntimeError("the payment failed")
    assert _jobs(app) == []
    assert conn.execute("SELECT count(*) FROM orders").fetchone() == (0,)


def test_a_savepoint_rolled_back_takes_its_job_and_keeps_the_outer_one(
    app: ferryq.App, conn: sqlite3.Connection
) -> None:
    ship = _ship(app)
    conn.isolation_level = None  # the application sends BEGIN itself
    conn.execute("BEGIN")
    ship.using(conn).enqueue(1)
    conn.execute("SAVEPOINT inner")
    ship.using(conn).enqueue(2)
    conn.execute("ROLLBACK TO inner")
    conn.execute("RELEASE inner")
    conn.execute("COMMIT")
    assert _jobs(app) == [[1]]


def test_a_lane_and_a_unique_key_in_the_applications_transaction(
    app: ferryq.App, conn: sqlite3.Connection
) -> None:
    ship = _ship(app)
    with conn:
        first = ship.options(lane="customer:7", unique_key="order-1").using(conn).enqueue(1)
        again = ship.options(lane="customer:7", unique_key="order-1").using(conn).enqueue(1)
    assert again.id == first.id and not again.created
    assert app.get_job(first.id).lane == "customer:7"


async def test_a_waiting_store_is_woken_at_the_applications_commit(
    tmp_path: Path, app: ferryq.App, conn: sqlite3.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(wake, "SAFETY_POLL", 3600.0)  # woken by the ring, or never
    ship = _ship(app)
    waiting = SQLiteStore(str(tmp_path / "shop.db"))
    await waiting.open()
    try:
        await waiting.job_claim(NS, ["default"], 1, "w1", START)  # what it saw
        wait = asyncio.ensure_future(waiting.wait_for_change(60.0))
        conn.execute("INSERT INTO orders (item) VALUES ('tea')")
        await ship.using(conn).enqueue_async(1)
        conn.commit()
        assert await asyncio.wait_for(wait, 60.0) is True
    finally:
        await waiting.close()


@pytest.fixture
def other_file(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    conn = sqlite3.connect(tmp_path / "other.db")
    yield conn
    conn.close()


def test_bad_connections_are_refused_and_nothing_is_written(
    app: ferryq.App, conn: sqlite3.Connection, other_file: sqlite3.Connection
) -> None:
    ship = _ship(app)
    with pytest.raises(ferryq.ConfigurationError, match="not to the App's file"):
        ship.using(other_file).enqueue(1)
    assert other_file.execute("SELECT count(*) FROM sqlite_master").fetchone() == (0,)
    memory = sqlite3.connect(":memory:")
    with pytest.raises(ferryq.ConfigurationError, match="a database in memory"):
        ship.using(memory).enqueue(1)
    memory.close()
    conn.isolation_level = None  # autocommit, and no BEGIN sent
    with pytest.raises(ferryq.ConfigurationError, match="autocommit mode"):
        ship.using(conn).enqueue(1)
    closed = sqlite3.connect(":memory:")
    closed.close()
    with pytest.raises(ferryq.ConfigurationError, match="closed"):
        ship.using(closed).enqueue(1)
    with pytest.raises(ferryq.ConfigurationError, match="pass a sqlite3 connection"):
        ship.using(object()).enqueue(1)
    assert _jobs(app) == []


async def test_enqueue_async_on_the_connection_of_the_loops_thread(
    app: ferryq.App, conn: sqlite3.Connection
) -> None:
    ship = _ship(app)
    with conn:
        await ship.using(conn).enqueue_async(3)
    assert _jobs(app) == [[3]]


def test_a_file_without_the_schema_is_refused_naming_migrate(tmp_path: Path) -> None:
    app = ferryq.App(f"sqlite:///{tmp_path / 'new.db'}")
    ship = _ship(app)
    conn = sqlite3.connect(tmp_path / "new.db")
    try:
        with pytest.raises(ferryq.ConfigurationError, match="ferryq migrate"), conn:
            ship.using(conn).enqueue(1)
    finally:
        conn.close()
        app.close()
