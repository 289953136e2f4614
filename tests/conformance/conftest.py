"""The conformance suite runs on a third backend beside SQLite and PostgreSQL: the
PostgreSQL store in transaction-pooler mode (tests/conftest.py, POOLED)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import BACKENDS, POOLED, url_of_backend


@pytest.fixture(params=[*BACKENDS, POOLED])
def backend_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return url_of_backend(request, tmp_path)
