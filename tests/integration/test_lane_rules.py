"""Lane rules through the Python API, on every backend."""

from __future__ import annotations

import pytest

import ferryq
from ferryq.lanes import LaneRule


async def test_a_changed_limit_keeps_the_rules_policy(app: ferryq.App) -> None:
    await app.set_lane_limit_async("import:*", 1, on_dead="halt")
    kept = await app.set_lane_limit_async("import:*", 2)
    assert kept == LaneRule("import:*", 2, "halt")
    assert await app.lane_limits_async() == [kept]
    # A policy given is the new policy; a new rule without one continues.
    await app.set_lane_limit_async("import:*", 2, on_dead="continue")
    assert await app.set_lane_limit_async("import:*", 3) == LaneRule("import:*", 3, "continue")
    assert await app.set_lane_limit_async("import:1", 4) == LaneRule("import:1", 4, "continue")


async def test_a_bad_limit_keeps_the_rule_as_it_was(app: ferryq.App) -> None:
    await app.set_lane_limit_async("import:*", 1, on_dead="halt")
    with pytest.raises(ValueError, match="lane limit"):
        await app.set_lane_limit_async("import:*", 0)
    with pytest.raises(ValueError, match="on_dead"):
        await app.set_lane_limit_async("import:*", 2, on_dead="stop")
    assert await app.lane_limits_async() == [LaneRule("import:*", 1, "halt")]
