"""Pure rules: option validation, order time, expiry. No I/O here."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields
from typing import Any

from ferryq import backoff as backoff_mod
from ferryq._json import LONE_SURROGATE as _LONE_SURROGATE
from ferryq.backoff import Backoff
from ferryq.job import MAX_JOB_ID
from ferryq.lanes import MAX_LANE_LENGTH

YEAR = 365 * 24 * 3600.0
#: The longest delay, ttl, ttr or deduplication window: far enough for any schedule,
#: near enough that every time stays a date that clocks and calendars can show.
MAX_SECONDS = backoff_mod.MAX_SECONDS
MAX_RUN_AT = 253_402_300_799.0  # 9999-12-31 23:59:59 UTC
MAX_TRIES_LIMIT = 65535
MAX_TEXT = 255
NAME_RE = re.compile(r"^[-_A-Za-z0-9.:]{1,255}$")
#: The most dependencies one job may have (a fan-in of that many members).
MAX_AFTER = 100_000
#: What a job does when a dependency ends without success: fail at once, or run anyway.
AFTER_FAILED = ("fail", "run")
#: The meta key of a fan-in callback (ferryq.group): its worker passes the results of
#: its dependencies, in order, as its first argument.
AFTER_RESULTS = "ferryq.after_results"


@dataclass(frozen=True, slots=True)
class JobOptions:
    """Everything that can be set per task or per enqueue. ``None`` means unset."""

    queue: str | None = None
    namespace: str | None = None
    lane: str | None = None
    delay: float | None = None
    run_at: float | None = None
    priority: float | None = None
    ttl: float | None = None
    ttr: float | None = None
    timeout: float | None = None
    max_tries: int | None = None
    retry: Backoff | None = None
    unique_key: str | None = None
    unique_for: float | None = None
    stage: str | None = None
    context: Any = None
    meta: dict[str, Any] = field(default_factory=dict)
    #: Jobs (ids) that must end before this one is ready, and what to do when one of
    #: them does not succeed: "fail" (the default) or "run".
    after: tuple[int, ...] | None = None
    after_failed: str | None = None
    # Whether validate() passed once: options are frozen, so the checks that do not
    # depend on the time need not run again at every enqueue of a task's options.
    _valid: bool = field(default=False, init=False, repr=False, compare=False)

    def merged(self, **overrides: Any) -> JobOptions:
        """These options with every non-None override applied, validated."""
        values = {name: getattr(self, name) for name in OPTION_NAMES}
        for name, value in overrides.items():
            if name not in values:
                raise TypeError(f"unknown job option {name!r}")
            if value is not None:
                values[name] = dependency_ids(value) if name == "after" else value
        options = JobOptions(**values)
        options.validate()
        return options

    def validate(self, now: float | None = None) -> None:
        """ValueError naming the first bad option. With ``now`` (at enqueue) a
        ``run_at`` is checked against the ttl too."""
        if not self._valid:
            self._validate()
            object.__setattr__(self, "_valid", True)
        wait = None if now is None or self.run_at is None else self.run_at - now
        if expires_before_due(self.ttl, wait):
            raise ValueError(
                "ttl must last until run_at: the job would expire before it is due "
                f"(got ttl {self.ttl:g}, run_at {wait:.0f} seconds away)"
            )

    def _validate(self) -> None:
        _check_name("queue", self.queue)
        _check_name("namespace", self.namespace)
        check_text("lane", self.lane, MAX_LANE_LENGTH)
        check_text("unique_key", self.unique_key)
        check_text("stage", self.stage)
        check_number("delay", self.delay, minimum=0.0, maximum=MAX_SECONDS)
        check_number("run_at", self.run_at, minimum=0.0, maximum=MAX_RUN_AT)
        check_number("priority", self.priority, minimum=-YEAR, maximum=YEAR)
        check_number("ttl", self.ttl, minimum=0.0, exclusive=True, maximum=MAX_SECONDS)
        check_number("ttr", self.ttr, minimum=0.0, exclusive=True, maximum=MAX_SECONDS)
        check_number("timeout", self.timeout, minimum=0.0, exclusive=True, maximum=MAX_SECONDS)
        check_number(
            "unique_for", self.unique_for, minimum=0.0, exclusive=True, maximum=MAX_SECONDS
        )
        if self.max_tries is not None and (
            isinstance(self.max_tries, bool)
            or not isinstance(self.max_tries, int)
            or not 1 <= self.max_tries <= MAX_TRIES_LIMIT
        ):
            raise ValueError(f"max_tries must be an integer from 1 to {MAX_TRIES_LIMIT}")
        if self.retry is not None and not isinstance(self.retry, Backoff):
            raise ValueError("retry must be a ferryq.backoff policy")
        if self.delay is not None and self.run_at is not None:
            raise ValueError("delay and run_at cannot both be given")
        if self.unique_for is not None and self.unique_key is None:
            raise ValueError("unique_for needs a unique_key")
        if self.after is not None and (
            not isinstance(self.after, tuple)
            or len(self.after) > MAX_AFTER
            or not all(_is_job_id(i) for i in self.after)
        ):
            raise ValueError(f"after must list at most {MAX_AFTER} jobs, by handle or id")
        if self.after_failed is not None and self.after_failed not in AFTER_FAILED:
            raise ValueError(f"after_failed must be 'fail' or 'run' (got {self.after_failed!r})")
        if expires_before_due(self.ttl, self.delay):
            raise ValueError(
                "ttl must be at least delay: the job would expire before it is due "
                f"(got ttl {self.ttl:g}, delay {self.delay:g})"
            )


#: The names of the job options, as ``task.options()``, ``app.enqueue`` and the faces
#: that pass options on (the command line, the HTTP API) spell them.
OPTION_NAMES = tuple(option.name for option in fields(JobOptions) if option.init)


def dependency_ids(after: object) -> tuple[int, ...]:
    """The ids of ``after``'s jobs (handles or ids), each once, in the order given."""
    if isinstance(after, str | bytes) or not hasattr(after, "__iter__"):
        raise ValueError("after must be a list of job handles or ids")
    ids = (getattr(item, "id", item) for item in after)
    return tuple(dict.fromkeys(ids))


def _is_job_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_JOB_ID


def expires_before_due(ttl: float | None, wait: float | None) -> bool:
    """Whether a ttl ends before the job is due, so that it could only expire. A ttl
    equal to the wait passes, as lmstfy has it (it refuses only ttl < delay)."""
    return ttl is not None and wait is not None and ttl < wait


def check_text(option: str, value: str | None, max_length: int = MAX_TEXT) -> None:
    """A free-form key (a lane, a task name): any text a database can store, that is
    without NUL characters or halves of surrogate pairs."""
    if value is None:
        return
    if not (isinstance(value, str) and 0 < len(value) <= max_length):
        raise ValueError(f"{option} must be a non-empty string of at most {max_length} characters")
    if "\x00" in value or _LONE_SURROGATE.search(value):
        raise ValueError(f"{option} must not contain NUL characters or lone surrogates")


def _check_name(option: str, value: str | None) -> None:
    if value is not None and not (isinstance(value, str) and NAME_RE.fullmatch(value)):
        raise ValueError(
            f"{option} must be 1 to 255 characters of letters, digits and -_.: (got {value!r})"
        )


def check_number(
    option: str,
    value: float | None,
    *,
    minimum: float,
    maximum: float = math.inf,
    exclusive: bool = False,
) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise ValueError(f"{option} must be a number of seconds (got {value!r})")
    too_low = value <= minimum if exclusive else value < minimum
    if too_low or value > maximum or math.isinf(value):
        bound = "greater than" if exclusive else "at least"
        limit = f" and at most {maximum:.0f}" if maximum != math.inf else ""
        raise ValueError(f"{option} must be {bound} {minimum:g}{limit} seconds (got {value!r})")


def order_time(due: float, priority: float) -> float:
    """Among ready jobs the smallest order time is claimed first (docs/guarantees.md, "Order")."""
    return due - priority


def due_time(now: float, options: JobOptions) -> float:
    if options.run_at is not None:
        return options.run_at
    return now + (options.delay or 0.0)


def expires_at(now: float, ttl: float | None) -> float | None:
    return None if ttl is None else now + ttl


def retry_delay(policy: dict[str, Any], attempt: int) -> float:
    """Backoff after failed attempt ``attempt``, from a stored policy."""
    return (Backoff.from_dict(policy) if policy else backoff_mod.DEFAULT).delay(attempt)
