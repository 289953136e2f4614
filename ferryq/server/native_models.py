"""The shapes of the native API (``/v1``): request bodies and parameters, as strict as
the checks that follow them, and responses, exactly as the routes write them. FastAPI
turns them into the OpenAPI schema at ``/openapi.json``.

Requests are strict: no extra fields, no numbers as strings, numbers finite and bounded
(a date far past year 9999 could be stored but never shown). Strings that reach the
database may not hold NUL, which PostgreSQL cannot store in text, nor lone surrogates,
which no database can encode.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import Path, Query
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
)

from ferryq import lanes
from ferryq.job import State
from ferryq.policy import (
    MAX_AFTER,
    MAX_RUN_AT,
    MAX_SECONDS,
    MAX_TEXT,
    MAX_TRIES_LIMIT,
    NAME_RE,
    YEAR,
)

#: Job ids stay below 2**53 in practice; bounding them there lets every JSON client,
#: JavaScript's included, hold an id exactly.
MAX_ID = (1 << 53) - 1
MAX_BATCH = 1000
MAX_IDS = 1000
MAX_PAGE = 1000
MAX_WAIT_SECONDS = 60.0
DEFAULT_WAIT_SECONDS = 30.0
NO_NUL = r"^[^\x00]*$"


def _encodable(value: str) -> str:
    try:
        value.encode()
    except UnicodeEncodeError:
        raise ValueError("contains a lone surrogate, which cannot be stored") from None
    return value


def _whole(value: Any) -> Any:
    # JSON has one kind of number: 3.0 is an integer, as JSON Schema says, but 3.5 is not.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


Text = Annotated[
    str,
    StringConstraints(min_length=1, max_length=MAX_TEXT, pattern=NO_NUL),
    AfterValidator(_encodable),
]
QueueName = Annotated[str, StringConstraints(pattern=NAME_RE.pattern)]
JobId = Annotated[int, Field(ge=1, le=MAX_ID), BeforeValidator(_whole)]
Tries = Annotated[int, Field(ge=1, le=MAX_TRIES_LIMIT), BeforeValidator(_whole)]
Limit = Annotated[int, Field(ge=1, le=lanes.MAX_LIMIT), BeforeValidator(_whole)]
Args = list[Any] | dict[str, Any]
Seconds = Annotated[float, Field(ge=0.0, le=MAX_SECONDS, allow_inf_nan=False)]
PositiveSeconds = Annotated[float, Field(gt=0.0, le=MAX_SECONDS, allow_inf_nan=False)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class JobOptionsIn(_Strict):
    """The options of ``ferryq.policy.JobOptions``; absent or null means the default."""

    queue: QueueName | None = Field(None, description='Default "default".')
    lane: Text | None = Field(None, description="Jobs of a lane run in order, limit at a time.")
    priority: float | None = Field(
        None, ge=-YEAR, le=YEAR, allow_inf_nan=False,
        description="Head start in seconds (may be negative); default 0.",
    )  # fmt: skip
    delay: Seconds | None = None
    run_at: float | None = Field(
        None, ge=0.0, le=MAX_RUN_AT, allow_inf_nan=False,
        description="Unix seconds; not together with delay.",
    )  # fmt: skip
    ttl: PositiveSeconds | None = None
    ttr: PositiveSeconds | None = Field(None, description="Lease seconds; default 60.")
    timeout: PositiveSeconds | None = Field(
        None, description="Time limit of each attempt in seconds, apart from the lease; "
        "default none. An attempt past it fails as timed out and retries per policy.",
    )  # fmt: skip
    max_tries: Tries | None = Field(None, description="Default 3.")
    retry: float | None = Field(
        None, ge=-YEAR, le=YEAR, allow_inf_nan=False,
        description="Backoff, compact signed form: n > 0 exponential capped at n seconds, "
        "n < 0 fixed |n| seconds, 0 at once. Default exponential capped at 3600.",
    )  # fmt: skip
    unique_key: Text | None = None
    unique_for: PositiveSeconds | None = None
    stage: Text | None = None
    context: Any = None
    after: list[JobId] | None = Field(
        None, max_length=MAX_AFTER,
        description="Jobs (ids, of this namespace) that must end before this one is ready; "
        "until then it is scheduled. An unknown id is refused (400).",
    )  # fmt: skip
    after_failed: Literal["fail", "run"] | None = Field(
        None, description='When one of those ends without success: "fail" (the default) '
        'ends this job dead without running it, "run" runs it anyway.',
    )  # fmt: skip


class EnqueueIn(JobOptionsIn):
    task: Text
    args: Args = Field(
        default_factory=list, description="Positional (array) or keyword (object) arguments."
    )


class BatchIn(JobOptionsIn):
    task: Text
    args: list[Args] = Field(
        min_length=1, max_length=MAX_BATCH, description="One job per element, in this order."
    )


class LaneLimitIn(_Strict):
    pattern: Text = Field(description="A lane (post:42), or a prefix ending in * (tenant:*).")
    limit: Limit
    on_dead: Literal["continue", "halt"] | None = Field(
        default=None,
        description="Left out, an existing rule keeps its policy and a new one continues.",
    )


class LaneRateIn(_Strict):
    pattern: Text = Field(description="A lane (api:acme), or a prefix ending in * (api:*).")
    n: Annotated[int, Field(ge=1, le=lanes.MAX_RATE), BeforeValidator(_whole)] = Field(
        description="At most this many starts in each lane the rule names..."
    )
    per: Annotated[float, Field(ge=0.001, le=lanes.MAX_PER, allow_inf_nan=False)] = Field(
        default=1.0, description="...in any window of this many seconds (a sliding window)."
    )


class JobIdsIn(_Strict):
    ids: list[JobId] = Field(min_length=1, max_length=MAX_IDS)


# -- parameters ------------------------------------------------------------------------

JobIdPath = Annotated[int, Path(ge=1, le=MAX_ID, description="The job's id.")]
QueueQuery = Annotated[str | None, Query(pattern=NAME_RE.pattern)]
TextQuery = Annotated[str | None, Query(min_length=1, max_length=MAX_TEXT, pattern=NO_NUL)]
ArgsTextQuery = Annotated[
    str | None,
    Query(min_length=1, max_length=MAX_TEXT, pattern=NO_NUL,
          description="A substring of the job's arguments as JSON."),
]  # fmt: skip
AfterQuery = Annotated[
    int | None,
    Query(ge=1, le=MAX_ID, description="The `next` of the previous page."),
]
LimitQuery = Annotated[int, Query(ge=1, le=MAX_PAGE)]
WaitQuery = Annotated[
    float,
    Query(ge=0.0, le=MAX_WAIT_SECONDS, allow_inf_nan=False,
          description="Seconds to wait for the job to finish."),
]  # fmt: skip
TtlQuery = Annotated[PositiveSeconds | None, Query(description="A new ttl, from now.")]
PatternQuery = Annotated[
    str,
    Query(min_length=1, max_length=MAX_TEXT, pattern=NO_NUL,
          description="The pattern of the limit: a lane, or a prefix (tenant:*)."),
]  # fmt: skip


# -- responses ---------------------------------------------------------------------


class ErrorOut(BaseModel):
    error: str


class EnqueuedOut(BaseModel):
    id: int
    created: bool = Field(description="False: deduplicated, an existing job was returned.")


class BatchOut(BaseModel):
    jobs: list[EnqueuedOut]


class JobOut(BaseModel):
    """A job as ``Job.to_dict()`` gives it; times are Unix seconds."""

    id: int
    namespace: str
    queue: str
    task: str
    args: Any
    state: State
    lane: str | None
    priority: float
    run_at: float
    order_time: float
    expires_at: float | None
    ttr: float
    max_tries: int
    retry: dict[str, Any]
    unique_key: str | None
    stage: str | None
    context: Any
    attempts: int
    fence: int
    result: Any
    error: dict[str, Any] | None
    errors: list[dict[str, Any]]
    stages: list[dict[str, Any]]
    meta: dict[str, Any]
    created_at: float
    claimed_at: float | None
    started_at: float | None
    finished_at: float | None
    lease_until: float | None
    worker: str | None
    cancel_requested: bool
    timeout: float | None
    progress: dict[str, Any] | None = Field(
        description="What the running attempt last reported: done, total, note, at."
    )


class JobPageOut(BaseModel):
    jobs: list[JobOut]
    next: int | None = Field(description="Pass as `after` for the next page; null at the end.")


class DependencyOut(BaseModel):
    id: int
    ended: State | None = Field(description="How that job ended; null while it runs.")


class DependenciesOut(BaseModel):
    after: list[DependencyOut] = Field(description="The jobs this one waits for, in order.")
    dependents: list[DependencyOut] = Field(
        description="The jobs that wait for this one (ended: how this one ended)."
    )


class ExplanationOut(BaseModel):
    job_id: int
    state: State
    reason: str = Field(
        description="done, cancelled, expired, dead, expiring, lane_halted, lane_waiting, "
        "lane_order, lane_limit, dependencies, rate_limited, cancelling, lease_expired, running, "
        "backoff, scheduled, no_worker or ready"
    )
    message: str
    data: dict[str, Any]


class ResultOut(BaseModel):
    id: int
    state: State
    result: Any = Field(description="The handler's return value; null until it succeeded.")


class JobFailedOut(BaseModel):
    error: str
    id: int
    state: State
    job_error: dict[str, Any] | None = Field(description="The stored error: type, message, …")


class RespawnedOut(BaseModel):
    respawned: list[int]


class PurgedOut(BaseModel):
    purged: int


class RateOut(BaseModel):
    n: int = Field(description="At most this many starts in each lane the rule names...")
    per: float = Field(description="...in any window of this many seconds.")


class LaneRuleOut(BaseModel):
    pattern: str
    limit: int
    on_dead: Literal["continue", "halt"]
    rate: RateOut | None = Field(description="None: starts are not rate limited.")


class LaneOut(BaseModel):
    lane: str
    waiting: int
    admitted: int = Field(description="Scheduled or ready.")
    running: int
    halted_by: int | None
    rule: LaneRuleOut


class LanesOut(BaseModel):
    lanes: list[LaneOut]


class LaneRulesOut(BaseModel):
    limits: list[LaneRuleOut]


class WorkerOut(BaseModel):
    id: str
    queues: list[str]
    host: str
    pid: int
    concurrency: int
    started_at: float
    heartbeat_at: float
    alive: bool = Field(description="Its last heartbeat is recent.")
    running: list[int]


class WorkersOut(BaseModel):
    workers: list[WorkerOut]


class PeriodicOut(BaseModel):
    task: str
    schedule: str = Field(description="A cron expression (UTC) or `every N s`.")
    queue: str
    catch_up: int = Field(description="Missed ticks run after downtime, the latest first.")
    last_tick: float | None = Field(description="The last tick enqueued (Unix seconds).")
    last_job: int | None = Field(description="The job of the last tick.")
    last_state: str | None = Field(description="That job's state.")
    next_tick: float | None
    updated_at: float


class StatsOut(BaseModel):
    queues: dict[str, dict[str, int]] = Field(description="queue → state → jobs")
    workers: list[WorkerOut] = Field(description="Live workers.")
    periodic: list[PeriodicOut] = Field(description="Periodic tasks and their last tick.")
