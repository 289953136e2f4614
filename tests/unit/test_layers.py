"""The layers of ferryq, as docs/design.md draws them: the faces (the CLI, the HTTP
server, the dashboard) reach the jobs through the operations layer (``ferryq.ops``),
never through the store."""

from __future__ import annotations

import ast
from pathlib import Path

import ferryq
from ferryq.ops import views
from ferryq.worker.executor import LeaseExpired

PACKAGE = Path(ferryq.__file__).parent
FACES = [
    *sorted((PACKAGE / "server").rglob("*.py")),
    *sorted((PACKAGE / "dashboard").rglob("*.py")),
    *sorted((PACKAGE / "cli").rglob("*.py")),
]
BELOW_THE_FACES = ("ferryq.store", "sqlite3", "asyncpg", "psycopg")


def imported(file: Path) -> list[tuple[int, str]]:
    """Every module ``file`` imports, anywhere in it (functions and TYPE_CHECKING too)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(file.read_text(), str(file))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [(node.lineno, node.module)]
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def test_the_faces_reach_the_jobs_only_through_the_operations_layer() -> None:
    assert len(FACES) > 20
    crossing = [
        f"{file.relative_to(PACKAGE.parent)}:{line} imports {name}"
        for file in FACES
        for line, name in imported(file)
        if any(name == below or name.startswith(below + ".") for below in BELOW_THE_FACES)
    ]
    assert crossing == [], "\n".join(crossing)


def test_the_layer_check_sees_an_import_of_the_store(tmp_path: Path) -> None:
    face = tmp_path / "face.py"
    face.write_text("def f():\n    from ferryq.store.base import Store\n    import sqlite3\n")
    assert [name for _, name in imported(face)] == [
        "ferryq.store.base",
        "ferryq.store.base.Store",
        "sqlite3",
    ]


def test_the_read_models_name_the_lease_error_as_the_worker_does() -> None:
    assert LeaseExpired.__name__ == views.LEASE_EXPIRED
