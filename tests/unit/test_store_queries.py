"""The two backends' statements, as the headers of their queries.sql describe them: the
flows written once (ferryq.store.flows) run only names that both backends have, with
the same parameters on both, but for the locks that SQLite need not take (left empty);
the other names are each backend's own."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from ferryq.job import HELD
from ferryq.policy import MAX_RUN_AT
from ferryq.store import flows, sql
from ferryq.store.postgres.queries import Q as POSTGRES
from ferryq.store.sqlite.queries import Q as SQLITE

PACKAGE = Path(flows.__file__).resolve().parents[1]

# A named parameter: a colon not part of a "::" cast, then a name.
PARAMETER = re.compile(r"(?<![:\w]):([a-z_][a-z0-9_]*)")


def run_by_the_flows() -> set[str]:
    """The statement names that ferryq/store/flows.py passes to a session."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(Path(flows.__file__).read_text())):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("rows", "value", "execute")
            and node.args
        ):
            first = node.args[0]
            assert isinstance(first, ast.Constant) and isinstance(first.value, str), ast.unparse(
                node
            )
            found.add(first.value)
    return found


def test_the_flows_declare_every_statement_they_run() -> None:
    assert run_by_the_flows() == set(flows.STATEMENTS)


@pytest.mark.parametrize("name", flows.STATEMENTS)
def test_a_statement_of_the_flows_is_on_both_backends_with_the_same_parameters(
    name: str,
) -> None:
    assert name in SQLITE, f"{name} is not in sqlite/queries.sql"
    assert name in POSTGRES, f"{name} is not in postgres/queries.sql"
    assert POSTGRES[name].sql
    if not SQLITE[name]:
        assert "lock" in name.split("_"), f"{name} is empty on SQLite but takes no lock"
        return
    assert set(PARAMETER.findall(SQLITE[name])) == set(POSTGRES[name].names)


def test_each_backend_has_names_of_its_own() -> None:
    # The header says so: a flow written once could not run them.
    assert set(SQLITE) - set(POSTGRES) and set(POSTGRES) - set(SQLITE)
    assert not (set(SQLITE) ^ set(POSTGRES)) & set(flows.STATEMENTS)


def test_the_dependency_triggers_know_the_held_run_at() -> None:
    """The triggers write HELD as a literal: it must be ferryq.job.HELD, and beyond any
    due time a job can be given."""
    for backend in ("sqlite", "postgres"):
        sql = PACKAGE / "store" / backend / "migrations" / "0011_dependencies.sql"
        assert "run_at = 1e15" in sql.read_text(), backend
    assert HELD == 1e15 > MAX_RUN_AT


def _own_statements(backend: str) -> dict[str, str]:
    return sql._statements_of(f"ferryq.store.{backend}", _FILL_NOTHING)


class _Unfilled(dict[str, str]):
    """Leaves every placeholder as written, so the files compare as they read."""

    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


_FILL_NOTHING = _Unfilled()


def test_a_statement_that_reads_the_same_on_both_backends_is_written_once() -> None:
    sqlite, postgres = _own_statements("sqlite"), _own_statements("postgres")
    twice = sorted(name for name in set(sqlite) & set(postgres) if sqlite[name] == postgres[name])
    assert twice == [], f"move these to ferryq/store/queries.sql: {twice}"
    shared = sql._statements_of(sql.SHARED_STATEMENTS, _FILL_NOTHING)
    assert shared and not (set(shared) & set(sqlite)) and not (set(shared) & set(postgres))
    assert set(shared) <= set(SQLITE) and set(shared) <= set(POSTGRES)


def test_every_claim_writes_the_one_rule_of_a_claim() -> None:
    """A claiming statement sets its row from ferryq.store.sql.claim_set, never by hand."""
    for backend in ("sqlite", "postgres"):
        for name, text in _own_statements(backend).items():
            by_hand = re.search(r"fence\s*=\s*(j\.)?fence\s*\+", text)
            assert by_hand is None, f"{backend}'s {name} writes a claim by hand"
