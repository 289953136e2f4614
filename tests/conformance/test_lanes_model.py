"""Lanes against a plain reference model, by random sequences of operations (hypothesis).

Operations: enqueue (some delayed, some with a ttl), claim, succeed, fail (retry or
die), time passing (promotion, expiry, lease expiry), cancel, limit and policy
changes, and releasing a halted lane by respawn or purge; all through the Store, on
every backend, with a frozen clock.

The reference model knows only what the operations did: which jobs exist, in which
lane, which started since they entered their lane, which died in a lane with the halt
policy. From that alone it says which jobs a lane must hold: started jobs are a prefix
of the lane's unfinished jobs (start order is id order), and the lane holds exactly
the first ``max(min(limit, unfinished), started)`` of them, or only the started ones
while it is halted. Checked after every step, with: a first start never overtakes an
earlier unfinished job of its lane, nor puts more than the limit running (a job that
started before the limit was lowered keeps its place); nothing is lost; a halted lane
stays halted until released.

Every way a store decides a lane is driven, and tallied (``Paths``: the test fails if
one went unexercised): finishes one at a time and in batches, through a plain finish
or a finish that claims (the hand-over to the finishing worker), with the job's lane
given, left out or wrong (the store finds the lanes itself); retries, deaths under
either policy, cancels of running and of waiting jobs, expiry, rules set and cleared,
inserts into busy lanes. On SQLite that is each settle path (the plain one of lanes
of limit 1, a glance read by ``lanes.plan``, a lane read whole), on PostgreSQL
``lane_settle`` and the lanes it leaves to ``lanes.plan``. In the run on one queue,
every lane is also, after every step, where ``lanes.plan`` would leave it.

A second run spreads each lane's jobs over two queues, claimed one queue or both at a
time. There a lane admits a job of another queue than an unstarted one ahead of it
only once that one has started (a claim of its own queue could start it first), so
it may run below its limit until it next settles, and the model asks less: the lane
holds a prefix of its unfinished jobs, at least one of them (it never stalls), and
never more than its limit or its started jobs.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from ferryq import lanes
from ferryq.job import State
from ferryq.lanes import LaneRule, rule_for
from ferryq.store import Store
from ferryq.store.base import Claimed, Finish
from ferryq.store.postgres import lanes as pg_lanes
from ferryq.store.sqlite import lanes as sqlite_lanes
from ferryq.worker.maintenance import Maintenance
from tests.conformance.backends import backend_url as backend_url  # not pooled
from tests.conformance.jobs import NS, new_job
from tests.conformance.model_backend import ModelBackend
from tests.conftest import FULL_EXAMPLES, START
from tests.conftest import examples as examples_of

T = TypeVar("T")
LANES = ("a", "t:1", "t:2")
PATTERNS = ("a", "t:*", "t:1")
TABLES = ("ferryq_jobs", "ferryq_history", "ferryq_lane_rules", "ferryq_lane_halts")
TTR = 10.0
HELD = (State.SCHEDULED, State.READY, State.RUNNING)


@dataclass
class Known:
    id: int
    lane: str
    started: bool = False  # claimed at least once
    fence: int = 0
    state: State = State.WAITING


class Paths:
    """A tally of the ways the store decided lanes, by spies on its functions."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.seen: Counter[str] = Counter()
        self.monkeypatch = monkeypatch

    def spy(self, owner: object, name: str, tally: Callable[..., list[str]]) -> None:
        real = getattr(owner, name)

        def spied(*args: Any, **kwargs: Any) -> Any:
            found = real(*args, **kwargs)
            self.seen.update(tally(found, *args, **kwargs))
            return found

        async def spied_async(*args: Any, **kwargs: Any) -> Any:
            found = await real(*args, **kwargs)
            self.seen.update(tally(found, *args, **kwargs))
            return found

        is_async = asyncio.iscoroutinefunction(real)
        self.monkeypatch.setattr(owner, name, spied_async if is_async else spied)


SQLITE_PATHS = {
    "limit 1: handed over", "limit 1: admitted", "glance", "lane read whole",
    "planned: admitted", "planned: stepped back", "planned: handed over",
}  # fmt: skip
POSTGRES_PATHS = {"lane_settle", "lane_settle: handed over", "planned by lanes.plan"}


def watch_sqlite(paths: Paths) -> None:
    def single(taken: list[Claimed], _: Any, keys: set[Any], *__: Any) -> list[str]:
        # The lanes it did not hand over it admits from (those with room).
        return ["limit 1: handed over"] * bool(taken) + ["limit 1: admitted"] * (
            len(keys) > len(taken)
        )

    def views(found: list[lanes.LaneView], *_: Any) -> list[str]:
        glanced = all(job is lanes.STARTED for view in found for job in view.held)
        return ["glance" if glanced else "lane read whole"] if found else []

    def planned(found: lanes.Plan, *_: Any) -> list[str]:
        return ["planned: admitted"] * bool(found.admit) + ["planned: stepped back"] * bool(
            found.demote
        )

    def handed(found: int | None, *_: Any) -> list[str]:
        return ["planned: handed over"] if found is not None else []

    paths.spy(sqlite_lanes, "_next_of_single", single)
    paths.spy(sqlite_lanes, "_views", views)
    paths.spy(lanes, "plan", planned)
    paths.spy(lanes, "hand_over", handed)


def watch_postgres(paths: Paths) -> None:
    def settle(taken: list[Claimed], *_: Any, **__: Any) -> list[str]:
        return ["lane_settle"] + ["lane_settle: handed over"] * bool(taken)

    paths.spy(pg_lanes, "settle", settle)
    paths.spy(pg_lanes, "_settle_by_plan", lambda *_: ["planned by lanes.plan"])


class LaneMachine(RuleBasedStateMachine):
    backend: ModelBackend
    queues: tuple[str, ...] = ("default",)  # the queues jobs go to
    claims: tuple[tuple[str, ...], ...] = (("default",),)  # the queues a claim asks for

    def __init__(self) -> None:
        super().__init__()
        self.backend.clear()
        self.store: Store = self.backend.store
        self.now = START
        self.jobs: dict[int, Known] = {}
        self.lane_rules: dict[str, LaneRule] = {}
        self.halted: dict[str, int] = {}  # lane -> the dead job that halts it

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.backend.run(coro)

    # -- operations --------------------------------------------------------------

    @initialize()
    def start(self) -> None:
        self.set_rule("t:*", 2, "continue")  # half the lanes start with room for two

    @rule(
        data=st.data(),
        lane=st.sampled_from(LANES),
        n=st.integers(1, 3),
        delay=st.sampled_from([0.0, 5.0]),
        ttl=st.sampled_from([None, None, 4.0]),
    )
    def enqueue(
        self, data: st.DataObject, lane: str, n: int, delay: float, ttl: float | None
    ) -> None:
        expires = None if ttl is None else self.now + ttl
        queue = data.draw(st.sampled_from(self.queues))
        job = new_job(
            self.now, lane=lane, delay=delay, expires_at=expires, max_tries=2, ttr=TTR, queue=queue
        )
        for row in self.run(self.store.job_insert_many(job, ["[]"] * n)):
            self.jobs[row.id] = Known(row.id, lane)
        self.refresh()

    @rule(data=st.data(), limit=st.integers(1, 4))
    def claim(self, data: st.DataObject, limit: int) -> None:
        queues = list(data.draw(st.sampled_from(self.claims)))
        self.note_started(self.run(self.store.job_claim(NS, queues, limit, "w", self.now)))

    @precondition(lambda self: self.running())
    @rule(
        data=st.data(),
        told=st.sampled_from(["lane", "none", "wrong"]),
        claim=st.sampled_from([0, 0, 1, 3]),
    )
    def finish(self, data: st.DataObject, told: str, claim: int) -> None:
        """Finish some running jobs in one batch, telling the store each job's lane, no
        lane, or a wrong one; with ``claim``, through a finish that also claims (the
        lanes it frees hand their next jobs over)."""
        running = self.running()
        count = data.draw(st.integers(1, min(3, len(running))))
        outcome = st.sampled_from(["succeeded", "retry", "retry-later", "dead"])
        jobs = data.draw(st.permutations(running))[:count]
        self.end(data, [self.ending(job, data.draw(outcome)) for job in jobs], told, claim)

    @precondition(lambda self: self.freeing())
    @rule(
        data=st.data(),
        told=st.sampled_from(["lane", "none", "wrong"]),
        claim=st.integers(1, 3),
        outcome=st.sampled_from(["succeeded", "dead"]),
    )
    def finish_freeing(self, data: st.DataObject, told: str, claim: int, outcome: str) -> None:
        """The same, for a job whose lane has jobs waiting: the likeliest hand-over."""
        job = data.draw(st.sampled_from(self.freeing()))
        self.end(data, [self.ending(job, outcome)], told, claim)

    def end(self, data: st.DataObject, finishes: list[Finish], told: str, claim: int) -> None:
        for finish in finishes:
            lane = self.jobs[finish.id].lane
            finish.lane = {"lane": lane, "none": None, "wrong": "t:9"}[told]
        before = self.snapshot_dead()
        if claim:
            queues = list(data.draw(st.sampled_from(self.claims)))
            report, claimed = self.run(
                self.store.job_finish_and_claim(finishes, NS, queues, claim, "w", self.now)
            )
        else:
            report, claimed = self.run(self.store.job_finish_many(finishes)), []
        assert sorted(report.accepted) == sorted(f.id for f in finishes)
        self.note_started(claimed)
        self.note_deaths(before)

    def ending(self, job: Known, outcome: str) -> Finish:
        if outcome == "succeeded":
            return Finish("succeeded", job.id, job.fence, self.now, self.now)
        if outcome == "dead":
            return Finish("dead", job.id, job.fence, self.now, self.now, error={"m": "x"})
        due = self.now + (3.0 if outcome == "retry-later" else 0.0)
        return Finish("retry", job.id, job.fence, self.now, self.now, error={"m": "x"},
                      run_at=due, order_time=due)  # fmt: skip

    def note_started(self, claimed: list[Claimed]) -> None:
        """Jobs just claimed (or handed over): a first start never overtakes an earlier
        unfinished job of its lane, nor puts more than the limit running. (A job that
        started before the limit was lowered keeps its place, and runs again on a
        retry.)"""
        first_starts = set()
        for job in sorted(claimed, key=lambda j: j.id):
            known = self.jobs[job.id]
            if not known.started:
                overtaken = [
                    k.id for k in self.unfinished(known.lane) if k.id < job.id and not k.started
                ]
                assert not overtaken, f"job {job.id} started before {overtaken} in {known.lane}"
                first_starts.add(known.lane)
            known.started, known.fence = True, job.fence
        self.refresh()
        for lane in first_starts:
            running = sum(k.state == State.RUNNING for k in self.unfinished(lane))
            assert running <= self.limit(lane), f"{running} running in {lane}"

    @rule(seconds=st.sampled_from([1.0, 3.0, 11.0]))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds
        before = self.snapshot_dead()
        self.run(self.store.job_promote_due(self.now, 1000))
        self.run(self.store.job_expire(self.now, 1000))
        self.run(Maintenance(self.store, "leader").recover_leases(self.now))
        self.refresh()
        self.note_deaths(before)

    @precondition(lambda self: self.all_unfinished())
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        job = data.draw(st.sampled_from(self.all_unfinished()))
        self.run(self.store.job_cancel(job.id, self.now))
        self.refresh()

    @rule(
        pattern=st.sampled_from(PATTERNS),
        limit=st.integers(1, 3),
        on_dead=st.sampled_from(["continue", "halt"]),
    )
    def set_rule(self, pattern: str, limit: int, on_dead: str) -> None:
        rule = LaneRule(pattern, limit, on_dead)  # type: ignore[arg-type]
        self.lane_rules[pattern] = rule
        self.run(self.store.lane_rule_set(NS, rule, self.now))
        self.refresh()

    @rule(pattern=st.sampled_from(PATTERNS))
    def clear_rule(self, pattern: str) -> None:
        found = self.lane_rules.pop(pattern, None) is not None
        assert self.run(self.store.lane_rule_delete(NS, pattern, self.now)) == found
        self.refresh()

    @precondition(lambda self: self.halted)
    @rule(data=st.data(), respawn=st.booleans())
    def release(self, data: st.DataObject, respawn: bool) -> None:
        lane = data.draw(st.sampled_from(sorted(self.halted)))
        dead = self.halted.pop(lane)
        if respawn:
            # A re-run, not a first start: it keeps its place among started jobs.
            assert self.run(self.store.job_respawn([dead], self.now)) == [dead]
        else:
            assert self.run(self.store.job_purge([dead], self.now)) == 1
            del self.jobs[dead]
        self.refresh()

    # -- the reference model ------------------------------------------------------

    @invariant()
    def lanes_hold_what_the_model_says(self) -> None:
        for lane in LANES:
            unfinished = self.unfinished(lane)
            started = [k for k in unfinished if k.started]
            assert started == unfinished[: len(started)], f"starts out of order in {lane}"
            if lane in self.halted:
                expected = len(started)
            else:
                expected = max(min(self.limit(lane), len(unfinished)), len(started))
            held = [k.id for k in unfinished if k.state in HELD]
            if len(self.queues) > 1 and lane not in self.halted:  # see the docstring
                fewest = min(len(unfinished), max(1, len(started)))
                assert fewest <= len(held) <= expected, (lane, held, fewest, expected)
                expected = len(held)
            assert held == [k.id for k in unfinished[:expected]], (
                f"lane {lane}: holds {held}, expected the first {expected} of "
                f"{[(k.id, k.state.value, k.started) for k in unfinished]}"
            )
            view = self.run(self.store.lane_view(NS, lane))
            assert view.halted_by == self.halted.get(lane)
            if len(self.queues) == 1:  # where lanes.plan would leave it, too
                assert not lanes.plan(view, self.now), (lane, view, lanes.plan(view, self.now))

    # -- helpers -------------------------------------------------------------------

    def refresh(self) -> None:
        for known in self.jobs.values():
            job = self.run(self.store.job_get(known.id))
            assert job is not None, f"job {known.id} was lost"
            known.state = job.state

    def limit(self, lane: str) -> int:
        return rule_for(self.lane_rules.values(), lane).limit

    def unfinished(self, lane: str) -> list[Known]:
        return sorted(
            (k for k in self.jobs.values() if k.lane == lane and not k.state.terminal),
            key=lambda k: k.id,
        )

    def all_unfinished(self) -> list[Known]:
        return [k for k in self.jobs.values() if not k.state.terminal]

    def running(self) -> list[Known]:
        return [k for k in self.jobs.values() if k.state == State.RUNNING]

    def freeing(self) -> list[Known]:
        """Running jobs whose lanes have jobs waiting."""
        waiting = {k.lane for k in self.jobs.values() if k.state == State.WAITING}
        return [k for k in self.running() if k.lane in waiting]

    def snapshot_dead(self) -> set[int]:
        return {k.id for k in self.jobs.values() if k.state == State.DEAD}

    def note_deaths(self, before: set[int]) -> None:
        for job_id in sorted(self.snapshot_dead() - before):
            lane = self.jobs[job_id].lane
            if rule_for(self.lane_rules.values(), lane).on_dead == "halt":
                self.halted.setdefault(lane, job_id)


@pytest.fixture
def paths(backend_url: str, monkeypatch: pytest.MonkeyPatch) -> Paths:
    tally = Paths(monkeypatch)
    (watch_sqlite if backend_url.startswith("sqlite") else watch_postgres)(tally)
    return tally


@pytest.fixture
def backend(backend_url: str) -> Iterator[ModelBackend]:
    opened = ModelBackend(backend_url, TABLES)
    yield opened
    opened.close()


class QueuesLaneMachine(LaneMachine):
    queues = ("q1", "q2")
    claims = (("q1",), ("q2",), ("q1", "q2"))


# Examples (SQLite, PostgreSQL), the same every run (derandomized). LaneMachine's must
# drive every path checked below, which not every count does (100 on SQLite misses
# one), so its counts are chosen, not scaled: 200 and 30 (60 on PostgreSQL took 50 s
# with a core busy), and 40 in the quick tier (a profile of fewer examples than the
# default), each tried. The thorough profile runs 200 and 30 too.
LANE_EXAMPLES = (40, 12) if settings().max_examples < FULL_EXAMPLES else (200, 30)


@pytest.mark.parametrize(
    ("machine", "examples"),
    [(LaneMachine, LANE_EXAMPLES), (QueuesLaneMachine, (examples_of(100), examples_of(15)))],
)
def test_lanes_follow_the_reference_model(
    backend: ModelBackend, paths: Paths, machine: type[LaneMachine], examples: tuple[int, int]
) -> None:
    machine.backend = backend
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=examples[0] if backend.sqlite else examples[1],
            stateful_step_count=30,
            deadline=None,
            database=None,
            # The same examples every run: which settle paths they drive (checked
            # below) must not depend on the draw of the day.
            derandomize=True,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
    if machine is LaneMachine:  # every path of the backend was driven
        missed = (SQLITE_PATHS if backend.sqlite else POSTGRES_PATHS) - set(paths.seen)
        assert not missed, f"never driven: {sorted(missed)} (driven: {dict(paths.seen)})"
