"""History counts against a plain model, by random sequences of operations (hypothesis).

job_counts reads folded history from stored counts (migration 0008). Operations:
finishing jobs (now, or late: with a clock a day behind, into a day that may be
folded already), respawning and purging finished jobs, folding, pruning whole days
and time passing; all through the Store, on every backend. After every step the
counts must equal what the model knows: each job's queue and state.
"""

from __future__ import annotations

import math
import sqlite3
from collections import Counter
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import psycopg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from ferryq.store import Store
from ferryq.store.base import Finish, FinishKind
from ferryq.store.postgres.store import PostgresStore
from tests.conformance.backends import backend_url as backend_url  # not pooled
from tests.conformance.jobs import NS, insert
from tests.conformance.model_backend import ModelBackend
from tests.conftest import START, examples, server_url

T = TypeVar("T")
DAY = 86400.0
QUEUES = ("a", "b")
TERMINAL: tuple[FinishKind, ...] = ("succeeded", "dead", "cancelled")


class Backend(ModelBackend):
    """The model backend, with partitions for the days the model visits (PostgreSQL)
    and the folding undone before each example."""

    def __init__(self, url: str) -> None:
        super().__init__(url, ("ferryq_jobs", "ferryq_history", "ferryq_history_counts"))
        if isinstance(self.store, PostgresStore):
            for day in range(0, 8, 4):  # partitions from the day before START to 7 after
                self.run(self.store.history_ensure_partitions(START + day * DAY))

    def clear(self) -> None:
        super().clear()
        if self.sqlite:
            with sqlite3.connect(self.url.removeprefix("sqlite:///")) as conn:
                conn.execute("UPDATE ferryq_history_folded SET hid = 0")
            return
        with psycopg.connect(server_url(self.url), autocommit=True) as conn:
            for (name,) in conn.execute(
                "SELECT c.relname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
                "WHERE t.tgname = 'ferryq_history_counted'"
            ).fetchall():
                conn.execute(f"DROP TRIGGER ferryq_history_counted ON {name}")


class CountsMachine(RuleBasedStateMachine):
    backend: Backend

    def __init__(self) -> None:
        super().__init__()
        self.backend.clear()
        self.store: Store = self.backend.store
        self.now = START
        self.jobs: dict[int, tuple[str, str, float | None]] = {}  # queue, state, finished_at

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.backend.run(coro)

    def finished(self, *states: str) -> list[int]:
        return sorted(i for i, (_, state, _) in self.jobs.items() if state in states)

    @rule(queue=st.sampled_from(QUEUES), kind=st.sampled_from(TERMINAL), late=st.booleans())
    def finish(self, queue: str, kind: FinishKind, late: bool) -> None:
        job_id = self.run(insert(self.store, self.now, queue=queue))
        self.jobs[job_id] = (queue, "ready", None)
        (job,) = self.run(self.store.job_claim(NS, [queue], 1, "w", self.now))
        at = self.now - DAY if late else self.now
        error = None if kind == "succeeded" else {"message": "x"}
        outcome = Finish(kind, job.id, job.fence, at, at, "null", error)
        assert self.run(self.store.job_finish_many([outcome])).accepted == [job.id]
        self.jobs[job.id] = (queue, kind, at)

    @precondition(lambda self: self.finished("dead", "cancelled"))
    @rule(data=st.data())
    def respawn(self, data: st.DataObject) -> None:
        job_id = data.draw(st.sampled_from(self.finished("dead", "cancelled")))
        assert self.run(self.store.job_respawn([job_id], self.now)) == [job_id]
        self.jobs[job_id] = (self.jobs[job_id][0], "ready", None)

    @precondition(lambda self: self.finished("dead"))
    @rule(data=st.data())
    def purge(self, data: st.DataObject) -> None:
        job_id = data.draw(st.sampled_from(self.finished("dead")))
        assert self.run(self.store.job_purge([job_id], self.now)) == 1
        del self.jobs[job_id]

    @rule()
    def fold(self) -> None:
        self.run(self.store.history_fold(self.now))

    @rule()
    def prune(self) -> None:
        """Whole days before yesterday: what both backends prune alike."""
        before = (math.floor(self.now / DAY) - 1) * DAY
        self.run(self.store.history_prune(before, 1000))
        for job_id, (_, state, at) in list(self.jobs.items()):
            if at is not None and at < before and state in TERMINAL:
                del self.jobs[job_id]

    @precondition(lambda self: self.now < START + 4 * DAY)
    @rule(hours=st.sampled_from([1, 12, 24]))
    def advance(self, hours: int) -> None:
        self.now += hours * 3600

    @invariant()
    def counts_are_exact(self) -> None:
        expected = Counter((NS, queue, state) for queue, state, _ in self.jobs.values())
        assert self.run(self.store.job_counts(NS)) == dict(expected)
        assert self.run(self.store.job_counts(None)) == dict(expected)


@pytest.fixture
def backend(backend_url: str) -> Iterator[Backend]:
    opened = Backend(backend_url)
    yield opened
    opened.close()


def test_history_counts_follow_the_model(backend: Backend) -> None:
    CountsMachine.backend = backend
    run_state_machine_as_test(
        CountsMachine,
        settings=settings(
            # 15 on PostgreSQL, each example's tables emptied and written there (30 took
            # 47 s with a core busy); the thorough profile runs 150.
            max_examples=examples(60 if backend.url.startswith("sqlite") else 15),
            stateful_step_count=40,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
