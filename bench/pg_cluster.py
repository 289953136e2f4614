"""The PostgreSQL every benchmark runs on: durable, as users run it.

    with cluster() as pg:          # prints the settings it runs with
        with fresh_database(pg) as url: ...

With FERRYQ_BENCH_PG_URL (an admin URL on a server of yours) that server is used as
it is: its settings are read back and printed, with a loud warning if any of
``fsync``, ``synchronous_commit`` and ``full_page_writes`` is off, since figures
taken so are not what users get. Otherwise a throwaway cluster is started from the
machine's binaries by the tests' own code (tests/pg.py), whose settings trade
durability for speed (fsync, synchronous_commit and full_page_writes off). Before
any measurement this module turns all three back on with ``ALTER SYSTEM`` (written to
``postgresql.auto.conf``, which is read after the tests' settings and wins), raises
``max_connections`` for the concurrent measures, restarts the server and checks the
settings as read back.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import psycopg
from psycopg import sql

from tests.pg import ExternalCluster, LocalCluster, PgCluster, find_server_bindir, with_database

URL_ENV = "FERRYQ_BENCH_PG_URL"
#: What a durable server has: every commit flushed to disk, torn pages recoverable.
DURABLE = {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on"}
#: Enough for every pool and connection of the concurrent measures at once.
MAX_CONNECTIONS = 200
#: Printed at the start of every PostgreSQL benchmark, the durable ones first.
SHOWN = (*DURABLE, "wal_sync_method", "max_connections", "shared_buffers", "server_version")


@contextlib.contextmanager
def cluster() -> Iterator[PgCluster]:
    """The server to measure on, durable; its settings are printed first."""
    url = os.environ.get(URL_ENV, "").strip()
    if url:
        external = ExternalCluster(url)
        describe(external, f"the server at {URL_ENV}")
        yield external
        return
    bindir = find_server_bindir()
    if bindir is None:
        raise SystemExit(f"no PostgreSQL binaries: install postgresql or set {URL_ENV}")
    local = LocalCluster(bindir)
    try:
        local.create()
        make_durable(local)
        describe(local, "a throwaway cluster, made durable")
        yield local
    finally:
        local.destroy()


def make_durable(local: LocalCluster) -> None:
    """Turn the test cluster's speed settings back to durable ones and restart it."""
    wanted = {**DURABLE, "max_connections": str(MAX_CONNECTIONS)}
    with psycopg.connect(with_database(local.url, "postgres"), autocommit=True) as conn:
        for name, value in wanted.items():
            conn.execute(
                sql.SQL("ALTER SYSTEM SET {} = {}").format(sql.Identifier(name), sql.Literal(value))
            )
    local.restart()
    found = settings(local.url)
    wrong = {name: found[name] for name, value in wanted.items() if found[name] != value}
    if wrong:
        raise SystemExit(f"the throwaway cluster kept {wrong} after ALTER SYSTEM and a restart")


def settings(url: str) -> dict[str, str]:
    """The server's SHOWN settings, as it reports them."""
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        found: dict[str, str] = {}
        for name in SHOWN:
            row = conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(name))).fetchone()
            found[name] = str(row[0]) if row else "?"
        return found


def not_durable(found: dict[str, str]) -> list[str]:
    """The durable settings that are off, as ``name=value`` (synchronous_commit may also
    be ``local`` or ``remote_*``: durable here too)."""
    return [f"{name}={found.get(name)}" for name in DURABLE if found.get(name, "off") == "off"]


def describe(pg: PgCluster, what: str) -> dict[str, str]:
    """Print the server's settings, with a loud warning if it is not durable."""
    found = settings(pg.url)
    print(f"PostgreSQL ({what}): " + ", ".join(f"{k} {v}" for k, v in found.items()), flush=True)
    off = not_durable(found)
    if off:
        bar = "!" * 78
        print(f"{bar}\n!! WARNING: this server is NOT durable: {', '.join(off)}.\n"
              "!! Its figures are not what users with a durable server get; turn these on\n"
              f"!! (ALTER SYSTEM SET ... = on, then restart) to measure like for like.\n{bar}",
              flush=True)  # fmt: skip
    return found
