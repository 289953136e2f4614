"""Periodic schedules and the choice of ticks to enqueue: pure rules."""

from __future__ import annotations

import pytest

from ferryq import periodic
from ferryq.periodic import Periodic, Schedule, due_ticks

T0 = 1_800_000_000.0  # a whole minute


def test_a_schedule_is_cron_or_every_not_both() -> None:
    with pytest.raises(ValueError, match=r"^a periodic task needs a schedule: cron= or every=$"):
        Schedule.of()
    with pytest.raises(ValueError, match=r"^a periodic task takes cron= or every=, not both$"):
        Schedule.of(cron="* * * * *", every=5)
    for bad in (0, 0.5, -1, float("nan"), float("inf"), True, "5"):
        with pytest.raises(ValueError, match="every must be"):
            Schedule.of(every=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="5 fields"):
        Schedule.of(cron="* *")
    assert Schedule.of(cron="*/5 * * * *").spec == "cron */5 * * * *"
    paris = Schedule.of(cron="0 9 * * *", timezone="Europe/Paris")
    assert paris.spec == "cron 0 9 * * * (Europe/Paris)"
    with pytest.raises(ValueError, match="timezone= goes with cron="):
        Schedule.of(every=30, timezone="Europe/Paris")
    assert Schedule.of(every=30).spec == "every 30 s"
    assert Schedule.of(every=1.5).spec == "every 1.5 s"


def test_catch_up_is_a_small_count() -> None:
    every = Schedule.of(every=1)
    for bad in (-1, 1001, 1.5, True):
        with pytest.raises(ValueError, match="catch_up"):
            Periodic("t", "default", every, bad)  # type: ignore[arg-type]


def test_intervals_count_from_the_epoch() -> None:
    every = Schedule.of(every=30)
    assert every.next_after(T0) == T0 + 30 and every.next_after(T0 + 29.9) == T0 + 30
    assert every.previous_before(T0) == T0 - 30 and every.previous_before(T0 + 0.1) == T0


def test_ticks_due_in_normal_running_are_all_enqueued() -> None:
    every = Schedule.of(every=1)
    assert due_ticks(every, T0, T0 + 0.5, catch_up=1) == []
    assert due_ticks(every, T0, T0 + 1, catch_up=1) == [T0 + 1]  # the tick at now is due
    # A slow round sees several ticks, all on time: none is dropped.
    assert due_ticks(every, T0, T0 + 3.2, catch_up=0) == [T0 + 1, T0 + 2, T0 + 3]


def test_after_downtime_only_the_latest_missed_ticks_run() -> None:
    every = Schedule.of(every=60)
    down = T0 + 3600 + 30  # an hour later, between two ticks
    assert due_ticks(every, T0, down, catch_up=1) == [T0 + 3600]
    assert due_ticks(every, T0, down, catch_up=3) == [T0 + 3480, T0 + 3540, T0 + 3600]
    assert due_ticks(every, T0, down, catch_up=0) == []
    # At a tick: it is on time, and the catch-up is the one before.
    assert due_ticks(every, T0, T0 + 3600, catch_up=1) == [T0 + 3540, T0 + 3600]
    # A catch-up never reaches behind what was handled already.
    assert due_ticks(every, T0 + 3540, down, catch_up=5) == [T0 + 3600]


def test_ticks_within_the_on_time_window_are_not_missed() -> None:
    every = Schedule.of(every=1)
    ticks = due_ticks(every, T0, T0 + 3600, catch_up=1, on_time=5)
    assert ticks == [T0 + 3594, *(T0 + 3595 + i for i in range(6))]


def test_a_long_gap_costs_only_what_is_returned() -> None:
    every = Schedule.of(every=1)
    assert len(due_ticks(every, 0.0, T0, catch_up=2)) == 2 + 11  # not T0 iterations


def test_cron_ticks() -> None:
    hourly = Schedule.of(cron="0 * * * *")
    assert due_ticks(hourly, T0 - 1, T0 + 7200, catch_up=1) == [T0 + 3600, T0 + 7200]


def test_the_key_of_a_tick_is_the_same_everywhere() -> None:
    key = periodic.tick_key("reports.nightly", T0)
    assert key == "periodic:reports.nightly@2027-01-15T08:00:00.000Z"
    assert periodic.tick_key("reports.nightly", T0 + 0.25).endswith("08:00:00.250Z")
    long = periodic.tick_key("x" * 300, T0)
    assert len(long) <= 255 and long == periodic.tick_key("x" * 300, T0)
    assert long != periodic.tick_key("x" * 301, T0)


def test_the_dedup_window_reaches_back_past_the_tick() -> None:
    assert periodic.dedup_window(T0, T0 + 100) == 100 + periodic.DEDUP_MARGIN
    assert periodic.dedup_window(T0 + 5, T0) == periodic.DEDUP_MARGIN
