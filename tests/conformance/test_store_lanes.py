"""Lanes through the Store, on every backend: order, limits, holds, halts, rules."""

from __future__ import annotations

from typing import Any

from ferryq.job import State
from ferryq.lanes import LaneRule
from ferryq.store.base import Claimed, Finish, Store
from ferryq.worker.maintenance import Maintenance
from tests.conformance.jobs import NS, insert, new_job, succeed
from tests.conftest import START

NOW = START


async def states(store: Store, *ids: int) -> list[State]:
    found = []
    for job_id in ids:
        job = await store.job_get(job_id)
        assert job is not None
        found.append(job.state)
    return found


async def claim(store: Store, now: float = NOW, limit: int = 10) -> list[Claimed]:
    return await store.job_claim(NS, ["default"], limit, "w1", now)


async def lane_jobs(store: Store, n: int, lane: str = "L", **fields: Any) -> list[int]:
    return [await insert(store, NOW, lane=lane, **fields) for _ in range(n)]


async def test_a_lane_runs_one_job_at_a_time_in_enqueue_order(store: Store) -> None:
    a, b, c = await lane_jobs(store, 3)
    other = await insert(store, NOW, lane="M")
    assert await states(store, a, b, c, other) == ["ready", "waiting", "waiting", "ready"]
    assert [j.id for j in await claim(store)] == [a, other]
    assert await claim(store) == []  # b waits for a to end, not merely to start
    await store.job_finish_many([succeed((await claim_held(store, a)), NOW)])
    assert [j.id for j in await claim(store)] == [b]


async def claim_held(store: Store, job_id: int) -> Claimed:
    job = await store.job_get(job_id)
    assert job is not None and job.state == State.RUNNING
    return Claimed(job.id, job.namespace, job.queue, job.task, "[]", job.attempts,
                   job.max_tries, job.fence, job.ttr, "{}", job.priority, job.run_at,
                   job.order_time, job.lease_until or 0.0, job.stage, "null",
                   job.created_at, job.expires_at, job.lane)  # fmt: skip


async def test_enqueue_many_into_a_lane_admits_only_the_first(store: Store) -> None:
    rows = await store.job_insert_many(new_job(NOW, lane="L"), ["[1]", "[2]", "[3]"])
    ids = [r.id for r in rows]
    assert ids == sorted(ids)
    assert await states(store, *ids) == ["ready", "waiting", "waiting"]


async def test_a_retry_keeps_its_place_and_holds_the_lane(store: Store) -> None:
    a, b = await lane_jobs(store, 2)
    (job,) = await claim(store)
    retry = Finish("retry", a, job.fence, NOW, NOW, error={"message": "x"}, run_at=NOW + 5,
                   order_time=NOW + 5)  # fmt: skip
    assert (await store.job_finish_many([retry])).accepted == [a]
    assert await states(store, a, b) == ["scheduled", "waiting"]
    assert await store.job_promote_due(NOW + 5, 10) == 1
    (again,) = await claim(store, NOW + 5)
    assert again.id == a
    await store.job_finish_many([succeed(again, NOW + 6)])
    assert [j.id for j in await claim(store, NOW + 6)] == [b]


async def test_a_delayed_head_holds_the_lane_until_due_then_runs(store: Store) -> None:
    a = await insert(store, NOW, lane="L", delay=30.0)
    (b,) = await lane_jobs(store, 1)
    assert await states(store, a, b) == ["scheduled", "waiting"]
    assert await claim(store) == []
    await store.job_promote_due(NOW + 30, 10)
    assert [j.id for j in await claim(store, NOW + 30)] == [a]


async def test_a_limit_lets_n_run_still_starting_in_enqueue_order(store: Store) -> None:
    await store.lane_rule_set(NS, LaneRule("tenant:*", 3), NOW)
    ids = await lane_jobs(store, 5, lane="tenant:b")
    # A later job with a head start in priority still starts after the earlier ones.
    urgent = await insert(store, NOW, lane="tenant:b", priority=600.0)
    assert await states(store, *ids, urgent) == ["ready"] * 3 + ["waiting"] * 3
    assert [j.id for j in await claim(store, limit=2)] == ids[:2]
    assert [j.id for j in await claim(store, limit=10)] == ids[2:3]
    first = await claim_held(store, ids[0])
    await store.job_finish_many([succeed(first, NOW)])
    assert [j.id for j in await claim(store)] == [ids[3]]


async def test_a_job_behind_a_delayed_unstarted_job_is_not_due_before_it(store: Store) -> None:
    await store.lane_rule_set(NS, LaneRule("L", 2), NOW)
    a = await insert(store, NOW, lane="L", delay=30.0)
    (b,) = await lane_jobs(store, 1)
    job_b = await store.job_get(b)
    assert job_b is not None and job_b.state == State.SCHEDULED and job_b.run_at == NOW + 30
    await store.job_promote_due(NOW + 30, 10)
    assert [j.id for j in await claim(store, NOW + 30)] == [a, b]


async def test_cancel_and_expiry_of_the_head_free_the_lane(store: Store) -> None:
    a, b = await lane_jobs(store, 2)
    c = await insert(store, NOW, lane="L", expires_at=NOW + 10)
    await store.job_cancel(a, NOW)
    assert await states(store, b, c) == ["ready", "waiting"]
    (job_b,) = await claim(store)
    await store.job_finish_many([succeed(job_b, NOW)])
    assert await states(store, c) == ["ready"]
    d = await insert(store, NOW, lane="L")
    assert await store.job_expire(NOW + 10, 10) == [c]
    assert await states(store, d) == ["ready"]


async def test_cancelling_a_waiting_job_leaves_the_lane_as_it_is(store: Store) -> None:
    a, b, c = await lane_jobs(store, 3)
    await store.job_cancel(b, NOW)
    assert await states(store, a, b, c) == ["ready", "cancelled", "waiting"]


async def test_lease_recovery_keeps_the_lane_consistent(store: Store) -> None:
    a, b = await lane_jobs(store, 2, ttr=5.0, max_tries=2)
    await claim(store)
    maintenance = Maintenance(store, "leader")
    assert await maintenance.recover_leases(NOW + 6) == 1  # a retries: it keeps its place
    assert await states(store, b) == ["waiting"]
    job_a = await store.job_get(a)
    assert job_a is not None and job_a.state in (State.READY, State.SCHEDULED)
    await store.job_promote_due(NOW + 100, 10)
    await claim(store, NOW + 100)
    assert await maintenance.recover_leases(NOW + 106) == 1  # no tries left: dead
    assert await states(store, a, b) == ["dead", "ready"]


async def test_halt_stops_the_lane_until_the_dead_job_is_respawned(store: Store) -> None:
    await store.lane_rule_set(NS, LaneRule("L", 1, "halt"), NOW)
    a, b = await lane_jobs(store, 2, max_tries=1)
    (job_a,) = await claim(store)
    dead = Finish("dead", a, job_a.fence, NOW, NOW, error={"message": "boom"})
    await store.job_finish_many([dead])
    assert await states(store, a, b) == ["dead", "waiting"]
    view = await store.lane_view(NS, "L")
    assert view.halted_by == a and view.held == []
    listed = await store.lane_list(NS, 10)
    assert [(i.lane, i.waiting, i.halted_by) for i in listed] == [("L", 1, a)]
    c = await insert(store, NOW, lane="L")  # enqueue into a halted lane: it waits
    assert await states(store, c) == ["waiting"]
    assert await store.job_respawn([a], NOW + 1) == [a]
    assert (await store.lane_view(NS, "L")).halted_by is None
    assert await states(store, a, b, c) == ["ready", "waiting", "waiting"]


async def test_a_respawned_job_that_halted_its_lane_resumes_at_once_as_a_retry_would(
    store: Store,
) -> None:
    await store.lane_rule_set(NS, LaneRule("L", 2, "halt"), NOW)
    a, b, c = await lane_jobs(store, 3, max_tries=1)
    job_a, _ = await claim(store, limit=2)
    await store.job_finish_many([Finish("dead", a, job_a.fence, NOW, NOW, error={})])
    # b started before a died and runs on; the limit drops to what b fills alone.
    await store.lane_rule_set(NS, LaneRule("L", 1, "continue"), NOW)
    assert await store.job_respawn([a], NOW + 1) == [a]
    # a goes first and keeps its place, beside b; c waits for the lane to have room.
    assert await states(store, a, b, c) == ["ready", "running", "waiting"]
    assert [j.id for j in await claim(store, NOW + 1)] == [a]


async def test_purging_the_dead_job_releases_a_halted_lane(store: Store) -> None:
    await store.lane_rule_set(NS, LaneRule("L", 1, "halt"), NOW)
    a, b = await lane_jobs(store, 2, max_tries=1)
    (job_a,) = await claim(store)
    await store.job_finish_many([Finish("dead", a, job_a.fence, NOW, NOW, error={})])
    assert await store.job_purge([a], NOW) == 1
    assert await states(store, b) == ["ready"]


async def test_a_halt_steps_back_jobs_not_started_but_lets_running_ones_finish(
    store: Store,
) -> None:
    await store.lane_rule_set(NS, LaneRule("L", 3, "halt"), NOW)
    a, b, c = await lane_jobs(store, 3, max_tries=1)
    job_a, job_b = await claim(store, limit=2)
    await store.job_finish_many([Finish("dead", a, job_a.fence, NOW, NOW, error={})])
    assert await states(store, a, b, c) == ["dead", "running", "waiting"]
    assert (await store.job_finish_many([succeed(job_b, NOW)])).accepted == [b]
    assert await states(store, c) == ["waiting"]


async def test_continue_policy_moves_on_after_a_death(store: Store) -> None:
    a, b = await lane_jobs(store, 2, max_tries=1)
    (job_a,) = await claim(store)
    await store.job_finish_many([Finish("dead", a, job_a.fence, NOW, NOW, error={})])
    assert await states(store, b) == ["ready"]


async def test_rules_change_at_once_for_jobs_not_started(store: Store) -> None:
    ids = await lane_jobs(store, 4, lane="t:1") + await lane_jobs(store, 2, lane="t:2")
    await store.lane_rule_set(NS, LaneRule("t:*", 3), NOW)
    assert await states(store, *ids) == ["ready"] * 3 + ["waiting"] + ["ready"] * 2
    await claim(store, limit=1)  # ids[0] starts: it keeps its slot
    await store.lane_rule_set(NS, LaneRule("t:1", 1), NOW)  # the lane's own rule wins
    assert await states(store, *ids[:4]) == ["running", "waiting", "waiting", "waiting"]
    assert await store.lane_rule_delete(NS, "t:1", NOW)
    assert await states(store, *ids[:4]) == ["running", "ready", "ready", "waiting"]
    assert not await store.lane_rule_delete(NS, "t:1", NOW)
    assert [r.pattern for r in await store.lane_rules(NS)] == ["t:*"]


async def test_a_stale_finish_changes_nothing_in_the_lane(store: Store) -> None:
    a, b = await lane_jobs(store, 2)
    (job_a,) = await claim(store)
    stale = Finish("succeeded", a, job_a.fence - 1, NOW, NOW)
    assert (await store.job_finish_many([stale])).stale == [a]
    assert await states(store, a, b) == ["running", "waiting"]


async def test_dedup_inside_a_lane_returns_the_existing_job(store: Store) -> None:
    (first,) = await store.job_insert_many(new_job(NOW, lane="L", unique_key="k"), ["[]"])
    (again,) = await store.job_insert_many(new_job(NOW, lane="L", unique_key="k"), ["[]"])
    assert again.id == first.id and not again.created
    assert (await store.lane_view(NS, "L")).held[0].id == first.id


async def test_lane_list_counts_each_lane_busiest_first_then_halted_lanes(
    store: Store,
) -> None:
    await store.lane_rule_set(NS, LaneRule("L", 2), NOW)
    await store.lane_rule_set(NS, LaneRule("H", 1, "halt"), NOW)
    await lane_jobs(store, 4)
    await insert(store, NOW, lane="M")
    halting = await insert(store, NOW, lane="H", queue="h", max_tries=1)
    (job,) = await store.job_claim(NS, ["h"], 1, "w1", NOW)
    await store.job_finish_many([Finish("dead", halting, job.fence, NOW, NOW, error={})])
    await claim(store, limit=1)  # the first job of L starts
    listed = [(i.lane, i.waiting, i.admitted, i.running, i.halted_by, i.rule)
              for i in await store.lane_list(NS, 10)]  # fmt: skip
    assert listed == [
        ("L", 2, 1, 1, None, LaneRule("L", 2)),
        ("M", 0, 1, 0, None, LaneRule("*")),
        ("H", 0, 0, 0, halting, LaneRule("H", 1, "halt")),
    ]
    assert [i.lane for i in await store.lane_list(NS, 1)] == ["L", "H"]


async def test_lane_ahead_counts_waiting_jobs_in_front(store: Store) -> None:
    ids = await lane_jobs(store, 5)
    assert await store.lane_ahead(NS, "L", ids[4]) == 3  # ids[0] is admitted


async def finish_and_claim(store: Store, finishes: list[Finish], limit: int) -> list[Claimed]:
    return (await store.job_finish_and_claim(finishes, NS, ["default"], limit, "w1", NOW))[1]


async def test_a_freed_lane_hands_its_next_job_to_the_worker_that_freed_it(
    store: Store,
) -> None:
    _a, b = await lane_jobs(store, 2)
    other = await insert(store, NOW)  # ready, and older than b's turn in the claim order
    (job_a,) = await claim(store, limit=1)
    done = succeed(job_a, NOW)
    done.lane = "L"
    taken = await finish_and_claim(store, [done], limit=1)
    assert [j.id for j in taken] == [b]  # straight from waiting to running
    job_b = await store.job_get(b)
    assert job_b is not None and job_b.state == State.RUNNING and job_b.worker == "w1"
    assert await states(store, other) == ["ready"]


async def test_a_big_batch_of_finishes_hands_over_every_lane_once_in_order(
    store: Store,
) -> None:
    # Big enough for a backend to write it in parts (PostgreSQL splits the lanes over
    # two transactions): every lane still hands over its next job exactly once, a
    # lane of limit 3 keeps its three, and plain finishes go along.
    await store.lane_rule_set(NS, LaneRule("wide", 3), NOW)
    lanes = [f"l:{i:03}" for i in range(200)]
    second = {}
    for lane in lanes:
        _first, second[lane] = await lane_jobs(store, 2, lane=lane)
    wide = await lane_jobs(store, 5, lane="wide")
    plain = [await insert(store, NOW) for _ in range(3)]
    running = await claim(store, limit=500)
    assert len(running) == len(lanes) + 3 + len(plain)
    finishes = []
    for job in running:
        finishes.append(succeed(job, NOW))
        finishes[-1].lane = job.lane
    report, taken = await store.job_finish_and_claim(finishes, NS, ["default"], 500, "w1", NOW)
    assert sorted(report.accepted) == sorted(j.id for j in running) and report.stale == []
    assert sorted(j.id for j in taken) == sorted([*second.values(), *wide[3:]])
    assert await states(store, *wide[3:]) == ["running", "running"]
    assert await claim(store) == []


async def test_a_lane_hands_over_only_what_the_worker_may_run_now(store: Store) -> None:
    _a, b = await lane_jobs(store, 2, queue="elsewhere")  # a queue this worker does not take
    _c, d = await lane_jobs(store, 2, lane="M")
    e = await insert(store, NOW, lane="M", delay=30.0)
    (job_a,) = await store.job_claim(NS, ["elsewhere"], 1, "w1", NOW)
    (job_c,) = await claim(store, limit=1)
    finishes = [succeed(job_a, NOW), succeed(job_c, NOW)]
    finishes[0].lane, finishes[1].lane = "L", "M"
    assert await finish_and_claim(store, finishes, limit=0) == []  # no free slot
    assert await states(store, b, d, e) == ["ready", "ready", "waiting"]
    (job_d,) = await claim(store, limit=1)
    done = succeed(job_d, NOW)
    done.lane = "M"
    assert await finish_and_claim(store, [done], limit=1) == []  # e is not due
    assert await states(store, e) == ["scheduled"]


async def test_the_lane_own_rule_then_the_longest_prefix_decides_the_limit(
    store: Store,
) -> None:
    for rule in (LaneRule("t:*", 2), LaneRule("t:big:*", 3), LaneRule("t:big:9", 1)):
        await store.lane_rule_set(NS, rule, NOW)
    expected = {"t:small": 2, "t:big:1": 3, "t:big:9": 1, "other": 1}
    for lane, limit in expected.items():
        ids = await lane_jobs(store, 4, lane=lane)
        held = await states(store, *ids)
        assert held.count(State.READY) == limit, lane


async def test_a_lane_across_queues_still_starts_in_enqueue_order(store: Store) -> None:
    # With room for two, a job waits while one of another queue ahead of it has not
    # started: a worker of its own queue would otherwise start it first.
    await store.lane_rule_set(NS, LaneRule("L", 2, "continue"), NOW)
    first = await insert(store, NOW, lane="L", queue="q1")
    second = await insert(store, NOW, lane="L", queue="q2")
    third = await insert(store, NOW, lane="L", queue="q2")
    assert await states(store, first, second, third) == ["ready", "waiting", "waiting"]
    assert await store.job_claim(NS, ["q2"], 10, "w2", NOW) == []
    (started,) = await store.job_claim(NS, ["q1"], 10, "w1", NOW)
    assert started.id == first
    # The next settle of the lane (here a finish) admits the jobs behind it.
    await store.job_finish_many([succeed(started, NOW)])
    assert await states(store, second, third) == ["ready", "ready"]
    assert [j.id for j in await store.job_claim(NS, ["q2"], 10, "w2", NOW)] == [second, third]


async def test_a_lane_admits_behind_a_started_job_of_another_queue(store: Store) -> None:
    await store.lane_rule_set(NS, LaneRule("L", 3, "continue"), NOW)
    first = await insert(store, NOW, lane="L", queue="q1")
    second = await insert(store, NOW, lane="L", queue="q2")
    await store.job_claim(NS, ["q1"], 10, "w1", NOW)
    third = await insert(store, NOW, lane="L", queue="q2")  # its enqueue settles the lane
    assert await states(store, first, second, third) == ["running", "ready", "ready"]


async def test_a_lane_over_its_limit_or_halted_hands_nothing_over(store: Store) -> None:
    # A lane of limit 1 that still holds a job once another of its jobs ends (its limit
    # was lowered while two ran), or that is halted, gives its next job to no one.
    await store.lane_rule_set(NS, LaneRule("L", 2, "halt"), NOW)
    _, b, c = await lane_jobs(store, 3, max_tries=1)
    job_a, job_b = await claim(store, limit=2)
    await store.lane_rule_set(NS, LaneRule("L", 1, "halt"), NOW)
    assert await finish_and_claim(store, [succeed(job_a, NOW)], limit=2) == []
    assert await states(store, b, c) == ["running", "waiting"]
    await store.lane_rule_set(NS, LaneRule("L", 2, "halt"), NOW)
    (job_c,) = await claim(store)
    await store.lane_rule_set(NS, LaneRule("L", 1, "halt"), NOW)
    d = await insert(store, NOW, lane="L", max_tries=1)
    await store.job_finish_many([Finish("dead", c, job_c.fence, NOW, NOW, error={})])
    assert await finish_and_claim(store, [succeed(job_b, NOW)], limit=2) == []
    assert await states(store, d) == ["waiting"]  # halted behind c


async def test_a_finish_that_names_no_lane_or_a_wrong_one_still_settles_the_lane(
    store: Store,
) -> None:
    # The store finds the lanes of the jobs it finishes itself: Finish.lane is a hint.
    a, b, c = await lane_jobs(store, 3)
    (job_a,) = await claim(store)
    assert job_a.id == a
    assert (await store.job_finish_many([succeed(job_a, NOW)])).accepted == [a]
    (job_b,) = await claim(store)
    assert job_b.id == b
    wrong = succeed(job_b, NOW)
    wrong.lane = "elsewhere"
    taken = await finish_and_claim(store, [wrong], limit=1)
    assert [j.id for j in taken + await claim(store)] == [c]


async def test_a_new_attempt_starts_without_the_progress_of_the_last_one(store: Store) -> None:
    """Every way a job is claimed writes one rule (ferryq.store.sql.claim_set): here a
    plain claim, an HTTP consumer's take and a lane's hand-over, each of a respawned job
    whose dead attempt had reported its progress."""
    reported = '{"done": 1, "total": 2, "note": null, "at": 0}'

    async def dies_with_progress(job: Claimed) -> None:
        await store.job_leases([(job.id, job.fence)], [job.id], NOW, progress={job.id: reported})
        assert (await store.job_get(job.id)).progress is not None  # type: ignore[union-attr]
        dead = Finish("dead", job.id, job.fence, NOW, NOW, error={"message": "no"})
        await store.job_finish_many([dead])
        assert await store.job_respawn([job.id], NOW) == [job.id]

    a, b = await lane_jobs(store, 2)
    plain = await insert(store, NOW, queue="plain")
    taken = await insert(store, NOW, queue="http")
    for queue in ("plain", "http"):
        await dies_with_progress((await store.job_claim(NS, [queue], 1, "w1", NOW))[0])
    (job_a,) = await claim(store, limit=1)
    await dies_with_progress(job_a)  # a comes back waiting, behind b, which runs now
    (job_b,) = await claim(store, limit=1)
    assert job_b.id == b
    done = succeed(job_b, NOW)
    done.lane = "L"
    assert [j.id for j in await finish_and_claim(store, [done], limit=1)] == [a]
    assert [j.id for j in await store.job_claim(NS, ["plain"], 1, "w1", NOW)] == [plain]
    assert [j.id for j in await store.job_take(NS, "http", 1, "c", 30.0, NOW)] == [taken]
    for job_id in (a, plain, taken):
        job = await store.job_get(job_id)
        assert job is not None and job.state == State.RUNNING and job.attempts == 1
        assert job.progress is None, job_id
