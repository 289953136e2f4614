"""Consuming, acknowledging, peeking, sizing and destroying over lmstfy's API."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.server.harness import (
    CONSUMED_KEYS,
    HTTP_TIMEOUT,
    JOB_KEYS,
    Lmstfy,
    assert_error,
    assert_no_job,
    b64,
    each,
)

UINT32_OVER = str(1 << 32)


# -- the job object -----------------------------------------------------------------


def test_a_consumed_job_is_the_documented_object(lm: Lmstfy) -> None:
    began = time.monotonic()
    job_id = lm.publish_ok("q", b"payload", ttl=10, tries=3)
    job = lm.consume_ok("q", ttr=30)
    span_ms = (time.monotonic() - began) * 1000
    assert set(job) == CONSUMED_KEYS
    assert job["msg"] == "new job"
    assert (job["namespace"], job["queue"], job["job_id"]) == (lm.namespace, "q", job_id)
    assert job["data"] == b64(b"payload")
    assert job["remain_tries"] == 2
    assert job["attributes"] is None
    # Since the publish, within the test's own span of it; the ttl counted from there,
    # in whole seconds (10 when read at once).
    assert isinstance(job["elapsed_ms"], int) and 0 <= job["elapsed_ms"] <= span_ms
    assert abs(job["ttl"] - (10 - job["elapsed_ms"] / 1000)) <= 0.501, job


def test_data_is_base64_of_the_exact_body_bytes(lm: Lmstfy) -> None:
    body = bytes(range(256)) + b"\xff\xfe\x00\xc3\x28 not utf-8"
    job_id = lm.publish_ok("q", body)
    assert lm.peek_job("q", job_id).json()["data"] == b64(body)
    assert lm.consume_ok("q")["data"] == b64(body)


def test_an_empty_body_comes_back_empty_or_null(lm: Lmstfy) -> None:
    lm.publish_ok("q", b"")
    assert lm.consume_ok("q")["data"] in ("", None)


def test_remain_tries_is_the_count_after_this_consume(lm: Lmstfy) -> None:
    job_id = lm.publish_ok("q", b"x", tries=5)
    assert lm.peek_job("q", job_id).json()["remain_tries"] == 5
    assert lm.consume_ok("q", ttr=60)["remain_tries"] == 4
    assert lm.peek_job("q", job_id).json()["remain_tries"] == 4


# -- consume ------------------------------------------------------------------------


def test_consume_of_an_empty_queue_is_404_no_job_available(lm: Lmstfy) -> None:
    assert_no_job(lm.consume("q"))
    assert_no_job(lm.consume("q", timeout=0))


def test_jobs_are_consumed_in_publish_order_and_only_once(lm: Lmstfy) -> None:
    ids = [lm.publish_ok("q", f"{n}".encode()) for n in range(5)]
    assert [lm.consume_ok("q")["job_id"] for _ in range(5)] == ids
    assert_no_job(lm.consume("q"))


def test_a_consumed_job_is_leased_and_not_ready(lm: Lmstfy) -> None:
    lm.publish_ok("q", b"x")
    lm.consume_ok("q", ttr=60)
    assert lm.size("q") == 0
    assert_no_job(lm.consume("q"))


def test_several_queues_are_tried_in_the_order_given(lm: Lmstfy) -> None:
    low = lm.publish_ok("low", b"low")
    high = lm.publish_ok("high", b"high")
    # timeout=1 only so that no reading of lmstfy could refuse a multi-queue consume;
    # both jobs are ready, so nothing waits.
    job = lm.consume_ok("high,low", timeout=1)
    assert (job["queue"], job["job_id"]) == ("high", high)
    job = lm.consume_ok("high,low", timeout=1)
    assert (job["queue"], job["job_id"]) == ("low", low)
    lm.publish_ok("high", b"again")
    lm.publish_ok("low", b"again")
    assert lm.consume_ok("low,high", timeout=1)["queue"] == "low"


def test_count_over_one_returns_an_array_of_what_is_ready(lm: Lmstfy) -> None:
    ids = [lm.publish_ok("q", f"{n}".encode(), tries=2) for n in range(3)]
    consumed = lm.consume("q", count=5, ttr=60)
    assert consumed.status_code == 200, consumed.text
    jobs = consumed.json()
    assert isinstance(jobs, list)
    assert [job["job_id"] for job in jobs] == ids
    for n, job in enumerate(jobs):
        assert set(job) == CONSUMED_KEYS
        assert job["msg"] == "new job"
        assert (job["namespace"], job["queue"]) == (lm.namespace, "q")
        assert (job["data"], job["remain_tries"]) == (b64(f"{n}".encode()), 1)
    assert_no_job(lm.consume("q", count=5))


def test_count_over_one_takes_from_several_queues_in_their_order(lm: Lmstfy) -> None:
    first = [lm.publish_ok("a", b"a") for _ in range(2)]
    second = lm.publish_ok("b", b"b")
    consumed = lm.consume("b,a", count=10, timeout=1)
    assert consumed.status_code == 200, consumed.text
    jobs = consumed.json()
    assert [(job["queue"], job["job_id"]) for job in jobs] == [
        ("b", second),
        ("a", first[0]),
        ("a", first[1]),
    ]


def test_count_of_100_takes_100_jobs(lm: Lmstfy) -> None:
    body = json.dumps([{"n": n} for n in range(64)]).encode()
    ids = lm.bulk("q", body).json()["job_ids"] + lm.bulk("q", body).json()["job_ids"]
    jobs = lm.consume("q", count=100).json()
    assert [job["job_id"] for job in jobs] == ids[:100]
    assert lm.size("q") == 28


def test_concurrent_consumers_never_get_the_same_job(lm: Lmstfy) -> None:
    body = json.dumps([{"n": n} for n in range(60)]).encode()
    published = set(lm.bulk("q", body).json()["job_ids"])

    def drain(_: int) -> list[str]:
        taken: list[str] = []
        with httpx.Client(base_url=lm.server.api, timeout=HTTP_TIMEOUT) as client:
            while True:
                answer = client.get(lm.path("q"), headers={"X-Token": lm.token})
                if answer.status_code == 404:
                    return taken
                assert answer.status_code == 200, answer.text
                taken.append(answer.json()["job_id"])

    with ThreadPoolExecutor(6) as pool:
        taken = [job_id for batch in pool.map(drain, range(6)) for job_id in batch]
    assert sorted(taken) == sorted(published)


def test_count_takes_at_most_count_jobs(lm: Lmstfy) -> None:
    ids = [lm.publish_ok("q", b"x") for _ in range(5)]
    jobs = lm.consume("q", count=2).json()
    assert [job["job_id"] for job in jobs] == ids[:2]
    assert lm.size("q") == 3


def test_count_over_one_with_one_job_is_an_array_of_one(lm: Lmstfy) -> None:
    job_id = lm.publish_ok("q", b"x")
    jobs = lm.consume("q", count=100).json()
    assert isinstance(jobs, list) and [job["job_id"] for job in jobs] == [job_id]


def test_count_one_is_a_single_object(lm: Lmstfy) -> None:
    lm.publish_ok("q", b"x")
    assert set(lm.consume_ok("q", count=1)) == CONSUMED_KEYS


def test_invalid_count_ttr_and_timeout_are_refused_and_change_nothing(lm: Lmstfy) -> None:
    job_id = lm.publish_ok("q", b"x", tries=3)
    cases = (
        [
            ("count", value, "invalid count")
            for value in ["0", "101", "-1", "abc", "", "2.0", UINT32_OVER]
        ]
        + [("ttr", value, "invalid ttr") for value in ["-1", "abc", "", "1.5", UINT32_OVER]]
        + [("timeout", value, "invalid timeout") for value in ["-1", "abc", "", "0.5", UINT32_OVER]]
    )

    def check(case: tuple[str, str, str]) -> None:
        name, value, message = case
        assert_error(lm.consume("q", **{name: value}), 400, message)

    each(cases, check)
    assert lm.size("q") == 1
    assert lm.peek_job("q", job_id).json()["remain_tries"] == 3


def test_a_queue_list_without_a_queue_is_refused(lm: Lmstfy) -> None:
    each(
        [",", ",,"],
        lambda queues: assert_error(lm.consume(queues, timeout=1), 400, "invalid queue name(s)"),
    )


def test_a_queue_list_with_a_forbidden_name_is_refused(lm: Lmstfy) -> None:
    lm.publish_ok("a", b"x")

    def check(queues: str) -> None:
        consumed = lm.consume(queues, timeout=1)
        assert consumed.status_code == 400, consumed.text
        assert consumed.json()["error"] in (
            "queue name contains forbidden characters",
            "invalid queue name(s)",
        )

    each(["a,b.c", "a,_b", "a;b"], check)
    assert lm.size("a") == 1


# -- ack ------------------------------------------------------------------------------


def test_ack_is_204_and_the_job_is_gone(lm: Lmstfy) -> None:
    job_id = lm.publish_ok("q", b"x")
    lm.consume_ok("q", ttr=60)
    acked = lm.ack("q", job_id)
    assert (acked.status_code, acked.content) == (204, b"")
    assert_error(lm.peek_job("q", job_id), 404, "job not found")
    assert_no_job(lm.consume("q"))
    assert lm.dead_size("q") == 0


def test_ack_twice_or_of_an_unknown_id_is_204(lm: Lmstfy) -> None:
    job_id = lm.publish_ok("q", b"x")
    lm.consume_ok("q")
    assert lm.ack("q", job_id).status_code == 204
    assert lm.ack("q", job_id).status_code == 204
    for unknown in ("0", "123456789", "01ARZ3NDEKTSV4RRFFQ69G5FAV", "not-an-id", "-7"):
        assert lm.ack("q", unknown).status_code == 204, unknown


def test_ack_of_an_unknown_id_changes_nothing(lm: Lmstfy) -> None:
    job_id = lm.publish_ok("q", b"x")
    assert lm.ack("q", "999999999").status_code == 204
    assert lm.size("q") == 1
    assert lm.consume_ok("q")["job_id"] == job_id


def test_ack_of_a_ready_job_deletes_it(lm: Lmstfy) -> None:
    job_id = lm.publish_ok("q", b"x")
    assert lm.ack("q", job_id).status_code == 204
    assert lm.size("q") == 0
    assert_no_job(lm.consume("q"))


# -- peek -----------------------------------------------------------------------------


def test_peek_shows_the_next_job_without_consuming_it(lm: Lmstfy) -> None:
    first = lm.publish_ok("q", b"first", ttl=10, tries=2)
    lm.publish_ok("q", b"second")
    peeked = lm.peek("q")
    assert peeked.status_code == 200
    job = peeked.json()
    assert set(job) == JOB_KEYS  # no "msg": that is consume's alone
    assert (job["namespace"], job["queue"], job["job_id"]) == (lm.namespace, "q", first)
    assert (job["data"], job["ttl"], job["remain_tries"]) == (b64(b"first"), 10, 2)
    assert job["attributes"] is None
    assert lm.size("q") == 2
    assert lm.consume_ok("q")["job_id"] == first


def test_peek_of_an_empty_queue_is_404(lm: Lmstfy) -> None:
    assert_error(lm.peek("q"), 404, "the queue is empty")


def test_peek_of_a_queue_with_only_a_delayed_job_is_404(lm: Lmstfy) -> None:
    lm.publish_ok("q", b"x", delay=600)
    assert_error(lm.peek("q"), 404, "the queue is empty")


def test_peek_job_by_id(lm: Lmstfy) -> None:
    job_id = lm.publish_ok("q", b"body", headers={"Job-Attr-K": "v"})
    peeked = lm.peek_job("q", job_id)
    assert peeked.status_code == 200
    job = peeked.json()
    assert set(job) == JOB_KEYS
    assert (job["namespace"], job["queue"], job["job_id"]) == (lm.namespace, "q", job_id)
    assert (job["data"], job["remain_tries"], job["attributes"]) == (b64(b"body"), 1, {"k": "v"})
    assert lm.size("q") == 1


def test_peek_job_sees_delayed_and_leased_jobs(lm: Lmstfy) -> None:
    delayed = lm.publish_ok("q", b"x", delay=600)
    assert lm.peek_job("q", delayed).json()["job_id"] == delayed
    leased = lm.publish_ok("q", b"y")
    lm.consume_ok("q", ttr=60)
    assert lm.peek_job("q", leased).json()["job_id"] == leased


def test_peek_of_an_unknown_job_is_404(lm: Lmstfy) -> None:
    unknown = ["0", "99999999999", "9" * 26, "abc", "-1", "01ARZ3NDEKTSV4RRFFQ69G5FAV"]
    each(unknown, lambda job_id: assert_error(lm.peek_job("q", job_id), 404, "job not found"))


# -- size and destroy -----------------------------------------------------------------


def test_size_counts_ready_jobs_only(lm: Lmstfy) -> None:
    assert lm.size("q") == 0
    for _ in range(3):
        lm.publish_ok("q", b"ready")
    lm.publish_ok("q", b"delayed", delay=600)
    lm.consume_ok("q", ttr=60)
    assert lm.size("q") == 2


def test_size_answers_the_documented_object(lm: Lmstfy) -> None:
    lm.publish_ok("q", b"x")
    answer = lm.request("GET", lm.path("q", "size"), token=None)
    assert (answer.status_code, answer.json()) == (
        200,
        {"namespace": lm.namespace, "queue": "q", "size": 1},
    )


def test_destroy_empties_the_queue_and_only_that_queue(lm: Lmstfy) -> None:
    for _ in range(3):
        lm.publish_ok("q", b"x")
    kept = lm.publish_ok("other", b"y")
    destroyed = lm.destroy("q")
    assert (destroyed.status_code, destroyed.content) == (204, b"")
    assert lm.size("q") == 0
    assert_no_job(lm.consume("q"))
    assert_error(lm.peek("q"), 404, "the queue is empty")
    assert lm.consume_ok("other")["job_id"] == kept


def test_destroy_of_an_empty_queue_is_204(lm: Lmstfy) -> None:
    assert lm.destroy("never-used").status_code == 204


def test_a_queue_is_usable_after_destroy(lm: Lmstfy) -> None:
    lm.publish_ok("q", b"x")
    lm.destroy("q")
    job_id = lm.publish_ok("q", b"y")
    assert lm.consume_ok("q")["job_id"] == job_id
