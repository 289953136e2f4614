"""The sessions that the flows written once (ferryq.store.flows) run on, on PostgreSQL."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from ferryq.lanes import LaneKey, LaneRule
from ferryq.store.postgres import lanes, partitions
from ferryq.store.postgres.queries import Q, Statement


class RunSession:
    """Statements through ``run``, over any driver: an asyncpg connection, or a
    psycopg one (an enqueue in the application's own transaction). Rows come as the
    driver gives them: by column name on asyncpg, as tuples on psycopg, where only
    ``flows.insert_unique`` and ``flows.insert_after`` run, and they read by position."""

    def __init__(self, run: lanes.Run) -> None:
        self.run = run

    async def rows(self, name: str, params: Mapping[str, Any]) -> list[Any]:
        return await self.run(Q[name], dict(params))

    async def value(self, name: str, params: Mapping[str, Any]) -> Any:
        rows = await self.run(Q[name], dict(params))
        return rows[0][0] if rows else None

    async def execute(self, name: str, params: Mapping[str, Any]) -> None:
        await self.run(Q[name], dict(params))

    async def lock_lanes(self, keys: Collection[LaneKey]) -> None:
        await lanes.lock(self.run, keys)

    async def settle_lanes(self, keys: Collection[LaneKey], now: float) -> None:
        await lanes.settle(self.run, keys, now)  # takes the locks again: no harm

    async def lane_rules(self, namespace: str) -> list[LaneRule]:
        return (await lanes.rules(self.run, [namespace])).get(namespace, [])


class ConnSession(RunSession):
    """On one of the store's asyncpg connections, in the transaction (or snapshot) the
    caller began. ``job_counts`` is the one statement whose text depends on the
    database: it reads the history partitions not folded yet beside the statement of
    that name (``partitions.counts``)."""

    def __init__(self, conn: Any) -> None:
        super().__init__(lambda statement, params: _fetch(conn, statement, params))
        self.conn = conn

    async def rows(self, name: str, params: Mapping[str, Any]) -> list[Any]:
        if name == "job_counts":
            return await partitions.counts(self.conn, params["namespace"])
        return await super().rows(name, params)

    async def script(self, sql: str) -> None:
        """One statement of a migration, as written (no parameters)."""
        await self.conn.execute(sql)


async def _fetch(conn: Any, statement: Statement, params: dict[str, Any]) -> list[Any]:
    return list(await conn.fetch(statement.sql, *statement.args(params)))
