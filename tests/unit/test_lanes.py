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
    Picked,
    Rate,
    Unstarted,
    check_rule,
    gate,
    next_start,
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


# -- rates -----------------------------------------------------------------------------


def test_the_gate_starts_what_the_window_has_room_for_and_defers_the_rest() -> None:
    rate = Rate(3, 1.0)
    picked = [Picked(i, started=False) for i in range(1, 6)]
    gated = gate(rate, [NOW - 0.5], picked, [], NOW)
    assert gated.start == [1, 2]
    # Each deferred job is due when the window will have room, those before it counted.
    assert gated.defer == {3: NOW + 0.5, 4: NOW + 1, 5: NOW + 1}
    assert gated.starts == [NOW - 0.5, NOW, NOW]
    assert gated.deferred_until == NOW + 1


def test_the_gate_keeps_lane_order_behind_an_unstarted_job_it_did_not_pick() -> None:
    rate = Rate(5, 1.0)
    ready_ahead = gate(rate, [], [Picked(2, False)], [Unstarted(1, State.READY, NOW)], NOW)
    assert (ready_ahead.start, ready_ahead.leave) == ([], [2])  # another claim holds job 1
    later = Unstarted(1, State.SCHEDULED, NOW + 7)
    deferred = gate(rate, [], [Picked(2, False)], [later], NOW)
    assert deferred.defer == {2: NOW + 7}  # never before the job ahead of it
    retry = gate(rate, [], [Picked(2, True)], [later], NOW)
    assert retry.start == [2]  # a retry keeps no order


def test_the_gate_counts_starts_by_claims_whose_clocks_run_ahead_or_behind() -> None:
    rate = Rate(5, 1.0)
    early = gate(rate, [], [Picked(i, False) for i in range(1, 4)], [], NOW)
    ahead = gate(rate, early.starts, [Picked(i, False) for i in (4, 5)], [], NOW + 1.05)
    assert ahead.start == [4, 5]
    # A claim whose clock is 0.1 s behind still counts the three starts at NOW.
    behind = gate(rate, ahead.starts, [Picked(6, False)], [], NOW + 0.95)
    assert behind.start == []
    assert next_start(ahead.starts, rate, NOW + 0.95) == NOW + 1  # the three leave it
