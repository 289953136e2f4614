"""Retry backoff policies: how long a failed attempt waits before the next one.

``exponential(cap=300)`` waits 1, 2, 4, … seconds up to the cap; ``fixed(10)`` always
waits 10 seconds; ``intervals([1, 5, 30])`` waits 1, then 5, then 30 seconds for every
later try. Each takes an optional ``jitter`` (a fraction: 0.1 spreads each delay by up
to ±10 %). ``from_signed(n)`` reads the compact signed form used on the wire and the
command line: ``n > 0`` is exponential capped at ``n`` seconds, ``n < 0`` is fixed
``|n|`` seconds and ``0`` retries at once.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

#: The longest wait ferryq takes anywhere (a delay, a ttl, a backoff): ten years.
MAX_SECONDS = 10 * 365 * 24 * 3600.0

Kind = Literal["exponential", "fixed", "intervals"]


@dataclass(frozen=True, slots=True)
class Backoff:
    kind: Kind
    seconds: tuple[float, ...]
    jitter: float = 0.0

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        if attempt < 1:
            raise ValueError("attempt must be at least 1")
        if self.kind == "exponential":
            base, cap = self.seconds
            raw = min(cap, base * 2.0 ** min(attempt - 1, 62))
        elif self.kind == "fixed":
            raw = self.seconds[0]
        else:
            raw = self.seconds[min(attempt, len(self.seconds)) - 1]
        if self.jitter and raw:
            spread = (rng or random).uniform(-self.jitter, self.jitter)
            raw = max(0.0, raw * (1.0 + spread))
        return raw

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "seconds": list(self.seconds), "jitter": self.jitter}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Backoff:
        return _checked(data["kind"], tuple(data["seconds"]), float(data.get("jitter", 0.0)))


def exponential(cap: float = 3600.0, base: float = 1.0, jitter: float = 0.0) -> Backoff:
    """Wait ``base``, ``2·base``, ``4·base``, … seconds, never more than ``cap``."""
    return _checked("exponential", (float(base), float(cap)), jitter)


def fixed(seconds: float, jitter: float = 0.0) -> Backoff:
    """Wait the same number of seconds after every failed attempt."""
    return _checked("fixed", (float(seconds),), jitter)


def intervals(seconds: Sequence[float], jitter: float = 0.0) -> Backoff:
    """Wait ``seconds[0]`` after the first failure, and so on; the last one repeats."""
    return _checked("intervals", tuple(float(s) for s in seconds), jitter)


def from_signed(value: float) -> Backoff:
    """The compact signed form: ``n>0`` exponential capped at n, ``n<0`` fixed |n|."""
    if value > 0:
        return exponential(cap=value)
    return fixed(-value)


def _checked(kind: Kind, seconds: tuple[float, ...], jitter: float) -> Backoff:
    if kind not in ("exponential", "fixed", "intervals"):
        raise ValueError(f"retry: unknown backoff kind {kind!r}")
    if not seconds:
        raise ValueError("retry: intervals needs at least one interval")
    if not all(math.isfinite(s) for s in seconds):
        raise ValueError(f"retry: backoff seconds must be finite numbers (got {list(seconds)})")
    if any(s < 0 for s in seconds):
        raise ValueError("retry: backoff seconds must not be negative")
    if any(s > MAX_SECONDS for s in seconds):
        raise ValueError(f"retry: backoff seconds must be at most {MAX_SECONDS:.0f} (ten years)")
    if kind == "exponential" and seconds[0] <= 0:
        raise ValueError("retry: exponential base must be positive")
    if not 0.0 <= jitter <= 1.0:  # nan too
        raise ValueError("retry: jitter must be between 0 and 1")
    return Backoff(kind, seconds, float(jitter))


DEFAULT = exponential(cap=3600.0)
