from __future__ import annotations

import math
import random

import pytest

from ferryq import backoff
from ferryq.policy import retry_delay


def test_exponential_doubles_up_to_the_cap() -> None:
    policy = backoff.exponential(cap=10)
    assert [policy.delay(n) for n in range(1, 7)] == [1, 2, 4, 8, 10, 10]


def test_exponential_never_overflows() -> None:
    assert backoff.exponential(cap=300).delay(10_000) == 300


def test_fixed_and_intervals() -> None:
    assert [backoff.fixed(7).delay(n) for n in (1, 5)] == [7, 7]
    policy = backoff.intervals([1, 5, 30])
    assert [policy.delay(n) for n in range(1, 6)] == [1, 5, 30, 30, 30]


def test_jitter_stays_within_its_fraction() -> None:
    policy = backoff.fixed(100, jitter=0.1)
    rng = random.Random(7)
    delays = {policy.delay(1, rng) for _ in range(200)}
    assert all(90 <= d <= 110 for d in delays) and len(delays) > 100


@pytest.mark.parametrize(
    ("signed", "expected"),
    [(60, ("exponential", (1.0, 60.0))), (-15, ("fixed", (15.0,))), (0, ("fixed", (0.0,)))],
)
def test_signed_compact_form(signed: int, expected: tuple[str, tuple[float, ...]]) -> None:
    policy = backoff.from_signed(signed)
    assert (policy.kind, policy.seconds) == expected


def test_round_trip_through_storage() -> None:
    for policy in (backoff.exponential(cap=5, jitter=0.2), backoff.intervals([1, 2])):
        assert backoff.Backoff.from_dict(policy.to_dict()) == policy
    assert retry_delay(backoff.fixed(3).to_dict(), 1) == 3
    assert retry_delay({}, 3) == 4  # default: exponential


@pytest.mark.parametrize(
    "make",
    [
        lambda: backoff.fixed(-1),
        lambda: backoff.intervals([]),
        lambda: backoff.exponential(cap=10, base=0),
        lambda: backoff.fixed(1, jitter=2),
        lambda: backoff.fixed(1e13),
        lambda: backoff.from_signed(11 * 365 * 86400),
    ],
)
def test_invalid_policies_are_refused(make: object) -> None:
    with pytest.raises(ValueError, match="retry"):
        make()  # type: ignore[operator]


@pytest.mark.parametrize("seconds", [math.nan, math.inf, -math.inf])
def test_non_finite_seconds_are_refused_as_such(seconds: float) -> None:
    for make in (backoff.fixed, backoff.from_signed, lambda s: backoff.exponential(cap=s),
                 lambda s: backoff.intervals([1, s])):  # fmt: skip
        with pytest.raises(ValueError, match=r"^retry: backoff seconds must be finite numbers"):
            make(seconds)
