"""Namespace tokens on the queue API: where they are read from, and every refusal."""

from __future__ import annotations

import httpx

from tests.server.harness import Lmstfy, assert_error, assert_no_job, each, new_namespace

# Every queue endpoint that needs a token, as (method, path under the namespace, body).
GUARDED = [
    ("PUT", "q", b"x"),
    ("PUT", "q/bulk", b'[{"a":1}]'),
    ("PUT", "q/job/JOB", b"x"),
    ("GET", "q", None),
    ("GET", "q,other", None),
    ("DELETE", "q/job/JOB", None),
    ("GET", "q/peek", None),
    ("GET", "q/job/JOB", None),
    ("DELETE", "q", None),
    ("GET", "q/deadletter", None),
    ("PUT", "q/deadletter", None),
    ("DELETE", "q/deadletter", None),
]


def bare(token: str) -> str:
    """The token without a pool prefix (the default pool's tokens may carry none)."""
    return token.rpartition(":")[2]


def guarded_call(
    lm: Lmstfy, route: tuple[str, str, bytes | None], job_id: str, token: str | None
) -> httpx.Response:
    method, path, body = route
    full = f"/api/{lm.namespace}/{path.replace('JOB', job_id)}"
    return lm.request(method, full, content=body, token=token)


def test_a_missing_token_is_401_token_not_found(lm: Lmstfy) -> None:
    job_id = lm.publish_ok("q", b"kept")
    each(
        GUARDED,
        lambda route: assert_error(guarded_call(lm, route, job_id, None), 401, "token not found"),
    )
    assert lm.peek_job("q", job_id).json()["remain_tries"] == 1
    assert lm.size("q") == 1


def test_an_unknown_token_is_401_invalid_token(lm: Lmstfy) -> None:
    job_id = lm.publish_ok("q", b"kept")
    wrong = ["no-such-token-at-all-000000", lm.token + "x", f"default:{bare(lm.token)}x"]
    cases = [(route, token) for route in GUARDED for token in wrong]

    def check(case: tuple[tuple[str, str, bytes | None], str]) -> None:
        route, token = case
        assert_error(guarded_call(lm, route, job_id, token), 401, "invalid token")

    each(cases, check)
    assert lm.peek_job("q", job_id).json()["remain_tries"] == 1
    assert lm.size("q") == 1


def test_a_token_of_another_namespace_is_401_invalid_token(lm: Lmstfy) -> None:
    job_id = lm.publish_ok("q", b"kept")
    stranger = lm.server.create_token(new_namespace())
    each(
        GUARDED,
        lambda route: assert_error(guarded_call(lm, route, job_id, stranger), 401, "invalid token"),
    )
    assert lm.peek_job("q", job_id).json()["remain_tries"] == 1
    assert lm.size("q") == 1


def test_the_token_may_come_from_the_query(lm: Lmstfy) -> None:
    published = lm.request(
        "PUT", lm.path("q"), content=b"x", token=None, params={"token": lm.token}
    )
    assert published.status_code == 201, published.text
    assert (
        lm.request("GET", lm.path("q"), token=None, params={"token": lm.token}).status_code == 200
    )


def test_the_x_token_header_wins_over_the_query(lm: Lmstfy) -> None:
    good_header = lm.request(
        "PUT",
        lm.path("q"),
        content=b"x",
        token=lm.token,
        params={"token": "wrong-token-0000000000"},
    )
    assert good_header.status_code == 201, good_header.text
    bad_header = lm.request(
        "PUT", lm.path("q"), content=b"x", token="wrong-token-0000000000",
        params={"token": lm.token},
    )  # fmt: skip
    assert_error(bad_header, 401, "invalid token")
    assert lm.size("q") == 1


def test_an_empty_query_token_is_token_not_found(lm: Lmstfy) -> None:
    answer = lm.request("PUT", lm.path("q"), content=b"x", token=None, params={"token": ""})
    assert_error(answer, 401, "token not found")


def test_the_default_pool_may_be_named(lm: Lmstfy) -> None:
    named = f"default:{bare(lm.token)}"
    assert lm.request("PUT", lm.path("q"), content=b"x", token=named).status_code == 201
    in_query = lm.request("GET", lm.path("q"), token=None, params={"token": named})
    assert in_query.status_code == 200, in_query.text


def test_another_pool_is_404_pool_not_found(lm: Lmstfy) -> None:
    for token in (f"other:{bare(lm.token)}", "nosuchpool:whatever-token-000000"):
        published = lm.request("PUT", lm.path("q"), content=b"x", token=token)
        assert_error(published, 404, "pool not found")
        consumed = lm.request("GET", lm.path("q"), token=None, params={"token": token})
        assert_error(consumed, 404, "pool not found")
    assert lm.size("q") == 0


def test_the_size_endpoints_need_no_token(lm: Lmstfy) -> None:
    lm.publish_ok("q", b"x")
    size = lm.request("GET", lm.path("q", "size"), token=None)
    assert (size.status_code, size.json()) == (
        200,
        {"namespace": lm.namespace, "queue": "q", "size": 1},
    )
    dead = lm.request("GET", lm.path("q", "deadletter", "size"), token=None)
    assert (dead.status_code, dead.json()) == (
        200,
        {"namespace": lm.namespace, "queue": "q", "size": 0},
    )


def test_the_size_of_a_namespace_nobody_has_used_is_zero(lm: Lmstfy) -> None:
    unused = new_namespace()
    for path in (f"/api/{unused}/q/size", f"/api/{unused}/q/deadletter/size"):
        answer = lm.request("GET", path, token=None)
        assert (answer.status_code, answer.json()) == (
            200,
            {"namespace": unused, "queue": "q", "size": 0},
        )


def test_a_namespace_can_hold_several_tokens(lm: Lmstfy) -> None:
    second = lm.server.create_token(lm.namespace, "second")
    assert second != lm.token
    job_id = lm.publish_ok("q", b"x")
    consumed = lm.request("GET", lm.path("q"), token=second)
    assert consumed.status_code == 200 and consumed.json()["job_id"] == job_id
    assert_no_job(lm.consume("q"))
