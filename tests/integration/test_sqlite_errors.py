"""What SQLite says reaches callers as a ferryq error: a StoreError naming the file,
with SQLite's own error as its cause, which ``refuses`` still reads."""

from __future__ import annotations

import math
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ferryq.errors import StoreError
from ferryq.store import open_store
from ferryq.store.base import Finish, Store
from tests.conformance.jobs import claim_one, insert

NOW = 1_000_000.0


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    opened = open_store(f"sqlite:///{tmp_path}/ferryq.db")
    await opened.open()
    yield opened
    await opened.close()


async def test_a_refused_value_is_a_store_error_that_refuses_recognises(
    store: Store, tmp_path: Path
) -> None:
    await insert(store, NOW)
    job = await claim_one(store, NOW)
    error = {"type": "E", "message": "m", "at": math.nan}  # not JSON: SQLite refuses it
    with pytest.raises(StoreError) as raised:
        await store.job_finish_many([Finish("dead", job.id, job.fence, NOW, NOW, error=error)])
    assert str(raised.value).startswith(f"SQLite database {tmp_path}/ferryq.db: ")
    assert str(raised.value).endswith(" (writing)")
    assert isinstance(raised.value.__cause__, sqlite3.Error)
    assert store.refuses(raised.value)
    # The store writes on: the failed transaction was rolled back, not left open.
    await store.job_finish_many([Finish("succeeded", job.id, job.fence, NOW, NOW)])
    assert (await store.job_get(job.id)).state == "succeeded"  # type: ignore[union-attr]


async def test_a_file_that_is_not_a_database_is_named_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "ferryq.db").write_bytes(b"not a database, " * 100)
    store = open_store(f"sqlite:///{tmp_path}/ferryq.db")
    with pytest.raises(StoreError) as raised:
        await store.open()
    assert str(raised.value) == (
        f"SQLite database {tmp_path}/ferryq.db: file is not a database (opening)"
    )
