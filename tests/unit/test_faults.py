"""Transient faults are logged once per episode (pure logic, a frozen clock)."""

from __future__ import annotations

import logging

import pytest

from ferryq.faults import QUIET, FaultLog, one_line
from tests.conftest import FrozenClock


def test_a_fault_that_comes_and_goes_is_one_episode(caplog: pytest.LogCaptureFixture) -> None:
    clock = FrozenClock()
    faults = FaultLog(logging.getLogger("ferryq.test"), clock)
    with caplog.at_level(logging.WARNING, "ferryq.test"):
        for _ in range(50):  # connections freed and taken again, for 10 s
            faults.failed("claiming jobs", ConnectionError("too many clients"))
            clock.advance(0.1)
            faults.succeeded("claiming jobs")
            clock.advance(0.1)
        assert [r.getMessage().split(":")[0] for r in caplog.records] == ["claiming jobs failed"]
        clock.advance(QUIET)  # working since the last success, without a failure
        faults.succeeded("claiming jobs")
    assert len(caplog.records) == 2
    assert (
        caplog.records[1].getMessage() == "claiming jobs works again after 9.9 s (50 failed tries)"
    )


def test_each_duty_has_its_own_episodes(caplog: pytest.LogCaptureFixture) -> None:
    clock = FrozenClock()
    faults = FaultLog(logging.getLogger("ferryq.test"), clock)
    with caplog.at_level(logging.WARNING, "ferryq.test"):
        assert faults.failed("heartbeat", OSError("down"))
        assert faults.failed("claiming jobs", OSError("down"))
        assert not faults.failed("heartbeat", OSError("down"))
    assert len(caplog.records) == 2


def test_one_line_is_bounded_and_whole() -> None:
    assert one_line(ValueError("a\nb")) == "ValueError: a b"
    assert one_line(ValueError()) == "ValueError"
    assert len(one_line(ValueError("x" * 1000))) == 300
