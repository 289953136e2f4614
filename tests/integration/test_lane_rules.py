"""Lane rules through the Python API, on every backend."""

from __future__ import annotations

import pytest

import ferryq
from ferryq.lanes import LaneRule, Rate


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


async def test_a_rate_and_a_limit_each_keep_the_rules_other_settings(app: ferryq.App) -> None:
    await app.set_lane_limit_async("api:*", 4, on_dead="halt")
    rated = await app.set_lane_rate_async("api:*", 10, per=2)
    assert rated == LaneRule("api:*", 4, "halt", Rate(10, 2.0))
    assert await app.set_lane_limit_async("api:*", 6) == LaneRule("api:*", 6, "halt", Rate(10, 2.0))
    # A new rule made by a rate has the defaults; clearing the rate keeps the rest.
    assert await app.set_lane_rate_async("api:one", 1) == LaneRule("api:one", 1, "continue",
                                                                   Rate(1, 1.0))  # fmt: skip
    assert await app.clear_lane_rate_async("api:*") == LaneRule("api:*", 6, "halt")
    assert await app.clear_lane_rate_async("nothing:*") is None
    assert await app.lane_limits_async() == [
        LaneRule("api:*", 6, "halt"), LaneRule("api:one", 1, "continue", Rate(1, 1.0))
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("n", "per", "match"),
    [(0, 1.0, "rate's n"), (10_001, 1.0, "rate's n"), (True, 1.0, "rate's n"),
     (1, 0.0, "rate's per"), (1, float("nan"), "rate's per"), (1, 86_401.0, "rate's per"),
     (1, "1", "rate's per")],
)  # fmt: skip
async def test_a_bad_rate_changes_nothing(app: ferryq.App, n: int, per: float, match: str) -> None:
    await app.set_lane_rate_async("api:*", 5)
    with pytest.raises(ValueError, match=match):
        await app.set_lane_rate_async("api:*", n, per=per)
    with pytest.raises(ValueError, match="pattern"):
        await app.set_lane_rate_async("a*b", 5)
    assert await app.lane_limits_async() == [LaneRule("api:*", 1, "continue", Rate(5, 1.0))]
