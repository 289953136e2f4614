"""The store behind a model-based test (hypothesis state machines): one store and
event loop for the whole run, its tables emptied before each example."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

import psycopg

from ferryq.store import open_store
from tests.conftest import server_url

T = TypeVar("T")


class ModelBackend:
    def __init__(self, url: str, tables: Sequence[str]) -> None:
        self.url = url
        self.tables = tuple(tables)
        self.loop = asyncio.new_event_loop()
        self.store = open_store(url)
        self.run(self.store.open())

    @property
    def sqlite(self) -> bool:
        return self.url.startswith("sqlite")

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def clear(self) -> None:
        if self.sqlite:
            with sqlite3.connect(self.url.removeprefix("sqlite:///")) as conn:
                for table in self.tables:
                    conn.execute(f"DELETE FROM {table}")
        else:
            with psycopg.connect(server_url(self.url), autocommit=True) as conn:
                conn.execute(f"TRUNCATE {', '.join(self.tables)}")

    def close(self) -> None:
        self.run(self.store.close())
        self.loop.close()
