"""Lanes: which jobs of a lane may leave ``waiting``, decided the same on every backend.

A lane's jobs are *admitted* in id order, at most its limit at a time: an admitted
job is ``scheduled``, ``ready`` or ``running``; the others are ``waiting``. A job
leaves the admitted set only by reaching a terminal state (a retry keeps its place),
and then the next waiting job is admitted. Nothing is stored per lane: the admitted
set is the lane's non-waiting hot jobs, found through an index, so every decision
reads at most ``limit`` admitted jobs and ``limit`` waiting ones, however long the
lane or however many lanes there are.

Start order is id order, also when the limit is above one: a job admitted behind one
that has not started yet is given that job's order time (and due time, if it is
delayed) when they are later than its own, so a claim, which takes the smallest
``(order_time, id)`` first, cannot start it earlier. No job is admitted behind one held
by its dependencies (due at ``HELD``): the release gives the held job its own due time
back and nothing else, so the jobs behind it wait until it ends. That holds within a queue; a
claim from another queue could, so a job is admitted only while every admitted job
ahead of it that has not started is in its own queue.

The stores read a lane into a :class:`LaneView` (under a per-lane lock on
PostgreSQL; SQLite has one writer) and apply the :class:`Plan` that :func:`plan`
returns; :func:`hand_over` says which admitted job goes straight to the worker whose
finish freed the lane. Two copies of the rule remain, for speed (docs/design.md,
"Lanes"): SQLite's plain case of lanes of limit 1 and PostgreSQL's ``lane_settle``;
tests/conformance/test_lanes_model.py holds every path to one reference. This module
holds no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from ferryq.job import HELD, State

OnDead = Literal["continue", "halt"]
#: A lane as the stores name it: (namespace, lane).
LaneKey = tuple[str, str]
ON_DEAD: tuple[OnDead, ...] = ("continue", "halt")
DEFAULT_LIMIT = 1
MAX_LIMIT = 100_000
MAX_LANE_LENGTH = 255


#: The most starts a rate may allow per window: a lane's window keeps that many.
MAX_RATE = 10_000
#: The shortest and the longest window a rate may have, in seconds (a day).
MIN_PER = 0.001
MAX_PER = 86_400.0


@dataclass(frozen=True, slots=True)
class Rate:
    """At most ``n`` starts of a lane in any ``per`` seconds (a sliding window)."""

    n: int
    per: float

    def __str__(self) -> str:
        """As people read it, in the CLI and the dashboard: "5 per 1 s"."""
        return f"{self.n} per {self.per:g} s"


@dataclass(frozen=True, slots=True)
class LaneRule:
    """A limit, a failure policy and, if set, a rate, for one lane (``post:42``) or
    every lane under a prefix (``tenant:*``)."""

    pattern: str
    limit: int = DEFAULT_LIMIT
    on_dead: OnDead = "continue"
    rate: Rate | None = None

    @property
    def is_prefix(self) -> bool:
        return self.pattern.endswith("*")

    def matches(self, lane: str) -> bool:
        if self.is_prefix:
            return lane.startswith(self.pattern[:-1])
        return lane == self.pattern


DEFAULT_RULE = LaneRule("*")


def check_rule(pattern: str, limit: int, on_dead: str, rate: Rate | None = None) -> LaneRule:
    """A validated rule; ValueError naming what is wrong."""
    if not isinstance(pattern, str) or not 0 < len(pattern) <= MAX_LANE_LENGTH:
        raise ValueError(f"lane pattern must be 1 to {MAX_LANE_LENGTH} characters")
    if "\x00" in pattern:
        raise ValueError("lane pattern must not contain NUL characters")
    if "*" in pattern[:-1]:
        raise ValueError(f"lane pattern {pattern!r}: '*' may only end a pattern (tenant:*)")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"lane limit must be an integer from 1 to {MAX_LIMIT}, not {limit!r}")
    if on_dead not in ON_DEAD:
        raise ValueError(f"on_dead must be 'continue' or 'halt', not {on_dead!r}")
    return LaneRule(pattern, limit, on_dead, rate)


def check_rate(n: int, per: float) -> Rate:
    """A validated rate; ValueError naming what is wrong."""
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_RATE:
        raise ValueError(f"a rate's n must be an integer from 1 to {MAX_RATE}, not {n!r}")
    if (
        isinstance(per, bool)
        or not isinstance(per, int | float)
        or not MIN_PER <= per <= MAX_PER  # also refuses NaN
    ):
        raise ValueError(
            f"a rate's per must be from {MIN_PER:g} to {MAX_PER:g} seconds, not {per!r}"
        )
    return Rate(n, float(per))


def changed_rule(
    rules: Iterable[LaneRule], pattern: str, limit: int, on_dead: str | None
) -> LaneRule:
    """``pattern``'s rule with a new limit, validated. Without ``on_dead`` the rule keeps
    the policy it has, and it keeps its rate (docs/guarantees.md, "Lanes":
    a changed limit keeps the rule's other settings); a new rule continues and has no rate."""
    own = next((rule for rule in rules if rule.pattern == pattern), None)
    if on_dead is None:
        on_dead = "continue" if own is None else own.on_dead
    return check_rule(pattern, limit, on_dead, None if own is None else own.rate)


def rated_rule(rules: Iterable[LaneRule], pattern: str, rate: Rate | None) -> LaneRule:
    """``pattern``'s rule with a new rate (None: none), validated; it keeps its limit
    and policy. A new rule has the defaults: limit 1, continue."""
    own = next((rule for rule in rules if rule.pattern == pattern), None)
    if own is None:
        return check_rule(pattern, DEFAULT_LIMIT, "continue", rate)
    return check_rule(pattern, own.limit, own.on_dead, rate)


def rule_for(rules: Iterable[LaneRule], lane: str) -> LaneRule:
    """The lane's own rule, else the longest matching prefix, else the default (1)."""
    best: LaneRule | None = None
    for rule in rules:
        if not rule.matches(lane):
            continue
        if not rule.is_prefix:
            return rule
        if best is None or len(rule.pattern) > len(best.pattern):
            best = rule
    return best or DEFAULT_RULE


@dataclass(frozen=True, slots=True)
class Held:
    """An admitted job: scheduled, ready or running."""

    id: int
    state: State
    started: bool  # claimed at least once since it entered the lane (running is)
    run_at: float
    order_time: float
    queue: str = "default"


#: An admitted job that has started, its other fields unread: :func:`plan` reads of a
#: started job only that it is there (it is never stepped back, sets no floor, blocks
#: no queue), so a store that counted a lane's started jobs may list them as this.
STARTED = Held(0, State.RUNNING, True, 0.0, 0.0)


@dataclass(frozen=True, slots=True)
class Candidate:
    """A waiting job, as admission needs it."""

    id: int
    run_at: float
    order_time: float
    queue: str = "default"
    expires_at: float | None = None  # for the hand-over only: never to a job past its ttl


@dataclass(slots=True)
class LaneView:
    namespace: str
    lane: str
    rule: LaneRule
    halted_by: int | None
    held: list[Held]  # in id order
    waiting: list[Candidate]  # the first ``rule.limit`` waiting jobs, in id order


@dataclass(frozen=True, slots=True)
class Admit:
    id: int
    state: State  # ready, or scheduled while it (or the job ahead of it) is not due
    run_at: float
    order_time: float


@dataclass(slots=True)
class Plan:
    admit: list[Admit] = field(default_factory=list)
    demote: list[int] = field(default_factory=list)  # admitted, not started: back to waiting

    def __bool__(self) -> bool:
        return bool(self.admit or self.demote)


def plan(view: LaneView, now: float) -> Plan:
    """What to change so the lane holds exactly what its rule allows. The jobs to
    admit are the first of ``view.waiting``, in its order."""
    result = Plan()
    held = list(view.held)
    # A halted lane keeps only what already started; a lowered limit applies to jobs
    # not started yet. Either way, the last admitted unstarted jobs step back.
    keep = 0 if view.halted_by is not None else view.rule.limit
    for job in reversed(view.held):
        if len(held) <= keep:
            break
        if not job.started:
            held.remove(job)
            result.demote.append(job.id)
    if view.halted_by is not None:
        return result
    room = view.rule.limit - len(held)
    unstarted = [j for j in held if not j.started]
    floor_order = max((j.order_time for j in unstarted), default=None)
    floor_due = max((j.run_at for j in unstarted if j.state == State.SCHEDULED), default=None)
    queues = {j.queue for j in unstarted}
    for waiting in view.waiting[: max(room, 0)]:
        if queues - {waiting.queue}:
            break  # behind a job of another queue that has not started: see above
        if floor_due is not None and floor_due >= HELD:
            break  # behind a job held by its dependencies: see below
        queues.add(waiting.queue)
        order_time = waiting.order_time
        if floor_order is not None:
            order_time = max(order_time, floor_order)
        run_at = waiting.run_at
        if floor_due is not None and floor_due > now and floor_due > run_at:
            run_at = floor_due
        state = State.SCHEDULED if run_at > now else State.READY
        result.admit.append(Admit(waiting.id, state, run_at, order_time))
        floor_order = order_time
        if state == State.SCHEDULED:
            floor_due = run_at if floor_due is None else max(floor_due, run_at)
    return result


@dataclass(slots=True)
class Taker:
    """The worker whose finished attempts freed lanes, with room for ``budget`` more
    jobs: a freed lane's next job, due and in one of its queues, goes straight to it
    (admitted and claimed in one write) instead of through ``ready``."""

    namespace: str
    queues: Sequence[str]
    worker: str
    budget: int

    def takes(self, namespace: str, queue: str, expires_at: float | None, now: float) -> bool:
        return (
            self.budget > 0
            and namespace == self.namespace
            and queue in self.queues
            and (expires_at is None or expires_at > now)
        )


def hand_over(view: LaneView, planned: Plan, taker: Taker | None, now: float) -> int | None:
    """The admitted job that goes straight to ``taker`` (its budget spent), if any: the
    lane's first, when nothing admitted ahead of it is still to start (else it would
    start before that job, or beside it over the limit a claim would see), it is due,
    the taker may run it, and the lane has no rate."""
    if taker is None or not planned.admit or planned.admit[0].state != State.READY:
        return None
    if view.rule.rate is not None:
        return None  # its start goes through the rate's window (see gate)
    if any(not job.started for job in view.held):
        return None
    first = view.waiting[0]
    if not taker.takes(view.namespace, first.queue, first.expires_at, now):
        return None
    taker.budget -= 1
    return first.id


# -- rates -------------------------------------------------------------------------------
#
# A rate is a sliding window: at most ``n`` starts of a lane in any ``per`` seconds,
# every claim of a job counting (a retry's too), whoever claims it. Each lane with a
# rate keeps its last ``n`` start times (its window). A claim that picked ready jobs
# of such a lane decides, with the window locked, which of them start now (:func:`gate`):
# as many as the window has room for, in the lane's order; the others go back to
# ``scheduled``, due when the window will have room for them, so they neither start
# early nor stand in the way of other lanes' jobs in the meantime.


def next_start(starts: Sequence[float], rate: Rate, at_least: float) -> float:
    """The earliest time from ``at_least`` at which one more start keeps the window:
    fewer than ``n`` of ``starts`` in the ``per`` seconds up to it."""
    times = sorted(starts)
    if len(times) < rate.n:
        return at_least
    return max(at_least, times[-rate.n] + rate.per)


def in_window(starts: Iterable[float], rate: Rate, now: float) -> list[float]:
    """The starts that count against the window at ``now``, oldest first: those of the
    last ``per`` seconds, and any later (a claimer whose clock runs ahead)."""
    return sorted(s for s in starts if s > now - rate.per)


@dataclass(frozen=True, slots=True)
class Picked:
    """A ready job a claim picked, as :func:`gate` reads it."""

    id: int
    started: bool  # claimed before since it entered its lane: a retry keeps no order


@dataclass(frozen=True, slots=True)
class Unstarted:
    """An admitted job of the lane that has not started and that the claim did not pick."""

    id: int
    state: State
    run_at: float


@dataclass(slots=True)
class Gated:
    start: list[int] = field(default_factory=list)  # start now, in the claim's order
    defer: dict[int, float] = field(default_factory=dict)  # back to scheduled, due then
    leave: list[int] = field(default_factory=list)  # left ready, for a claim under way
    starts: list[float] = field(default_factory=list)  # the window after these starts
    deferred_until: float | None = None  # the last time a job was deferred to


def gate(
    rate: Rate,
    starts: Sequence[float],
    picked: Sequence[Picked],
    unstarted: Sequence[Unstarted],
    now: float,
) -> Gated:
    """Which of a lane's picked jobs start at ``now`` (``picked`` in claim order, the
    lane's window ``starts`` read under its lock): a job starts while the window has
    room, and while no job of the lane ahead of it is still to start. One ahead that is
    ready (another claim holds it) or due (a promotion under way makes it ready): the
    job is left ready, for after it. One ahead that is scheduled (deferred, or
    delayed): the job is deferred to at least its due time, so start order stays id
    order. A job deferred for the window is due when the window
    will have room for it, the jobs deferred before it counted as started then."""
    result = Gated()
    real = in_window(starts, rate, now)
    planned: list[float] = []
    for job in picked:
        floor = now
        if not job.started:
            ahead = [u for u in unstarted if u.id < job.id]
            if any(u.state == State.READY or u.run_at <= now or u.run_at >= HELD for u in ahead):
                # Ready, or due and being made ready by a promotion under way: for a
                # claim of its own first.
                result.leave.append(job.id)
                continue
            floor = max([now, *(u.run_at for u in ahead)])
        if floor <= now and next_start(real, rate, now) <= now and not planned:
            result.start.append(job.id)
            real.append(now)
            continue
        due = next_start(real + planned, rate, floor)
        if due <= now:  # the window has room, but a job deferred before it goes first
            due = max(planned)
        result.defer[job.id] = due
        planned.append(due)
    # The last n starts by time, whether in this claim's window or not: a claim whose
    # clock is behind this one's counts starts this one no longer would.
    result.starts = sorted([*starts, *(now for _ in result.start)])[-rate.n :]
    result.deferred_until = max(planned, default=None)
    return result
