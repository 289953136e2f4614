"""The session that the flows written once (ferryq.store.flows) run on, on SQLite."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Collection, Mapping
from typing import Any

from ferryq.lanes import LaneKey, LaneRule
from ferryq.store import flows
from ferryq.store.flows import drive
from ferryq.store.sqlite import lanes
from ferryq.store.sqlite.queries import MIGRATIONS, Q


class Session:
    """A flow's session on the store's connection, in the transaction the caller
    began. Every statement is a sync call, so a flow never suspends here: ``drive``
    runs it. No lock is taken: a write holds the database's write lock from its
    BEGIN IMMEDIATE."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    async def rows(self, name: str, params: Mapping[str, Any]) -> list[sqlite3.Row]:
        cursor = self.conn.cursor()
        cursor.row_factory = sqlite3.Row  # by column name, for this cursor only
        return cursor.execute(Q[name], params).fetchall()

    async def value(self, name: str, params: Mapping[str, Any]) -> Any:
        row = self.conn.execute(Q[name], params).fetchone()
        return None if row is None else row[0]

    async def execute(self, name: str, params: Mapping[str, Any]) -> None:
        self.conn.execute(Q[name], params)

    async def script(self, sql: str) -> None:
        self.conn.execute(sql)

    async def lock_lanes(self, keys: Collection[LaneKey]) -> None:
        pass  # the write lock is held

    async def settle_lanes(self, keys: Collection[LaneKey], now: float) -> None:
        lanes.settle(self.conn, set(keys), now)

    async def lane_rules(self, namespace: str) -> list[LaneRule]:
        return lanes.rules(self.conn, namespace)


def migrate(conn: sqlite3.Connection) -> list[int]:
    """Apply the migrations not applied yet, in the write transaction begun."""
    return drive(flows.migrate(Session(conn), MIGRATIONS, time.time()))


def schema_version(conn: sqlite3.Connection) -> int:
    return drive(flows.schema_version(Session(conn)))
