"""Publishing over lmstfy's API: single, bulk and republish, with every validation rule.

Each rejected request is also checked to have changed nothing: the queue stays empty.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from tests.server.harness import Lmstfy, MiB, assert_error, assert_no_job, b64, each

UINT32_OVER = str(1 << 32)
UINT16_OVER = str(1 << 16)


def assert_untouched(lm: Lmstfy, queue: str) -> None:
    assert lm.size(queue) == 0
    assert lm.dead_size(queue) == 0
    assert_no_job(lm.consume(queue))


# -- publish ----------------------------------------------------------------------


def test_publish_answers_201_with_a_string_job_id(lm: Lmstfy) -> None:
    published = lm.publish("q", b"hello")
    assert published.status_code == 201
    answer = published.json()
    assert set(answer) == {"msg", "job_id"}
    assert answer["msg"] == "published"
    assert isinstance(answer["job_id"], str) and answer["job_id"]
    assert lm.size("q") == 1


def test_job_ids_are_unique(lm: Lmstfy) -> None:
    ids = [lm.publish_ok("q", b"x") for _ in range(10)]
    assert len(set(ids)) == 10


def test_defaults_are_one_try_and_a_day_to_live(lm: Lmstfy) -> None:
    job_id = lm.publish_ok("q", b"x")
    job = lm.consume_ok("q")
    assert job["job_id"] == job_id
    assert job["remain_tries"] == 0  # tries=1, and this consume used it
    assert job["ttl"] == 86400


def test_delay_ttl_and_tries_are_taken_from_the_query(lm: Lmstfy) -> None:
    lm.publish_ok("q", b"x", ttl=10, tries=3)
    job = lm.consume_ok("q")
    assert (job["ttl"], job["remain_tries"]) == (10, 2)
    lm.publish_ok("later", b"x", delay=600)
    assert lm.size("later") == 0
    assert_no_job(lm.consume("later"))


def test_ttl_zero_means_no_expiry(lm: Lmstfy) -> None:
    lm.publish_ok("q", b"x", ttl=0, delay=30)
    lm.publish_ok("q", b"x", ttl=0)
    assert lm.consume_ok("q")["ttl"] == 0


BAD_DELAYS = ["-1", "", "abc", "1.5", " 1", "0x10", "\u0661", UINT32_OVER]
BAD_TTLS = ["-1", "", "abc", "2.5", UINT32_OVER]
BAD_TRIES = ["-1", "", "abc", "1.0", UINT16_OVER]


def test_an_invalid_delay_ttl_or_tries_is_refused(lm: Lmstfy) -> None:
    cases = (
        [("delay", value, "invalid delay") for value in BAD_DELAYS]
        + [("ttl", value, "invalid ttl") for value in BAD_TTLS]
        + [("tries", value, "invalid tries") for value in BAD_TRIES]
    )

    def check(case: tuple[str, str, str]) -> None:
        name, value, message = case
        assert_error(
            lm.request("PUT", lm.path("q"), params={name: value}, content=b"x"), 400, message
        )

    each(cases, check)
    assert_untouched(lm, "q")


def test_tries_zero_is_refused(lm: Lmstfy) -> None:
    assert_error(lm.publish("q", b"x", tries=0), 400, "tries shouldn't be zero")
    assert_untouched(lm, "q")


def test_the_largest_tries_fits(lm: Lmstfy) -> None:
    lm.publish_ok("q", b"x", tries=65535)
    assert lm.consume_ok("q")["remain_tries"] == 65534


def test_ttl_shorter_than_delay_is_refused(lm: Lmstfy) -> None:
    assert_error(lm.publish("q", b"x", delay=10, ttl=5), 400, "ttl is shorter than delay")
    assert_untouched(lm, "q")


def test_ttl_equal_to_delay_or_zero_with_a_delay_is_accepted(lm: Lmstfy) -> None:
    lm.publish_ok("q", b"x", delay=10, ttl=10)
    lm.publish_ok("q", b"x", delay=10, ttl=0)


def test_a_body_of_exactly_one_mib_is_accepted(lm: Lmstfy) -> None:
    body = bytes(range(256)) * (MiB // 256)
    lm.publish_ok("q", body)
    assert lm.consume_ok("q")["data"] == b64(body)


def test_a_body_over_one_mib_is_413(lm: Lmstfy) -> None:
    assert_error(lm.publish("q", b"x" * (MiB + 1)), 413, "body too large")
    assert_untouched(lm, "q")


def test_the_body_is_never_parsed_whatever_its_content_type(lm: Lmstfy) -> None:
    bodies = {
        "application/x-www-form-urlencoded": b"a=1&b=2",
        "application/json": b"{not json",
        "multipart/form-data; boundary=x": b"--x\r\nnot really\r\n--x--",
        "text/plain; charset=utf-8": b"\xff\xfe",
    }
    for content_type, body in bodies.items():
        job_id = lm.publish_ok("q", body, headers={"Content-Type": content_type})
        assert lm.consume_ok("q")["job_id"] == job_id
        assert lm.peek_job("q", job_id).json()["data"] == b64(body), content_type


def test_a_chunked_body_is_taken_whole_and_held_to_the_same_limit(lm: Lmstfy) -> None:
    def chunks(total: int) -> Iterator[bytes]:
        for start in range(0, total, 65536):
            yield b"c" * min(65536, total - start)

    headers = {"X-Token": lm.token}
    published = lm.http.put(lm.path("q"), content=chunks(200_000), headers=headers)
    assert published.status_code == 201, published.text
    assert lm.consume_ok("q")["data"] == b64(b"c" * 200_000)
    too_large = lm.http.put(lm.path("q"), content=chunks(MiB + 1), headers=headers)
    assert_error(too_large, 413, "body too large")
    assert_untouched(lm, "q")


# -- names ------------------------------------------------------------------------


def test_names_of_255_characters_are_accepted(lm: Lmstfy) -> None:
    queue = "q" * 255
    lm.publish_ok(queue, b"x")
    assert lm.consume_ok(queue)["queue"] == queue


def test_a_queue_name_over_255_characters_is_refused(lm: Lmstfy) -> None:
    assert_error(lm.publish("q" * 256, b"x"), 400, "namespace or queue name too long")


def test_a_namespace_name_over_255_characters_is_refused(lm: Lmstfy) -> None:
    published = lm.request("PUT", f"/api/{'n' * 256}/q", content=b"x")
    assert_error(published, 400, "namespace or queue name too long")


def test_a_queue_name_with_forbidden_characters_is_refused(lm: Lmstfy) -> None:
    def check(queue: str) -> None:
        published = lm.publish(queue, b"x")
        assert_error(published, 400, "queue name contains forbidden characters")

    each(["a.b", "a b", "a$b", "\u00e4", "a+b", "_q", "_"], check)


def test_queue_names_may_hold_dashes_underscores_and_digits(lm: Lmstfy) -> None:
    for queue in ("A-b_9", "q_", "-q", "0"):
        lm.publish_ok(queue, b"x")
        assert lm.size(queue) == 1


def test_a_namespace_name_with_forbidden_characters_is_refused(lm: Lmstfy) -> None:
    # The names are checked before the token: no namespace like this can have one.
    def check(namespace: str) -> None:
        published = lm.request("PUT", f"/api/{namespace}/q", content=b"x")
        assert_error(published, 400, "namespace name contains forbidden characters")

    each(["a.b", "a b", "a$b", "\u00e4"], check)


# -- attributes and versions ------------------------------------------------------


def test_job_attr_headers_become_attributes_with_lower_cased_names(lm: Lmstfy) -> None:
    headers = {"Job-Attr-Color": "Blue", "job-attr-SIZE": "XL", "JOB-ATTR-tenant-id": "t-42"}
    job_id = lm.publish_ok("q", b"x", headers=headers)
    expected = {"color": "Blue", "size": "XL", "tenant-id": "t-42"}
    assert lm.peek_job("q", job_id).json()["attributes"] == expected
    assert lm.peek("q").json()["attributes"] == expected
    assert lm.consume_ok("q")["attributes"] == expected


def test_a_job_without_attributes_has_null_attributes(lm: Lmstfy) -> None:
    job_id = lm.publish_ok("q", b"x", headers={"X-Other": "not an attribute"})
    assert lm.peek_job("q", job_id).json()["attributes"] is None
    assert lm.consume_ok("q")["attributes"] is None


def test_attribute_names_are_cut_to_32_and_values_to_128_characters(lm: Lmstfy) -> None:
    name = "Abcdefghij" * 4  # 40 characters
    lm.publish_ok("q", b"x", headers={f"Job-Attr-{name}": "v" * 200})
    assert lm.consume_ok("q")["attributes"] == {name.lower()[:32]: "v" * 128}


def test_attribute_values_are_the_utf8_the_client_sent(lm: Lmstfy) -> None:
    # Bytes that are not UTF-8 become U+FFFD one by one, as Go's JSON encoder writes them.
    sent = {
        b"Job-Attr-City": "Z\u00fcrich \u65e5\u672c \u2713".encode(),
        b"Job-Attr-Long": ("\u00e9" * 200).encode(),
        b"Job-Attr-Bad": b"a\xffb\xe2\x82",
    }
    headers = {b"X-Token": lm.token.encode(), **sent}
    published = lm.http.put(lm.path("q"), content=b"x", headers=headers)
    assert published.status_code == 201, published.text
    assert lm.consume_ok("q")["attributes"] == {
        "city": "Z\u00fcrich \u65e5\u672c \u2713",
        "long": "\u00e9" * 128,
        "bad": "a\ufffdb\ufffd\ufffd",
    }


def test_sixteen_attributes_are_accepted(lm: Lmstfy) -> None:
    headers = {f"Job-Attr-K{n}": str(n) for n in range(16)}
    lm.publish_ok("q", b"x", headers=headers)
    assert lm.consume_ok("q")["attributes"] == {f"k{n}": str(n) for n in range(16)}


def test_more_than_sixteen_attributes_are_refused(lm: Lmstfy) -> None:
    headers = {f"Job-Attr-K{n}": str(n) for n in range(17)}
    published = lm.publish("q", b"x", headers=headers)
    assert_error(published, 400, "too many attributes, cannot exceed 16")
    assert_untouched(lm, "q")


def test_enable_job_version_is_accepted_in_any_case(lm: Lmstfy) -> None:
    def check(value: str) -> None:
        job_id = lm.publish_ok("q", b"versioned", headers={"Enable-Job-Version": value})
        job = lm.consume_ok("q")
        assert (job["job_id"], job["data"]) == (job_id, b64(b"versioned"))
        assert lm.ack("q", job_id).status_code == 204
        assert_no_job(lm.consume("q"))

    each(["YES", "yes", "Yes"], check)


# -- bulk -------------------------------------------------------------------------


def test_bulk_publishes_each_element_as_its_compact_json_text(lm: Lmstfy) -> None:
    body = b'[ {"a": 1, "b": [1, 2]},\n  {"c": "x"} ]'
    published = lm.bulk("q", body)
    assert published.status_code == 201, published.text
    answer = published.json()
    assert set(answer) == {"msg", "job_ids"} and answer["msg"] == "published"
    ids = answer["job_ids"]
    assert len(ids) == 2 and len(set(ids)) == 2 and all(isinstance(i, str) for i in ids)
    jobs = lm.consume("q", count=2).json()
    assert [job["job_id"] for job in jobs] == ids
    assert [job["data"] for job in jobs] == [b64(b'{"a":1,"b":[1,2]}'), b64(b'{"c":"x"}')]


def test_bulk_takes_delay_ttl_and_tries_from_the_query(lm: Lmstfy) -> None:
    assert lm.bulk("q", b'[{"n":1}]', ttl=10, tries=3).status_code == 201
    job = lm.consume_ok("q")
    assert (job["ttl"], job["remain_tries"]) == (10, 2)
    assert lm.bulk("later", b'[{"n":1},{"n":2}]', delay=600).status_code == 201
    assert lm.size("later") == 0


def test_bulk_of_64_is_accepted(lm: Lmstfy) -> None:
    body = json.dumps([{"n": n} for n in range(64)]).encode()
    published = lm.bulk("q", body)
    assert published.status_code == 201, published.text
    assert len(set(published.json()["job_ids"])) == 64
    assert lm.size("q") == 64


def test_bulk_over_64_is_refused(lm: Lmstfy) -> None:
    body = json.dumps([{"n": n} for n in range(65)]).encode()
    assert_error(lm.bulk("q", body), 400, "too many jobs")
    assert_untouched(lm, "q")


def test_an_empty_bulk_is_refused(lm: Lmstfy) -> None:
    assert_error(lm.bulk("q", b"[]"), 400, "no jobs")
    assert_untouched(lm, "q")


def test_bulk_that_is_not_an_array_is_refused(lm: Lmstfy) -> None:
    def check(body: bytes) -> None:
        refused = lm.bulk("q", body)
        assert_error(refused, 400, "request body should be an array of objects")

    each([b'{"a":1}', b'"text"', b"12", b"[1,", b"", b"not json", b"\xff"], check)
    assert_untouched(lm, "q")


def test_bulk_nested_too_deeply_to_parse_is_refused(lm: Lmstfy) -> None:
    def check(body: bytes) -> None:
        refused = lm.bulk("q", body)
        assert_error(refused, 400, "request body should be an array of objects")

    deep = 100_000
    each([b"[" * deep + b"]" * deep, b'[{"a":' * deep + b"1" + b"}]" * deep], check)
    assert_untouched(lm, "q")


def test_bulk_refuses_non_finite_numbers_and_text_not_in_utf8(lm: Lmstfy) -> None:
    # Non-finite numbers are not JSON; JSON text is UTF-8 without a byte order mark
    # (ferryq holds the whole body to UTF-8, strings included).
    array = '[{"a":1},"é"]'

    def check(body: bytes) -> None:
        refused = lm.bulk("q", body)
        assert_error(refused, 400, "request body should be an array of objects")

    bodies = [b"[NaN]", b"[Infinity, -Infinity]", b'[{"a":NaN}]', b"[1,-Infinity]",
              b"\xef\xbb\xbf" + array.encode(), b'["\xff"]', b'[{"k":"\xc3"}]']  # fmt: skip
    bodies += [array.encode(codec) for codec in ("utf-16", "utf-16-le", "utf-16-be", "utf-32")]
    each(bodies, check)
    assert_untouched(lm, "q")


def test_bulk_with_an_element_over_one_mib_is_413_and_publishes_none(lm: Lmstfy) -> None:
    big = json.dumps({"a": "x" * MiB})
    body = f'[{{"small":1}},{big}]'.encode()
    assert_error(lm.bulk("q", body), 413, "job too large")
    assert_untouched(lm, "q")


def test_bulk_validates_the_query_like_publish(lm: Lmstfy) -> None:
    cases: list[tuple[dict[str, str], str]] = [
        ({"delay": "-1"}, "invalid delay"),
        ({"ttl": "x"}, "invalid ttl"),
        ({"tries": UINT16_OVER}, "invalid tries"),
        ({"tries": "0"}, "tries shouldn't be zero"),
        ({"delay": "10", "ttl": "5"}, "ttl is shorter than delay"),
    ]

    def check(case: tuple[dict[str, str], str]) -> None:
        params, message = case
        assert_error(lm.bulk("q", b'[{"n":1}]', **params), 400, message)

    each(cases, check)
    assert_untouched(lm, "q")


# -- republish --------------------------------------------------------------------


def test_republish_drops_the_old_job_and_publishes_a_new_one(lm: Lmstfy) -> None:
    old = lm.publish_ok("q", b"old")
    republished = lm.republish("q", old, b"new", tries=2)
    assert republished.status_code == 201, republished.text
    answer = republished.json()
    assert answer["msg"] == "published"
    new = answer["job_id"]
    assert isinstance(new, str) and new != old
    assert_error(lm.peek_job("q", old), 404, "job not found")
    assert lm.size("q") == 1
    job = lm.consume_ok("q")
    assert (job["job_id"], job["data"], job["remain_tries"]) == (new, b64(b"new"), 1)


def test_republish_of_a_consumed_job_with_a_delay(lm: Lmstfy) -> None:
    # The way clients retry later: consume, then publish the job again with a delay.
    old = lm.publish_ok("q", b"work")
    assert lm.consume_ok("q")["job_id"] == old
    new = lm.republish("q", old, b"work", delay=600).json()["job_id"]
    assert new != old
    assert_error(lm.peek_job("q", old), 404, "job not found")
    assert lm.peek_job("q", new).status_code == 200
    assert lm.size("q") == 0
    assert_no_job(lm.consume("q"))


def test_republish_of_an_unknown_id_publishes_anyway(lm: Lmstfy) -> None:
    republished = lm.republish("q", "999999999", b"fresh")
    assert republished.status_code == 201, republished.text
    assert lm.consume_ok("q")["job_id"] == republished.json()["job_id"]


def test_a_refused_republish_keeps_the_old_job(lm: Lmstfy) -> None:
    cases: list[tuple[dict[str, str], str]] = [
        ({"delay": "abc"}, "invalid delay"),
        ({"ttl": "-1"}, "invalid ttl"),
        ({"tries": "0"}, "tries shouldn't be zero"),
        ({"delay": "10", "ttl": "5"}, "ttl is shorter than delay"),
    ]

    def check(case: tuple[dict[str, str], str]) -> None:
        params, message = case
        queue = f"q{cases.index(case)}"
        old = lm.publish_ok(queue, b"old")
        assert_error(lm.republish(queue, old, b"new", **params), 400, message)
        assert lm.peek_job(queue, old).status_code == 200, "the old job is gone"
        assert lm.size(queue) == 1
        assert lm.consume_ok(queue)["data"] == b64(b"old")

    each(cases, check)


def test_a_republish_over_one_mib_is_413_and_keeps_the_old_job(lm: Lmstfy) -> None:
    old = lm.publish_ok("q", b"old")
    assert_error(lm.republish("q", old, b"x" * (MiB + 1)), 413, "body too large")
    assert lm.peek_job("q", old).json()["data"] == b64(b"old")
