"""The job record, its states, and the transitions between them.

The transition table below says everything that may happen to a job's state, and
nothing else may: the conformance suite (tests/conformance/test_transitions.py) drives
every edge through each backend, and ``docs/state-machine.md`` draws it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

#: The largest job id: both backends store ids as signed 64-bit integers.
MAX_JOB_ID = (1 << 63) - 1
#: The run_at of a job waiting for its dependencies (``after``): past any due time a job
#: can be given (policy.MAX_RUN_AT), so nothing promotes it, and no other job has it.
#: When its last dependency ends, the job gets its own due time back
#: (``order_time + priority``).
HELD = 1e15


class State(enum.StrEnum):
    """Job states (contract). A state compares equal to its name."""

    SCHEDULED = "scheduled"
    WAITING = "waiting"
    READY = "ready"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    DEAD = "dead"
    CANCELLED = "cancelled"
    EXPIRED = "expired"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES = frozenset({State.SUCCEEDED, State.DEAD, State.CANCELLED, State.EXPIRED})
ACTIVE_STATES = frozenset(State) - TERMINAL_STATES


class Event(enum.StrEnum):
    """What moves a job from one state to another."""

    ENQUEUE_DUE = "enqueue (due now)"
    ENQUEUE_DELAYED = "enqueue (delayed)"
    DUE = "due time reached"
    CLAIM = "claimed by a worker"
    SUCCEED = "handler returned"
    NEXT_STAGE = "handler returned Next(stage, delay>0)"
    NEXT_STAGE_NOW = "handler returned Next(stage)"
    RETRY = "attempt failed, tries left"
    RETRY_NOW = "attempt failed, tries left, no backoff"
    DIE = "attempt failed, no tries left, or Fail"
    LEASE_EXPIRED = "lease expired, tries left"
    LEASE_EXPIRED_NOW = "lease expired, tries left, no backoff"
    LEASE_EXPIRED_DEAD = "lease expired, no tries left"
    SHUTDOWN_RETURN = "worker shut down before the attempt finished"
    CANCEL = "cancel"
    EXPIRE = "ttl passed before it ran"
    RESPAWN = "respawn / retry by an operator"
    ENQUEUE_IN_LANE = "enqueue into a lane that is full"
    ADMIT = "its lane has room (due)"
    ADMIT_DELAYED = "its lane has room (not due, or behind a job not due)"
    STEP_BACK = "not started, and its lane's limit lowered or the lane halted"
    RESPAWN_IN_LANE = "respawn into a lane that is full"
    ACK = "acknowledged over HTTP (lmstfy's delete)"
    ENQUEUE_HELD = "enqueue after jobs not ended yet"
    RELEASE = "its last dependency ended"
    RELEASE_FAILED = "a dependency ended without success"
    RATE_DEFER = "claimed, but its lane's rate window is full"


S, E = State, Event

#: (from, event) -> to. Anything absent is not allowed. A job enqueued into a lane with
#: room, or respawned into one, is admitted in the same transaction: it is seen going
#: straight to ready or scheduled, as without a lane.
TRANSITIONS: dict[tuple[State | None, Event], State] = {
    (None, E.ENQUEUE_DUE): S.READY,
    (None, E.ENQUEUE_DELAYED): S.SCHEDULED,
    (S.SCHEDULED, E.DUE): S.READY,
    (S.READY, E.CLAIM): S.RUNNING,
    (S.RUNNING, E.SUCCEED): S.SUCCEEDED,
    (S.RUNNING, E.NEXT_STAGE): S.SCHEDULED,
    (S.RUNNING, E.NEXT_STAGE_NOW): S.READY,
    (S.RUNNING, E.RETRY): S.SCHEDULED,
    (S.RUNNING, E.RETRY_NOW): S.READY,
    (S.RUNNING, E.DIE): S.DEAD,
    (S.RUNNING, E.LEASE_EXPIRED): S.SCHEDULED,
    (S.RUNNING, E.LEASE_EXPIRED_NOW): S.READY,
    (S.RUNNING, E.LEASE_EXPIRED_DEAD): S.DEAD,
    (S.RUNNING, E.SHUTDOWN_RETURN): S.READY,
    (S.RUNNING, E.CANCEL): S.CANCELLED,
    (S.SCHEDULED, E.CANCEL): S.CANCELLED,
    (S.READY, E.CANCEL): S.CANCELLED,
    (S.SCHEDULED, E.EXPIRE): S.EXPIRED,
    (S.READY, E.EXPIRE): S.EXPIRED,
    (S.DEAD, E.RESPAWN): S.READY,
    (S.CANCELLED, E.RESPAWN): S.READY,
    (S.EXPIRED, E.RESPAWN): S.READY,
    (None, E.ENQUEUE_IN_LANE): S.WAITING,
    (S.WAITING, E.ADMIT): S.READY,
    (S.WAITING, E.ADMIT_DELAYED): S.SCHEDULED,
    (S.READY, E.STEP_BACK): S.WAITING,
    (S.SCHEDULED, E.STEP_BACK): S.WAITING,
    (S.WAITING, E.CANCEL): S.CANCELLED,
    (S.WAITING, E.EXPIRE): S.EXPIRED,
    (S.DEAD, E.RESPAWN_IN_LANE): S.WAITING,
    (S.CANCELLED, E.RESPAWN_IN_LANE): S.WAITING,
    (S.EXPIRED, E.RESPAWN_IN_LANE): S.WAITING,
    # An HTTP consumer acks by id, with no fencing token, and lmstfy lets any job of
    # the queue be deleted: whatever is unfinished ends as done.
    (S.RUNNING, E.ACK): S.SUCCEEDED,
    (S.READY, E.ACK): S.SUCCEEDED,
    (S.SCHEDULED, E.ACK): S.SUCCEEDED,
    (S.WAITING, E.ACK): S.SUCCEEDED,
    # Dependencies: a job held for them is scheduled at HELD (in a lane: waiting, as
    # any job behind others) until its last one ends; then it is due at its own time.
    (None, E.ENQUEUE_HELD): S.SCHEDULED,
    (S.SCHEDULED, E.RELEASE): S.READY,
    (S.SCHEDULED, E.RELEASE_FAILED): S.READY,  # for its worker to end it dead, unrun
    # A rate per lane: a ready job the gate does not let start is due again when the
    # lane's window has room.
    (S.READY, E.RATE_DEFER): S.SCHEDULED,
}


@dataclass(slots=True)
class Job:
    """A job as stored, hot or historical. Times are Unix seconds (float)."""

    id: int
    namespace: str
    queue: str
    task: str
    args: Any
    state: State
    lane: str | None = None
    priority: float = 0.0
    run_at: float = 0.0
    order_time: float = 0.0
    expires_at: float | None = None
    ttr: float = 60.0
    max_tries: int = 3
    retry: dict[str, Any] = field(default_factory=dict)
    unique_key: str | None = None
    stage: str | None = None
    context: Any = None
    attempts: int = 0
    fence: int = 0
    result: Any = None
    error: dict[str, Any] | None = None
    errors: list[dict[str, Any]] = field(default_factory=list)
    stages: list[dict[str, Any]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    created_at: float = 0.0
    claimed_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    lease_until: float | None = None
    worker: str | None = None
    cancel_requested: bool = False
    timeout: float | None = None  # each attempt's time limit in seconds (None: none)
    #: What the running attempt last reported through ``ctx.progress``: ``done``,
    #: ``total``, ``note`` and ``at`` (None until it reports; a claim clears it).
    progress: dict[str, Any] | None = None

    @property
    def terminal(self) -> bool:
        return self.state.terminal

    @property
    def held_by_dependencies(self) -> bool:
        """Whether the job waits for dependencies that have not ended yet."""
        return not self.terminal and self.run_at == HELD

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view, as the CLI and the HTTP API show it."""
        return {name: getattr(self, name) for name in self.__slots__}
