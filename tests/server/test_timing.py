"""Blocking consumes, delays and leases in real time, on a server with no worker.

lmstfy's clients assume that a delay or a lease fires never before its time, and soon
after it. These are the suite's only tests that wait on the clock (1 s each); they
wait with a blocking consume or a short poll under a deadline, never a sleep. What is
asserted is the order of things: never before its time (the test's clock starts before
the server's, so that bound is never too late), and while a consumer waits for it (a
blocking consume gets the job before its own timeout, which a server that only looked
at the end of the wait would not give). How soon after is a speed, not asserted: a busy
machine makes any bound on it fail now and then.

Every blocking consume of the suite is here, in a module (and so a server) of its
own: a server that mishandles one cannot take the other modules' tests down with it.
"""

from __future__ import annotations

import socket
import time
from contextlib import ExitStack
from urllib.parse import urlsplit

import ferryq
from tests.processes import wait_until
from tests.server.conftest import ALSO_POOLED
from tests.server.harness import HTTP_TIMEOUT, Lmstfy, assert_error, assert_no_job, b64

EARLY = 0.05  # the test's clock starts before the server's, so this is slack, not leave
WAIT = 10  # seconds a blocking consume waits here: an answer before it was a wake-up


# -- blocking consumes ----------------------------------------------------------


@ALSO_POOLED
def test_a_blocking_consume_returns_a_job_published_during_the_wait(lm: Lmstfy) -> None:
    with lm.consuming("q", timeout=WAIT) as pending:
        published_at = time.monotonic()
        job_id = lm.publish_ok("q", b"late")
        consumed = pending.result(timeout=20)
        took = time.monotonic() - published_at
    assert consumed.status_code == 200, consumed.text
    assert consumed.json()["job_id"] == job_id
    assert consumed.json()["data"] == b64(b"late")
    assert took < WAIT, f"the job came at the end of the wait ({took:.2f} s), not at once"


def test_a_blocking_consume_on_several_queues_returns_the_first_published(lm: Lmstfy) -> None:
    with lm.consuming("a,b", timeout=10) as pending:
        job_id = lm.publish_ok("b", b"in b")
        consumed = pending.result(timeout=20)
    assert consumed.status_code == 200, consumed.text
    assert (consumed.json()["queue"], consumed.json()["job_id"]) == ("b", job_id)


@ALSO_POOLED
def test_a_blocking_consume_that_times_out_is_404_no_job_available(lm: Lmstfy) -> None:
    began = time.monotonic()
    consumed = lm.consume("q", timeout=1)
    took = time.monotonic() - began
    assert_no_job(consumed)
    assert took >= 1 - EARLY, f"timeout=1 answered after {took:.2f} s"


def test_count_over_one_waits_for_the_first_job_and_returns_it_in_an_array(lm: Lmstfy) -> None:
    with lm.consuming("q", timeout=10, count=5) as pending:
        job_id = lm.publish_ok("q", b"x")
        consumed = pending.result(timeout=20)
    assert consumed.status_code == 200, consumed.text
    jobs = consumed.json()
    assert isinstance(jobs, list) and jobs[0]["job_id"] == job_id


def test_one_job_wakes_one_of_two_waiting_consumers_and_only_its_own(lm: Lmstfy) -> None:
    namespace = f"{lm.namespace}-x"
    stranger = Lmstfy(lm.server, namespace, lm.server.create_token(namespace))
    try:
        with lm.consuming("q", timeout=2) as first, lm.consuming("q", timeout=2) as second:
            stranger.publish_ok("q", b"not for them")  # same queue name, other namespace
            job_id = lm.publish_ok("q", b"for one of them")
            answers = [first.result(timeout=10), second.result(timeout=10)]
    finally:
        stranger.close()
    codes = sorted(answer.status_code for answer in answers)
    assert codes == [200, 404], [answer.text for answer in answers]
    (taken,) = [answer.json() for answer in answers if answer.status_code == 200]
    assert (taken["namespace"], taken["job_id"]) == (lm.namespace, job_id)


def test_many_waiting_consumers_share_as_many_jobs_one_each(lm: Lmstfy) -> None:
    with ExitStack() as stack:
        waiting = [stack.enter_context(lm.consuming("q", timeout=10)) for _ in range(8)]
        ids = {lm.publish_ok("q", f"{n}".encode()) for n in range(8)}
        answers = [pending.result(timeout=20) for pending in waiting]
    assert all(answer.status_code == 200 for answer in answers), [a.text for a in answers]
    assert sorted(answer.json()["job_id"] for answer in answers) == sorted(ids)


def test_count_over_one_with_jobs_ready_does_not_wait_for_more(lm: Lmstfy) -> None:
    ids = [lm.publish_ok("q", b"x") for _ in range(2)]
    began = time.monotonic()
    consumed = lm.consume("q", count=5, timeout=WAIT)
    took = time.monotonic() - began
    assert consumed.status_code == 200, consumed.text
    assert [job["job_id"] for job in consumed.json()] == ids
    assert took < WAIT, f"answered after its whole wait ({took:.2f} s) with jobs ready"


def test_a_consumer_that_goes_away_while_waiting_takes_no_job(lm: Lmstfy) -> None:
    # A job taken for a closed connection would stay leased until its ttr, unseen.
    url = urlsplit(lm.server.api)
    assert url.hostname is not None and url.port is not None
    assert lm.size("q") == 0 and lm.peek("other").status_code == 404  # the token is known
    head = f"Host: {url.netloc}\r\nX-Token: {lm.token}\r\n\r\n"
    with socket.create_connection((url.hostname, url.port), timeout=HTTP_TIMEOUT) as gone:
        gone.sendall(f"GET /healthz HTTP/1.1\r\n{head}".encode())
        assert gone.recv(4096).startswith(b"HTTP/1.1 200")  # the server reads this socket
        gone.sendall(f"GET {lm.path('q')}?timeout=10&ttr=600 HTTP/1.1\r\n{head}".encode())
        # Another consume of the queue, answered after the first one has looked at it
        # (the store serves them in order) and gone to wait.
        assert_no_job(lm.consume("q"))
    job_id = lm.publish_ok("q", b"for a live consumer", tries=2)
    consumed = lm.consume_ok("q", timeout=5)
    assert (consumed["job_id"], consumed["remain_tries"]) == (job_id, 1)


# -- delays and leases ---------------------------------------------------------------


@ALSO_POOLED
def test_a_delayed_job_becomes_consumable_after_its_delay_and_not_before(lm: Lmstfy) -> None:
    published_at = time.monotonic()
    job_id = lm.publish_ok("q", b"later", delay=1, ttl=10)
    assert_no_job(lm.consume("q"))
    assert lm.size("q") == 0
    job = lm.consume_ok("q", timeout=WAIT)  # it fires while the consume waits
    took = time.monotonic() - published_at
    assert job["job_id"] == job_id and job["data"] == b64(b"later")
    assert took >= 1 - EARLY, f"a 1 s delay fired after {took:.2f} s"
    assert job["elapsed_ms"] >= 1000 - EARLY * 1000
    # Counted from the publish, not from the end of the delay, in whole seconds.
    assert job["ttl"] <= 9 and abs(job["ttl"] - (10 - job["elapsed_ms"] / 1000)) <= 0.501, job


def test_a_job_past_its_ttl_is_dropped(lm: Lmstfy) -> None:
    job_id = lm.publish_ok("q", b"stale", ttl=1)
    kept = lm.publish_ok("q", b"fresh", ttl=0)
    assert lm.size("q") == 2
    wait_until(lambda: lm.size("q") == 1, within=WAIT, what="the ttl to pass")
    assert_error(lm.peek_job("q", job_id), 404, "job not found")
    assert lm.consume_ok("q")["job_id"] == kept
    assert_no_job(lm.consume("q"))
    assert lm.dead_size("q") == 0


def test_an_expired_lease_with_tries_left_puts_the_job_back(lm: Lmstfy) -> None:
    job_id = lm.publish_ok("q", b"retry me", tries=2)
    leased_at = time.monotonic()
    first = lm.consume_ok("q", ttr=1)
    assert (first["job_id"], first["remain_tries"]) == (job_id, 1)
    assert_no_job(lm.consume("q"))  # leased: not ready
    again = lm.consume_ok("q", timeout=WAIT, ttr=30)  # back while the consume waits
    took = time.monotonic() - leased_at
    assert (again["job_id"], again["remain_tries"], again["data"]) == (job_id, 0, b64(b"retry me"))
    assert took >= 1 - EARLY, f"a 1 s lease expired after {took:.2f} s"
    assert lm.dead_size("q") == 0


def test_a_job_back_from_an_expired_lease_goes_to_the_end_of_its_queue(lm: Lmstfy) -> None:
    first = lm.publish_ok("q", b"first", tries=2)
    assert lm.consume_ok("q", ttr=1)["job_id"] == first
    second = lm.publish_ok("q", b"second")
    wait_until(lambda: lm.size("q") == 2, within=WAIT, what="the lease to expire")
    assert lm.consume_ok("q")["job_id"] == second
    assert lm.consume_ok("q")["job_id"] == first


def test_an_expired_lease_without_tries_left_lands_in_the_dead_letter(lm: Lmstfy) -> None:
    job_id = lm.publish_ok("q", b"doomed")
    leased_at = time.monotonic()
    assert lm.consume_ok("q", ttr=1)["remain_tries"] == 0
    assert lm.deadletter("q").json()["deadletter_size"] == 0
    wait_until(lambda: lm.dead_size("q") == 1, within=WAIT, what="a dead job")
    took = time.monotonic() - leased_at
    assert took >= 1 - EARLY, f"the dead letter got the job after {took:.2f} s"
    dead = lm.deadletter("q")
    assert (dead.status_code, dead.json()) == (
        200,
        {"namespace": lm.namespace, "queue": "q", "deadletter_size": 1, "deadletter_head": job_id},
    )
    assert lm.size("q") == 0
    assert_no_job(lm.consume("q"))
    app = ferryq.App(lm.server.url, namespace=lm.namespace)
    try:
        assert app.get_job(int(job_id)).state == "dead"
    finally:
        app.close()


@ALSO_POOLED
def test_an_acked_job_is_not_consumed_again_after_its_lease(lm: Lmstfy) -> None:
    job_id = lm.publish_ok("q", b"done", tries=3)
    lm.consume_ok("q", ttr=1)
    assert lm.ack("q", job_id).status_code == 204
    began = time.monotonic()
    assert_no_job(lm.consume("q", timeout=2))  # outlasts the lease by a second
    assert time.monotonic() - began >= 2 - EARLY
    assert lm.dead_size("q") == 0
