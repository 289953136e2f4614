"""The lane rule (ferryq.lanes), as pure logic."""

from __future__ import annotations

import pytest

from ferryq.job import State
from ferryq.lanes import (
    DEFAULT_RULE,
    Candidate,
    Held,
    LaneRule,
    LaneView,
    check_rule,
    plan,
    rule_for,
)

NOW = 1000.0


def view(
    rule: LaneRule, held: list[Held], waiting: list[Candidate], halted_by: int | None = None
) -> LaneView:
    return LaneView("ns", "L", rule, halted_by, held, waiting)


def test_the_lane_own_rule_beats_prefixes_and_the_longest_prefix_wins() -> None:
    rules = [LaneRule("t:*", 2), LaneRule("t:big:*", 5), LaneRule("t:big:1", 9)]
    assert rule_for(rules, "t:big:1").limit == 9
    assert rule_for(rules, "t:big:2").limit == 5
    assert rule_for(rules, "t:small").limit == 2
    assert rule_for(rules, "post:1") is DEFAULT_RULE
    assert rule_for([LaneRule("*", 4)], "anything").limit == 4


@pytest.mark.parametrize(
    ("pattern", "limit", "on_dead", "named"),
    [
        ("", 1, "continue", "pattern"),
        ("a*b", 1, "continue", "'*'"),
        ("x" * 256, 1, "continue", "pattern"),
        ("a", 0, "continue", "limit"),
        ("a", True, "continue", "limit"),
        ("a", 1.5, "continue", "limit"),
        ("a", 1, "stop", "on_dead"),
    ],
)
def test_invalid_rules_are_refused(pattern: str, limit: int, on_dead: str, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        check_rule(pattern, limit, on_dead)


def test_admits_up_to_the_limit_in_id_order() -> None:
    waiting = [Candidate(i, NOW, NOW) for i in (5, 6, 7)]
    result = plan(view(LaneRule("L", 2), [], waiting), NOW)
    assert [(a.id, a.state) for a in result.admit] == [(5, State.READY), (6, State.READY)]
    assert result.demote == []


def test_nothing_moves_while_the_lane_is_full() -> None:
    held = [Held(1, State.SCHEDULED, True, NOW + 9, NOW + 9)]  # a retry holds its place
    assert not plan(view(LaneRule("L", 1), held, [Candidate(2, NOW, NOW)]), NOW)


def test_a_later_job_never_gets_ahead_of_an_unstarted_one() -> None:
    head = Held(1, State.SCHEDULED, False, NOW + 30, NOW + 30)
    urgent = Candidate(2, NOW, NOW - 600)  # due now, with a head start
    (admit,) = plan(view(LaneRule("L", 3), [head], [urgent]), NOW).admit
    assert (admit.state, admit.run_at, admit.order_time) == (State.SCHEDULED, NOW + 30, NOW + 30)


def test_a_started_job_sets_no_floor() -> None:
    retrying = Held(1, State.SCHEDULED, True, NOW + 30, NOW + 30)
    (admit,) = plan(view(LaneRule("L", 2), [retrying], [Candidate(2, NOW, NOW)]), NOW).admit
    assert (admit.state, admit.run_at) == (State.READY, NOW)


def test_a_lowered_limit_steps_back_the_last_unstarted_jobs_only() -> None:
    held = [
        Held(1, State.RUNNING, True, NOW, NOW),
        Held(2, State.READY, False, NOW, NOW),
        Held(3, State.RUNNING, True, NOW, NOW),
        Held(4, State.READY, False, NOW, NOW),
    ]
    assert plan(view(LaneRule("L", 1), held, []), NOW).demote == [4, 2]


def test_a_halted_lane_admits_nothing_and_steps_back_what_did_not_start() -> None:
    held = [Held(2, State.RUNNING, True, NOW, NOW), Held(3, State.READY, False, NOW, NOW)]
    result = plan(view(LaneRule("L", 3), held, [Candidate(4, NOW, NOW)], halted_by=1), NOW)
    assert result.admit == [] and result.demote == [3]
