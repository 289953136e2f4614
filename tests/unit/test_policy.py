from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from ferryq.outcome import Next, Retry
from ferryq.policy import YEAR, JobOptions, due_time, expires_at, order_time


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("ttr", 0), ("ttr", -1), ("max_tries", 0), ("max_tries", 1.5), ("max_tries", True),
        ("priority", YEAR + 1), ("priority", -YEAR - 1), ("delay", -1), ("ttl", 0),
        ("delay", float("nan")), ("priority", "high"), ("queue", "bad queue!"),
        ("queue", ""), ("namespace", "x" * 256), ("unique_for", 0), ("max_tries", 70000),
        ("queue", "mail\n"), ("delay", 1e300), ("delay", float("inf")), ("ttl", 11 * YEAR),
        ("ttr", 1e300), ("unique_for", 1e300), ("run_at", 1e300), ("lane", "post\x00"),
        ("lane", ""), ("lane", "\ud800"), ("unique_key", "k\x00"), ("stage", "s\x00"),
    ],
)  # fmt: skip
def test_invalid_options_name_the_option(option: str, value: Any) -> None:
    with pytest.raises(ValueError, match=option):
        JobOptions().merged(
            **{option: value, **({"unique_key": "k"} if option == "unique_for" else {})}
        )


def test_valid_options_merge_over_defaults() -> None:
    base = JobOptions(queue="mail", ttr=60.0, max_tries=3)
    merged = base.merged(priority=600.0, delay=30.0, max_tries=None)
    assert (merged.queue, merged.ttr, merged.max_tries, merged.priority) == ("mail", 60, 3, 600)


def test_conflicting_options() -> None:
    with pytest.raises(ValueError, match="delay and run_at"):
        JobOptions().merged(delay=1.0, run_at=5.0)
    with pytest.raises(ValueError, match="unique_for needs a unique_key"):
        JobOptions().merged(unique_for=5.0)
    with pytest.raises(TypeError, match="unknown job option 'colour'"):
        JobOptions().merged(colour="red")


def test_order_time_is_due_minus_priority() -> None:
    assert order_time(1000.0, 600.0) == 400.0
    assert order_time(1000.0, -60.0) == 1060.0


def test_due_and_expiry() -> None:
    assert due_time(100.0, JobOptions(delay=5.0)) == 105.0
    assert due_time(100.0, JobOptions(run_at=500.0)) == 500.0
    assert due_time(100.0, JobOptions()) == 100.0
    assert expires_at(100.0, None) is None and expires_at(100.0, 50.0) == 150.0


@pytest.mark.parametrize(
    ("make", "option"),
    [
        (lambda: Next("a\x00"), "stage"), (lambda: Next(""), "stage"),
        (lambda: Next("a", delay=float("nan")), "delay"), (lambda: Next("a", delay=1e300), "delay"),
        (lambda: Retry(after=float("nan")), "after"), (lambda: Retry(after=-1), "after"),
        (lambda: Retry(after=1e300), "after"),
    ],
)  # fmt: skip
def test_invalid_outcomes_name_the_option(make: Callable[[], object], option: str) -> None:
    with pytest.raises(ValueError, match=option):
        make()
