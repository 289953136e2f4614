"""The backends of a conformance test that leaves out the pooled store
(tests/conformance/conftest.py): one that checks what the statements do, which behind
a pooler are the same statements reached another way. A module takes it by importing
``backend_url`` from here; the rest of the suite checks that way through the real
PgBouncer."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import BACKENDS, url_of_backend


@pytest.fixture(params=BACKENDS)
def backend_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """SQLite and PostgreSQL."""
    return url_of_backend(request, tmp_path)
