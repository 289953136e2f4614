"""The PostgreSQL test harness itself: fresh databases, isolation, restarts."""

from __future__ import annotations

import asyncpg
import psycopg
import pytest

from ferryq.store import open_store
from tests.pg import PgCluster, fresh_database


def _scalar(url: str, query: str) -> object:
    with psycopg.connect(url) as conn:
        row = conn.execute(query).fetchone()
    assert row is not None
    return row[0]


def test_pg_url_serves_psycopg(pg_url: str) -> None:
    assert _scalar(pg_url, "SELECT 1") == 1


async def test_pg_url_serves_asyncpg(pg_url: str) -> None:
    conn = await asyncpg.connect(pg_url)
    try:
        assert await conn.fetchval("SELECT 1") == 1
    finally:
        await conn.close()


def test_pg_url_databases_are_fresh_and_distinct(pg_cluster: PgCluster, pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE marker (id int)")
    with fresh_database(pg_cluster) as other_url:
        assert other_url != pg_url
        assert _scalar(other_url, "SELECT current_database()") != _scalar(
            pg_url, "SELECT current_database()"
        )
        assert _scalar(other_url, "SELECT to_regclass('marker') IS NULL") is True
        assert _scalar(pg_url, "SELECT to_regclass('marker') IS NULL") is False


def test_pg_url_is_migrated_and_pg_empty_url_is_empty(pg_url: str, pg_empty_url: str) -> None:
    assert _scalar(pg_url, "SELECT to_regclass('ferryq_jobs') IS NULL") is False
    assert _scalar(pg_empty_url, "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'") == 0


async def test_a_copy_of_the_template_is_as_migrated_as_a_database_ferryq_migrates(
    pg_url: str, pg_empty_url: str
) -> None:
    copied, migrated = open_store(pg_url), open_store(pg_empty_url)
    await copied.open()
    await migrated.open()
    try:
        assert await copied.migrate() == []
        assert await copied.schema_version() == await migrated.schema_version()
    finally:
        await copied.close()
        await migrated.close()
    assert _tables(pg_url) == _tables(pg_empty_url)


def _tables(url: str) -> list[tuple[str, str]]:
    """Tables and their columns, but the history's partitions by day: which days have one
    depends on the day a store was opened, and a template may be older than today."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = 'public' AND table_name NOT LIKE 'ferryq\\_history\\_p%' "
            "ORDER BY 1, 2"
        ).fetchall()
    return [(str(table), str(column)) for table, column in rows]


def test_restart_keeps_data_and_accepts_new_connections(pg_cluster: PgCluster, pg_url: str) -> None:
    if not pg_cluster.can_restart:
        pytest.skip("FERRYQ_TEST_PG_URL is a server the tests may not restart")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (id int)")
        conn.execute("INSERT INTO kept VALUES (7)")
        before = _scalar(pg_url, "SELECT pg_postmaster_start_time()")
        pg_cluster.restart()
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")  # the old session ended with the server
    assert _scalar(pg_url, "SELECT pg_postmaster_start_time()") != before
    assert _scalar(pg_url, "SELECT id FROM kept") == 7


def test_stop_then_start(pg_cluster: PgCluster, pg_url: str) -> None:
    if not pg_cluster.can_restart:
        pytest.skip("FERRYQ_TEST_PG_URL is a server the tests may not stop")
    pg_cluster.stop()
    try:
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(pg_url, connect_timeout=2).close()
    finally:
        pg_cluster.start()
    assert _scalar(pg_url, "SELECT 1") == 1
