"""Rules of the code base that a test can keep true."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import ferryq
from ferryq.job import TERMINAL_STATES, TRANSITIONS, Event, State

PACKAGE = Path(ferryq.__file__).parent
DRIVERS = {"sqlite3", "psycopg", "psycopg_pool", "asyncpg"}


def test_public_names_are_sorted_and_exist() -> None:
    assert ferryq.__all__ == sorted(ferryq.__all__)
    for name in ferryq.__all__:
        assert hasattr(ferryq, name), name


def test_only_the_store_imports_a_database_driver() -> None:
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if "store" in path.relative_to(PACKAGE).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path}: {n}" for n in names if n.split(".")[0] in DRIVERS]
    assert offenders == []


def test_states_compare_equal_to_their_names() -> None:
    assert str(State.SUCCEEDED) == "succeeded" and State("succeeded") is State.SUCCEEDED
    assert State.SUCCEEDED == "succeeded"  # type: ignore[comparison-overlap]
    assert {s.value for s in State} == {
        "scheduled", "waiting", "ready", "running", "succeeded", "dead", "cancelled", "expired",
    }  # fmt: skip


def test_terminal_states_have_no_way_out_but_respawn() -> None:
    for (source, event), _target in TRANSITIONS.items():
        if source in TERMINAL_STATES:
            assert event in (Event.RESPAWN, Event.RESPAWN_IN_LANE)


def test_every_event_moves_a_job_somewhere() -> None:
    """An event the table does not use would be a way out of the drawing."""
    assert {event for _, event in TRANSITIONS} == set(Event)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_migrations_are_numbered_without_gaps_and_alike(backend: str) -> None:
    numbers = _migration_numbers(backend)
    assert numbers == list(range(1, len(numbers) + 1))
    assert numbers == _migration_numbers("sqlite")  # the same numbers on every backend


def _migration_numbers(backend: str) -> list[int]:
    folder = PACKAGE / "store" / backend / "migrations"
    return sorted(int(p.name[:4]) for p in folder.glob("*.sql"))


def test_both_backends_name_the_same_statements() -> None:
    from ferryq.store.postgres.queries import Q as POSTGRES
    from ferryq.store.sqlite.queries import Q as SQLITE

    shared = {
        "job_claim_queue", "job_finish_batch_to_history", "job_requeue", "job_next_stage",
        "job_return", "job_cancel_if_requested", "job_lease_extend", "job_held",
        "job_promote_due", "job_expired_leases", "job_respawn", "job_purge", "job_counts",
        "job_get_hot", "job_get_history", "worker_beat", "worker_list",
    }  # fmt: skip
    assert shared <= set(SQLITE) and shared <= set(POSTGRES)


def test_the_drawing_of_the_state_machine_is_the_table() -> None:
    """docs/state-machine.md draws exactly the edges of TRANSITIONS, with their events."""
    text = (PACKAGE.parent / "docs" / "state-machine.md").read_text()
    drawing = text.split("```mermaid", 1)[1].split("```", 1)[0]
    drawn = set()
    for line in drawing.splitlines():
        if "-->" in line:
            edge, _, event = line.partition(" : ")
            source, _, target = edge.strip().partition(" --> ")
            drawn.add((None if source == "[*]" else source, Event(event.strip()), target))
    assert drawn == {(s and s.value, e, t.value) for (s, e), t in TRANSITIONS.items()}
