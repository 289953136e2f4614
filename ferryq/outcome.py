"""What a handler can say about its attempt besides returning a value."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ferryq import policy


class Retry(Exception):
    """Retry this attempt after ``after`` seconds (the backoff decides when None).

    The attempt still counts against ``max_tries``.
    """

    def __init__(self, after: float | None = None, reason: str = "retry requested") -> None:
        super().__init__(reason)
        policy.check_number("after", after, minimum=0.0, maximum=policy.MAX_SECONDS)
        self.after = after


class Fail(Exception):
    """Fail permanently: the job goes to the dead letters without further tries."""


class DependencyFailed(Fail):
    """A dependency of the job (``after``) ended without success, and the job fails
    with it (``after_failed="fail"``, the default): its handler never runs."""


@dataclass(frozen=True, slots=True)
class Next:
    """Finish this stage and queue the job again at ``stage`` with ``context`` saved."""

    stage: str
    context: Any = None
    delay: float = 0.0

    def __post_init__(self) -> None:
        policy.check_text("stage", self.stage)
        policy.check_number("delay", self.delay, minimum=0.0, maximum=policy.MAX_SECONDS)


class TimedOut(Exception):
    """An attempt ran past its ``timeout`` and was stopped: it fails, and retries per
    the task's policy. The worker makes it; a handler need not raise it."""
