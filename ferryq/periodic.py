"""Periodic tasks: schedules, and which ticks to enqueue. Pure rules, no I/O.

A schedule is a cron expression (``ferryq.cron``, UTC or a time zone's wall clock)
or a fixed interval in seconds, counted from the Unix epoch so that every process
computes the same ticks whenever it started. The leader enqueues one job per tick (see
``ferryq.worker.periodic``); ``due_ticks`` decides which ticks those are.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from datetime import UTC, datetime

from ferryq import cron as cron_module
from ferryq.cron import Cron

#: A tick the leader reaches within this many seconds is on time; an older one was
#: missed (no leader ran for a while) and runs only as a catch-up.
ON_TIME = 10.0
#: Most missed ticks that one periodic task may catch up at once.
MAX_CATCH_UP = 1000
#: How much longer than the tick's age a tick's unique key keeps deduplicating.
DEDUP_MARGIN = 3600.0
MAX_KEY_LENGTH = 255


@dataclass(frozen=True, slots=True)
class Schedule:
    """When a periodic task runs: ``cron`` or ``every`` seconds, not both."""

    cron: Cron | None = None
    every: float | None = None

    @classmethod
    def of(
        cls, cron: str | None = None, every: float | None = None, timezone: str | None = None
    ) -> Schedule:
        if cron is None and every is None:
            raise ValueError("a periodic task needs a schedule: cron= or every=")
        if cron is not None and every is not None:
            raise ValueError("a periodic task takes cron= or every=, not both")
        if cron is not None:
            return cls(cron=cron_module.parse(cron, timezone))
        if timezone is not None:
            raise ValueError("timezone= goes with cron=: an interval counts seconds")
        if (
            isinstance(every, bool)
            or not isinstance(every, int | float)
            or not math.isfinite(every)
            or every < 1
        ):
            raise ValueError(f"every must be a number of seconds, at least 1 (got {every!r})")
        return cls(every=float(every))

    @property
    def spec(self) -> str:
        """The schedule as stored and shown: ``cron */5 * * * *``, ``cron 0 9 * * *
        (Europe/Paris)`` or ``every 30 s``."""
        if self.cron is not None:
            if self.cron.timezone is not None:
                return f"cron {self.cron.expression} ({self.cron.timezone})"
            return f"cron {self.cron.expression}"
        return f"every {self.every:g} s"

    def next_after(self, t: float) -> float:
        if self.cron is not None:
            return self.cron.next_after(t)
        assert self.every is not None
        return (math.floor(t / self.every) + 1) * self.every

    def previous_before(self, t: float) -> float:
        if self.cron is not None:
            return self.cron.previous_before(t)
        assert self.every is not None
        return (math.ceil(t / self.every) - 1) * self.every


@dataclass(frozen=True, slots=True)
class Periodic:
    """A task registered with ``@app.periodic``."""

    task: str
    queue: str
    schedule: Schedule
    catch_up: int = 1

    def __post_init__(self) -> None:
        check_catch_up(self.catch_up)


def check_catch_up(catch_up: int) -> None:
    if (
        isinstance(catch_up, bool)
        or not isinstance(catch_up, int)
        or not 0 <= catch_up <= MAX_CATCH_UP
    ):
        raise ValueError(f"catch_up must be an integer from 0 to {MAX_CATCH_UP}")


def due_ticks(
    schedule: Schedule, after: float, now: float, catch_up: int, on_time: float = ON_TIME
) -> list[float]:
    """The ticks in ``(after, now]`` to enqueue, oldest first.

    Every tick at most ``on_time`` seconds old runs; of the older ones, which were
    missed, only the latest ``catch_up`` do, so a long downtime is not replayed in a
    storm. Walks back from ``now``, so the cost is what is returned, not the gap.
    """
    on_time_ticks: list[float] = []
    missed: list[float] = []
    tick = schedule.previous_before(math.nextafter(now, math.inf))
    while tick > after:
        if tick >= now - on_time:
            on_time_ticks.append(tick)
        elif len(missed) < catch_up:
            missed.append(tick)
        else:
            break
        tick = schedule.previous_before(tick)
    return sorted(missed + on_time_ticks)


def tick_key(task: str, tick: float) -> str:
    """The unique key of a tick's job: the same in every process, for every leader."""
    moment = datetime.fromtimestamp(tick, UTC).isoformat(timespec="milliseconds")
    key = f"periodic:{task}@{moment.replace('+00:00', 'Z')}"
    if len(key) > MAX_KEY_LENGTH:  # a long task name: its digest stands in for it
        digest = hashlib.sha256(task.encode()).hexdigest()[:32]
        key = f"periodic:{digest}@{moment.replace('+00:00', 'Z')}"
    return key


def dedup_window(tick: float, now: float) -> float:
    """A ``unique_for`` that reaches back past the tick: any earlier enqueue of the
    tick, by any leader, was created after it (give or take clock skew)."""
    return max(now - tick, 0.0) + DEDUP_MARGIN
