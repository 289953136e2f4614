"""Enqueue in a SQLAlchemy session's transaction (``task.using(session)``,
ferryq/own_connection.py), on both backends and every driver the stores write on:
pysqlite and aiosqlite, psycopg 3 (sync and async) and asyncpg. A commit makes the
job, which then runs; a rollback takes it away with the session's rows; a session
that cannot be written on, or is on the wrong database, driver or mode, is refused
with one line naming the fix, before anything is written.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, exc, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import ferryq
from ferryq.testing import drain_async

ROOT = Path(__file__).resolve().parents[2]
SYNC_DRIVERS = {"sqlite": "sqlite", "postgres": "postgresql+psycopg"}
#: The backend, and an async driver of it: the tests with an AsyncEngine run once each.
ASYNC = pytest.mark.parametrize(
    ("backend", "async_driver"),
    [("sqlite", "sqlite+aiosqlite"), ("postgres", "postgresql+asyncpg"),
     ("postgres", "postgresql+psycopg")],
    indirect=["backend"],
)  # fmt: skip


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    item: Mapped[str] = mapped_column(unique=True)


def _url(ferryq_url: str, driver: str) -> str:
    return driver + ferryq_url[ferryq_url.index(":") :]


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The App's URL, its schema made, with the application's table beside it."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'shop.db'}"
    else:
        url = str(request.getfixturevalue("pg_url"))
    app = ferryq.App(url)
    app.portal_call(app.store())
    app.close()
    engine = create_engine(_url(url, SYNC_DRIVERS[request.param]))
    Base.metadata.create_all(engine)
    engine.dispose()
    return url


@pytest.fixture
async def app(backend: str) -> AsyncIterator[ferryq.App]:
    application = ferryq.App(backend)
    yield application
    await application.aclose()


def _kind(url: str) -> str:
    return "sqlite" if url.startswith("sqlite") else "postgres"


@pytest.fixture
def engine(backend: str) -> Iterator[Engine]:
    made = create_engine(_url(backend, SYNC_DRIVERS[_kind(backend)]))
    yield made
    made.dispose()


@pytest.fixture
async def async_engine(backend: str, async_driver: str) -> AsyncIterator[AsyncEngine]:
    made = create_async_engine(_url(backend, async_driver))
    yield made
    await made.dispose()


def _ship(app: ferryq.App) -> ferryq.Task[[str], Coroutine[Any, Any, str]]:
    @app.task(name="ship")
    async def ship(item: str) -> str:
        return f"shipped {item}"

    return ship


def _order(item: str) -> Any:
    return text("INSERT INTO orders (item) VALUES (:item)").bindparams(item=item)


async def _shipped(app: ferryq.App) -> list[str]:
    """What the committed jobs did, once run: each job's result."""
    await drain_async(app)
    jobs = await app.list_jobs_async(task="ship")
    return sorted(str(job.result) for job in jobs)


async def _rows(engine: AsyncEngine) -> list[str]:
    async with engine.connect() as conn:
        return sorted(str(row[0]) for row in await conn.execute(text("SELECT item FROM orders")))


async def test_a_session_commits_its_job_which_runs_and_a_rollback_takes_it(
    app: ferryq.App, engine: Engine
) -> None:
    ship = _ship(app)
    with Session(engine) as session, session.begin():
        session.execute(_order("tea"))
        ship.using(session).enqueue("tea")
    with Session(engine) as session:
        ship.using(session).enqueue("cake")  # the first statement: it begins the transaction
        session.execute(_order("cake"))
        session.rollback()
    with engine.connect() as conn:
        ship.using(conn).enqueue("jam")  # autobegun, as an execute would
        conn.execute(_order("jam"))
        conn.commit()
        ship.using(conn).enqueue("bread")
        conn.rollback()
    assert await _shipped(app) == ["shipped jam", "shipped tea"]


@ASYNC
async def test_an_async_session_commits_its_job_which_runs_and_a_rollback_takes_it(
    app: ferryq.App, async_engine: AsyncEngine
) -> None:
    ship = _ship(app)
    async with AsyncSession(async_engine) as session, session.begin():
        await session.execute(_order("tea"))
        await ship.using(session).enqueue_async("tea")
    async with AsyncSession(async_engine) as session:
        # The first statement: on asyncpg BEGIN goes out at the session's first statement.
        await ship.using(session).enqueue_async("cake")
        await session.execute(_order("cake"))
        await session.rollback()
    async with async_engine.connect() as conn:
        await ship.using(conn).enqueue_async("jam")
        await conn.execute(_order("jam"))
        await conn.commit()
        await ship.using(conn).enqueue_async("bread")
        await conn.rollback()
    assert await _rows(async_engine) == ["jam", "tea"]
    assert await _shipped(app) == ["shipped jam", "shipped tea"]


@ASYNC
async def test_a_failed_transaction_is_refused_until_rolled_back(
    app: ferryq.App, engine: Engine, async_engine: AsyncEngine
) -> None:
    ship = _ship(app)
    with Session(engine) as session, session.begin():
        session.execute(_order("tea"))
    with Session(engine) as session:
        with pytest.raises(exc.IntegrityError):
            session.execute(_order("tea"))  # the same item twice
        if _kind(str(engine.url)) == "postgres":  # the server failed the transaction
            with pytest.raises(ferryq.ConfigurationError, match=r"failed.*rollback\(\)"):
                ship.using(session).enqueue("tea")
        session.rollback()
        ship.using(session).enqueue("again")
        session.commit()
    async with AsyncSession(async_engine) as asession:
        await asession.execute(_order("cake"))
        with pytest.raises(exc.IntegrityError):
            async with asession.begin_nested():
                await asession.execute(_order("cake"))
        await ship.using(asession).enqueue_async("cake")  # a savepoint's failure is undone
        await asession.commit()
    assert await _shipped(app) == ["shipped again", "shipped cake"]


@ASYNC
async def test_a_session_whose_flush_failed_is_refused_naming_rollback(
    app: ferryq.App, async_engine: AsyncEngine
) -> None:
    ship = _ship(app)
    async with AsyncSession(async_engine) as session:
        session.add_all([Order(id=1, item="tea"), Order(id=1, item="cake")])
        with pytest.raises(exc.IntegrityError):
            await session.flush()
        with pytest.raises(ferryq.ConfigurationError, match=r"failed.*call rollback\(\)"):
            await ship.using(session).enqueue_async("tea")
        await session.rollback()
    assert await _shipped(app) == []


@ASYNC
async def test_closed_and_invalidated_connections_are_refused(
    app: ferryq.App, engine: Engine, async_engine: AsyncEngine
) -> None:
    ship = _ship(app)
    conn = engine.connect()
    conn.close()
    with pytest.raises(ferryq.ConfigurationError, match="connection is closed"):
        ship.using(conn).enqueue("tea")
    with pytest.raises(ferryq.ConfigurationError, match="connection is closed"):
        ship.using(Session(bind=conn)).enqueue("tea")
    with engine.connect() as conn:
        conn.begin()
        conn.invalidate()  # as after a lost connection
        with pytest.raises(ferryq.ConfigurationError, match=r"invalidated.*rollback\(\)"):
            ship.using(conn).enqueue("tea")
    aconn = await async_engine.connect()
    await aconn.close()
    with pytest.raises(ferryq.ConfigurationError, match="connection is closed"):
        await ship.using(aconn).enqueue_async("tea")
    async with async_engine.connect() as aconn:
        raw = await aconn.get_raw_connection()
        driver = raw.driver_connection
        assert driver is not None
        await driver.close()  # closed under SQLAlchemy's feet
        with pytest.raises(ferryq.ConfigurationError, match="closed"):
            await ship.using(aconn).enqueue_async("tea")
        await aconn.invalidate()
    assert await _shipped(app) == []


@ASYNC
async def test_an_autocommit_engine_is_refused(
    app: ferryq.App, engine: Engine, async_engine: AsyncEngine
) -> None:
    ship = _ship(app)
    autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
    refused = pytest.raises(ferryq.ConfigurationError, match=r"autocommit mode.*without AUTOCOMMIT")
    with Session(autocommit) as session, session.begin(), refused:
        ship.using(session).enqueue("tea")
    async_autocommit = async_engine.execution_options(isolation_level="AUTOCOMMIT")
    async with AsyncSession(async_autocommit) as asession, asession.begin():
        with pytest.raises(ferryq.ConfigurationError, match="autocommit mode"):
            await ship.using(asession).enqueue_async("tea")
    assert await _shipped(app) == []


async def test_another_database_is_refused(
    app: ferryq.App, backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    ship = _ship(app)
    if _kind(backend) == "sqlite":
        other, refusal = f"sqlite:///{tmp_path / 'other.db'}", "not to the App's file"
    else:
        other = str(request.getfixturevalue("pg_empty_url"))
        other, refusal = _url(other, "postgresql+psycopg"), "another server or database"
    engine = create_engine(other)
    try:
        with Session(engine) as session:
            with pytest.raises(ferryq.ConfigurationError, match=refusal):
                ship.using(session).enqueue("tea")
            session.commit()
        with engine.connect() as conn:
            tables = "SELECT count(*) FROM information_schema.tables WHERE table_name = 'jobs'"
            if _kind(backend) == "sqlite":
                tables = "SELECT count(*) FROM sqlite_master"
            assert conn.execute(text(tables)).scalar() == 0
    finally:
        engine.dispose()


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)  # SQLite's two are taken
async def test_a_driver_the_stores_do_not_write_on_is_refused(
    app: ferryq.App, backend: str
) -> None:
    ship = _ship(app)
    engine = create_engine(_url(backend, "postgresql+pg8000"))
    try:
        refused = pytest.raises(ferryq.ConfigurationError, match=r"on pg8000.*postgresql\+psycopg")
        with Session(engine) as session, refused:
            ship.using(session).enqueue("tea")
    finally:
        engine.dispose()
    assert await _shipped(app) == []


@ASYNC
async def test_an_async_session_needs_enqueue_async(
    app: ferryq.App, async_engine: AsyncEngine
) -> None:
    ship = _ship(app)
    async with AsyncSession(async_engine) as session:
        with pytest.raises(ferryq.ConfigurationError, match="needs enqueue_async"):
            ship.using(session).enqueue("tea")


def test_sqlalchemy_is_not_imported_for_a_drivers_connection(tmp_path: Path) -> None:
    program = f"""
import sqlite3, sys
import ferryq
app = ferryq.App("sqlite:///{tmp_path / "plain.db"}")
app.portal_call(app.store())
ship = app.task(name="ship")(lambda item: item)
conn = sqlite3.connect("{tmp_path / "plain.db"}")
with conn:
    ship.using(conn).enqueue("tea")
app.close()
print("sqlalchemy" in sys.modules)
"""
    done = subprocess.run(
        [sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
