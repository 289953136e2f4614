"""ferryq.clock.ServerClock: the host's clock plus the offset to the server's, measured
halfway through the round trip; a host off by more than a second is told once."""

from __future__ import annotations

import logging

import pytest

from ferryq.clock import WARN_AFTER, ServerClock
from tests.conftest import FrozenClock


async def test_the_offset_is_taken_halfway_through_the_round_trip() -> None:
    host = FrozenClock(1000.0)

    async def server_time() -> float:
        host.advance(0.2)  # the round trip: the server read its clock halfway
        return 970.1

    clock = ServerClock(host)
    await clock.measure(server_time)
    assert clock.offset == pytest.approx(-30.0)
    assert clock() == pytest.approx(host.now - 30.0)
    assert not clock.due()


async def test_a_database_on_this_host_leaves_the_clock_alone() -> None:
    host = FrozenClock(1000.0)

    async def on_this_host() -> None:
        return None

    clock = ServerClock(host)
    await clock.measure(on_this_host)
    assert clock.offset == 0.0 and clock() == host.now


async def test_a_host_off_is_told_once_until_it_is_right_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    host = FrozenClock(1000.0)
    readings = iter([1000.0 + 30, 1000.0 + 30, 1000.0 + WARN_AFTER / 2, 1000.0 - 30])

    async def server_time() -> float:
        return next(readings)

    clock = ServerClock(host)
    with caplog.at_level(logging.WARNING, logger="ferryq.clock"):
        for _ in range(4):
            await clock.measure(server_time)
    told = [r.getMessage() for r in caplog.records]
    assert len(told) == 2
    assert "30.0 s behind the database server's" in told[0]
    assert "30.0 s ahead of the database server's" in told[1]


async def test_a_server_reading_within_the_round_trip_is_no_offset() -> None:
    """As on a server on this very machine: the host's clock is kept exactly, so that
    its own readings (a handler's ``time.time()``) and the App's never disagree."""
    host = FrozenClock(1000.0)

    async def server_time() -> float:
        host.advance(0.2)
        return 1000.0 + 0.2 - 0.001  # read just before the answer came back

    clock = ServerClock(host)
    await clock.measure(server_time)
    assert clock.offset == 0.0 and clock() == host.now
