"""The PostgreSQL test harness itself: fresh databases, isolation, restarts."""

from __future__ import annotations

import asyncpg
import psycopg
import pytest

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
