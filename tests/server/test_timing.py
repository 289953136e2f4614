"""Delays and leases in real time, on a server with no worker beside it.

lmstfy's clients assume that a delay or a lease fires within about a second of its
time, never before it. These are the suite's only tests that wait on the clock (1 s
each); they wait with a blocking consume or a short poll under a deadline, never a
sleep. The window asserted is [time - EARLY, time + LATE].
"""

from __future__ import annotations

import time

from tests.server.harness import Lmstfy, assert_no_job, b64, wait_until

EARLY = 0.05  # the test's clock starts before the server's, so this is slack, not leave
LATE = 1.25  # "within about a second", plus the round trips


def test_a_delayed_job_becomes_consumable_after_its_delay_and_not_before(lm: Lmstfy) -> None:
    published_at = time.monotonic()
    job_id = lm.publish_ok("q", b"later", delay=1)
    assert_no_job(lm.consume("q"))
    assert lm.size("q") == 0
    job = lm.consume_ok("q", timeout=5)
    took = time.monotonic() - published_at
    assert job["job_id"] == job_id and job["data"] == b64(b"later")
    assert 1 - EARLY <= took <= 1 + LATE, f"a 1 s delay fired after {took:.2f} s"
    assert job["elapsed_ms"] >= 1000 - EARLY * 1000


def test_an_expired_lease_with_tries_left_puts_the_job_back(lm: Lmstfy) -> None:
    job_id = lm.publish_ok("q", b"retry me", tries=2)
    leased_at = time.monotonic()
    first = lm.consume_ok("q", ttr=1)
    assert (first["job_id"], first["remain_tries"]) == (job_id, 1)
    assert_no_job(lm.consume("q"))  # leased: not ready
    again = lm.consume_ok("q", timeout=5, ttr=30)
    took = time.monotonic() - leased_at
    assert (again["job_id"], again["remain_tries"], again["data"]) == (job_id, 0, b64(b"retry me"))
    assert 1 - EARLY <= took <= 1 + LATE, f"a 1 s lease expired after {took:.2f} s"
    assert lm.dead_size("q") == 0


def test_a_job_back_from_an_expired_lease_goes_to_the_end_of_its_queue(lm: Lmstfy) -> None:
    first = lm.publish_ok("q", b"first", tries=2)
    assert lm.consume_ok("q", ttr=1)["job_id"] == first
    second = lm.publish_ok("q", b"second")
    wait_until(lambda: lm.size("q") == 2, within=1 + LATE + 1, what="the lease to expire")
    assert lm.consume_ok("q")["job_id"] == second
    assert lm.consume_ok("q")["job_id"] == first


def test_an_expired_lease_without_tries_left_lands_in_the_dead_letter(lm: Lmstfy) -> None:
    job_id = lm.publish_ok("q", b"doomed")
    leased_at = time.monotonic()
    assert lm.consume_ok("q", ttr=1)["remain_tries"] == 0
    assert lm.deadletter("q").json()["deadletter_size"] == 0
    wait_until(lambda: lm.dead_size("q") == 1, within=1 + LATE + 1, what="a dead job")
    took = time.monotonic() - leased_at
    assert 1 - EARLY <= took <= 1 + LATE, f"the dead letter got the job after {took:.2f} s"
    dead = lm.deadletter("q")
    assert (dead.status_code, dead.json()) == (
        200,
        {"namespace": lm.namespace, "queue": "q", "deadletter_size": 1, "deadletter_head": job_id},
    )
    assert lm.size("q") == 0
    assert_no_job(lm.consume("q"))


def test_an_acked_job_is_not_consumed_again_after_its_lease(lm: Lmstfy) -> None:
    job_id = lm.publish_ok("q", b"done", tries=3)
    lm.consume_ok("q", ttr=1)
    assert lm.ack("q", job_id).status_code == 204
    began = time.monotonic()
    assert_no_job(lm.consume("q", timeout=2))  # outlasts the lease by a second
    assert time.monotonic() - began >= 2 - EARLY
    assert lm.dead_size("q") == 0
