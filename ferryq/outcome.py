"""What a handler can say about its attempt besides returning a value."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class Retry(Exception):
    """Retry this attempt after ``after`` seconds (the backoff decides when None).

    The attempt still counts against ``max_tries``.
    """

    def __init__(self, after: float | None = None, reason: str = "retry requested") -> None:
        super().__init__(reason)
        if after is not None and (isinstance(after, bool) or after < 0):
            raise ValueError("after must be a non-negative number of seconds")
        self.after = after


class Fail(Exception):
    """Fail permanently: the job goes to the dead letters without further tries."""


@dataclass(frozen=True, slots=True)
class Next:
    """Finish this stage and queue the job again at ``stage`` with ``context`` saved."""

    stage: str
    context: Any = None
    delay: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.stage, str) or not self.stage:
            raise ValueError("stage must be a non-empty string")
        if self.delay < 0:
            raise ValueError("delay must not be negative")
