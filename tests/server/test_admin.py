"""The admin API (tokens, info, version, pools, metrics) and per-token rate limits."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.processes import wait_until
from tests.server.harness import (
    LIMIT_MESSAGE,
    Lmstfy,
    ServerProcess,
    assert_error,
    assert_no_job,
    body_of,
    each,
    new_namespace,
)


@pytest.fixture
def admin(server: ServerProcess) -> Iterator[httpx.Client]:
    with server.admin_client() as client:
        yield client


def descriptions(admin: httpx.Client, namespace: str) -> list[str]:
    """The descriptions of the namespace's tokens, sorted.

    The listing is ``{"tokens": {key: description}}``. Tokens are stored hashed
    (docs/http-api.md, Tokens), so a key cannot always be the token itself; only the
    descriptions and their number are compared.
    """
    listed = admin.get(f"/token/{namespace}")
    assert listed.status_code == 200, listed.text
    assert set(listed.json()) == {"tokens"}
    tokens = listed.json()["tokens"] or {}  # a namespace without tokens: {} or null
    assert isinstance(tokens, dict) and all(isinstance(key, str) and key for key in tokens)
    return sorted(tokens.values())


def publishes(server: ServerProcess, namespace: str, token: str) -> int:
    with server.api_client() as api:
        return api.put(f"/api/{namespace}/q", content=b"x", headers={"X-Token": token}).status_code


# -- tokens -----------------------------------------------------------------------


def test_create_a_token_from_the_query(server: ServerProcess, admin: httpx.Client) -> None:
    namespace = new_namespace()
    created = admin.post(f"/token/{namespace}", params={"description": "from the query"})
    assert created.status_code == 201, created.text
    assert set(created.json()) == {"token"}
    token = created.json()["token"]
    assert isinstance(token, str) and token
    assert descriptions(admin, namespace) == ["from the query"]
    assert publishes(server, namespace, token) == 201


def test_create_a_token_from_a_form_body(server: ServerProcess, admin: httpx.Client) -> None:
    namespace = new_namespace()
    created = admin.post(f"/token/{namespace}", data={"description": "from a form"})
    assert created.status_code == 201, created.text
    token = created.json()["token"]
    assert descriptions(admin, namespace) == ["from a form"]
    assert publishes(server, namespace, token) == 201


def test_tokens_are_unique(admin: httpx.Client) -> None:
    namespace = new_namespace()
    made = {admin.post(f"/token/{namespace}?description=d").json()["token"] for _ in range(5)}
    assert len(made) == 5
    assert descriptions(admin, namespace) == ["d"] * 5


def test_create_a_token_of_ones_own_choosing(server: ServerProcess, admin: httpx.Client) -> None:
    def check(where: str) -> None:
        namespace = new_namespace()
        chosen = f"my-own-token-{uuid.uuid4().hex}"
        fields = {"description": "chosen", "token": chosen}
        created = (
            admin.post(f"/token/{namespace}", params=fields)
            if where == "query"
            else admin.post(f"/token/{namespace}", data=fields)
        )
        assert (created.status_code, created.json()) == (201, {"token": chosen})
        assert descriptions(admin, namespace) == ["chosen"]
        assert publishes(server, namespace, chosen) == 201

    each(["query", "form"], check)


def test_a_chosen_token_of_20_characters_is_enough(admin: httpx.Client) -> None:
    created = admin.post(
        f"/token/{new_namespace()}", params={"description": "d", "token": uuid.uuid4().hex[:20]}
    )
    assert created.status_code == 201, created.text


def test_an_empty_chosen_token_means_one_is_generated(
    server: ServerProcess, admin: httpx.Client
) -> None:
    def check(where: str) -> None:
        namespace = new_namespace()
        fields = {"description": "generated", "token": ""}
        created = (
            admin.post(f"/token/{namespace}", params=fields)
            if where == "query"
            else admin.post(f"/token/{namespace}", data=fields)
        )
        assert created.status_code == 201, created.text
        token = created.json()["token"]
        assert isinstance(token, str) and len(token) >= 20
        assert descriptions(admin, namespace) == ["generated"]
        assert publishes(server, namespace, token) == 201

    each(["query", "form"], check)


def test_a_chosen_token_under_20_characters_is_refused(admin: httpx.Client) -> None:
    namespace = new_namespace()
    created = admin.post(f"/token/{namespace}", params={"description": "d", "token": "t" * 19})
    assert_error(created, 400, "the user token was too short")
    assert descriptions(admin, namespace) == []


def test_a_token_that_exists_is_refused(admin: httpx.Client) -> None:
    namespace = new_namespace()
    fields = {"description": "first", "token": f"a-token-{uuid.uuid4().hex}"}
    assert admin.post(f"/token/{namespace}", params=fields).status_code == 201
    again = admin.post(f"/token/{namespace}", params={**fields, "description": "second"})
    assert_error(again, 400, "the token has already existed")
    assert descriptions(admin, namespace) == ["first"]


def test_a_token_without_description_is_refused(admin: httpx.Client) -> None:
    def check(fields: dict[str, str]) -> None:
        namespace = new_namespace()
        created = admin.post(f"/token/{namespace}", params=fields)
        assert_error(created, 400, "invalid description")
        assert_error(admin.post(f"/token/{namespace}", data=fields), 400, "invalid description")
        assert descriptions(admin, namespace) == []

    each([{}, {"description": ""}, {"token": "t" * 30}], check)


def test_a_token_for_a_forbidden_namespace_name_is_refused(admin: httpx.Client) -> None:
    def check(namespace: str) -> None:
        created = admin.post(f"/token/{namespace}", params={"description": "d"})
        assert_error(created, 400, "namespace name contains forbidden characters")

    each(["a.b", "a$b", "a b", "\u00e4"], check)


def test_nul_characters_are_refused_with_lmstfys_messages(
    server: ServerProcess, admin: httpx.Client
) -> None:
    # PostgreSQL cannot store NUL in text: refused before the store, on both backends.
    namespace = new_namespace()
    token = server.create_token(namespace, "kept")
    chosen = f"a-token-{uuid.uuid4().hex}"
    forbidden = "namespace name contains forbidden characters"
    cases: list[tuple[str, str, dict[str, Any], str]] = [
        ("POST", f"/token/{namespace}", {"params": {"description": "a\x00b"}},
         "invalid description"),
        ("POST", f"/token/{namespace}", {"data": {"description": "a\x00b"}},
         "invalid description"),
        ("POST", f"/token/{namespace}", {"params": {"description": "d", "token": chosen + "\x00"}},
         "invalid token"),
        ("POST", f"/token/{namespace}", {"data": {"description": "d", "token": "\x00" + chosen}},
         "invalid token"),
        # Nor can a token with spaces or control characters travel in a header or path.
        ("POST", f"/token/{namespace}", {"data": {"description": "d", "token": " " * 25}},
         "invalid token"),
        ("POST", f"/token/{namespace}", {"data": {"description": "d", "token": chosen + "\t"}},
         "invalid token"),
        ("POST", f"/token/{namespace}%00", {"params": {"description": "d"}}, forbidden),
        ("GET", f"/token/{namespace}%00", {}, forbidden),
        ("DELETE", f"/token/{namespace}%00/{token}", {}, forbidden),
        ("GET", f"/token/{namespace}%00/{token}/limit", {}, forbidden),
        ("DELETE", f"/token/{namespace}%00/{token}/limit", {}, forbidden),
        ("PUT", f"/token/{namespace}%00/{token}/limit",
         {"json": {"read": 1, "write": 1, "interval": 1}}, forbidden),
    ]  # fmt: skip

    def check(case: tuple[str, str, dict[str, Any], str]) -> None:
        method, path, sent, message = case
        assert_error(admin.request(method, path, **sent), 400, message)

    each(cases, check)
    assert descriptions(admin, namespace) == ["kept"]
    assert publishes(server, namespace, token) == 201


def test_listing_or_deleting_in_a_forbidden_namespace_is_refused(
    server: ServerProcess, admin: httpx.Client
) -> None:
    namespace = new_namespace()
    token = server.create_token(namespace, "kept")
    forbidden = "namespace name contains forbidden characters"

    def check(bad: str) -> None:
        assert_error(admin.get(f"/token/{bad}"), 400, forbidden)
        assert_error(admin.delete(f"/token/{bad}/{token}"), 400, forbidden)

    each(["a.b", "a$b", "a%20b", "\u00e4", "n" * 256], check)
    assert publishes(server, namespace, token) == 201


def test_namespace_names_up_to_255_characters(server: ServerProcess, admin: httpx.Client) -> None:
    longest = new_namespace() + "n" * (255 - len(new_namespace()))
    assert len(longest) == 255
    created = admin.post(f"/token/{longest}", params={"description": "d"})
    assert created.status_code == 201, created.text
    assert publishes(server, longest, created.json()["token"]) == 201
    too_long = admin.post(f"/token/{longest}n", params={"description": "d"})
    assert too_long.status_code == 400, too_long.text


def test_the_default_pool_may_be_named_and_no_other(admin: httpx.Client) -> None:
    namespace = new_namespace()
    named = admin.post(f"/token/{namespace}", params={"description": "d", "pool": "default"})
    assert named.status_code == 201, named.text
    other = admin.post(f"/token/{namespace}", params={"description": "e", "pool": "nosuchpool"})
    assert other.status_code in (400, 404), other.text
    assert descriptions(admin, namespace) == ["d"]


def test_delete_a_token(server: ServerProcess, admin: httpx.Client) -> None:
    namespace = new_namespace()
    kept = server.create_token(namespace, "kept")
    gone = server.create_token(namespace, "gone")
    deleted = admin.delete(f"/token/{namespace}/{gone}")
    assert (deleted.status_code, deleted.content) == (204, b"")
    assert descriptions(admin, namespace) == ["kept"]
    with server.api_client() as api:
        refused = api.put(f"/api/{namespace}/q", content=b"x", headers={"X-Token": gone})
    assert_error(refused, 401, "invalid token")
    assert publishes(server, namespace, kept) == 201


def test_a_token_belongs_to_its_namespace_alone(server: ServerProcess, admin: httpx.Client) -> None:
    first, second = new_namespace(), new_namespace()
    token = server.create_token(first)
    assert descriptions(admin, second) == []
    assert publishes(server, second, token) == 401


# -- info, version, pools, metrics -------------------------------------------------


def test_pools_is_the_default_pool(admin: httpx.Client) -> None:
    pools = admin.get("/pools")
    assert (pools.status_code, pools.json()) == (200, ["default"])


def test_version(admin: httpx.Client) -> None:
    version = admin.get("/version")
    assert version.status_code == 200, version.text
    assert isinstance(version.json()["version"], str) and version.json()["version"]


def test_info_lists_namespaces_with_their_queues(lm: Lmstfy, admin: httpx.Client) -> None:
    lm.publish_ok("info-queue", b"x")
    info = admin.get("/info")
    assert info.status_code == 200, info.text
    text = json.dumps(info.json())
    assert lm.namespace in text and "info-queue" in text


def test_metrics_are_prometheus_text(admin: httpx.Client) -> None:
    metrics = admin.get("/metrics")
    assert metrics.status_code == 200
    assert metrics.headers["content-type"].startswith("text/plain")
    assert "# TYPE " in metrics.text


# -- rate limits -------------------------------------------------------------------


def limit_of(answer: httpx.Response) -> dict[str, Any]:
    """The limit in a GET answer: the object itself, or under "limiter" (lmstfy's POST)."""
    body = answer.json()
    found = body.get("limiter", body) if isinstance(body, dict) else body
    assert isinstance(found, dict), body
    return {key: found[key] for key in ("read", "write", "interval")}


@pytest.fixture
def limited(lm: Lmstfy, admin: httpx.Client) -> Iterator[Lmstfy]:
    """A second token of ``lm``'s namespace, for limits that must not touch ``lm.token``."""
    client = Lmstfy(lm.server, lm.namespace, lm.server.create_token(lm.namespace, "limited"))
    yield client
    client.close()


def set_limit(admin: httpx.Client, who: Lmstfy, read: int, write: int, interval: int) -> None:
    created = admin.post(
        f"/token/{who.namespace}/{who.token}/limit",
        json={"read": read, "write": write, "interval": interval},
    )
    assert created.status_code == 201, created.text


def assert_limited(response: httpx.Response) -> None:
    assert response.status_code == 429, response.text
    body = body_of(response)
    assert set(body) == {"msg"} and body["msg"].endswith(LIMIT_MESSAGE), body


def test_limits_can_be_set_read_changed_and_removed(limited: Lmstfy, admin: httpx.Client) -> None:
    path = f"/token/{limited.namespace}/{limited.token}/limit"
    created = admin.post(path, json={"read": 10, "write": 20, "interval": 30})
    assert created.status_code == 201, created.text
    got = admin.get(path)
    assert got.status_code == 200, got.text
    assert limit_of(got) == {"read": 10, "write": 20, "interval": 30}
    changed = admin.put(path, json={"read": 11, "write": 21, "interval": 31})
    assert changed.status_code == 200, changed.text
    assert limit_of(admin.get(path)) == {"read": 11, "write": 21, "interval": 31}
    removed = admin.delete(path)
    assert removed.status_code == 200, removed.text


def test_publishes_over_the_write_limit_are_429(
    lm: Lmstfy, limited: Lmstfy, admin: httpx.Client
) -> None:
    set_limit(admin, limited, read=1000, write=2, interval=60)
    limited.publish_ok("q", b"1")
    limited.publish_ok("q", b"2")
    assert_limited(limited.publish("q", b"3"))
    assert lm.size("q") == 2
    lm.publish_ok("q", b"another token, another limit")


def test_failed_publishes_do_not_count(limited: Lmstfy, admin: httpx.Client) -> None:
    set_limit(admin, limited, read=1000, write=2, interval=60)
    for _ in range(3):
        assert_error(limited.publish("q", b"x", delay="bad"), 400, "invalid delay")
    limited.publish_ok("q", b"1")
    limited.publish_ok("q", b"2")
    assert_limited(limited.publish("q", b"3"))


def test_consumes_over_the_read_limit_are_429_and_empty_ones_do_not_count(
    lm: Lmstfy, limited: Lmstfy, admin: httpx.Client
) -> None:
    set_limit(admin, limited, read=2, write=1000, interval=60)
    for _ in range(3):
        assert_no_job(limited.consume("q"))
    for n in range(3):
        lm.publish_ok("q", f"{n}".encode())
    limited.consume_ok("q")
    limited.consume_ok("q")
    assert_limited(limited.consume("q"))
    assert lm.size("q") == 1


def test_a_changed_limit_applies_at_once(limited: Lmstfy, admin: httpx.Client) -> None:
    set_limit(admin, limited, read=1000, write=1, interval=60)
    limited.publish_ok("q", b"1")
    assert_limited(limited.publish("q", b"2"))
    path = f"/token/{limited.namespace}/{limited.token}/limit"
    assert admin.put(path, json={"read": 1000, "write": 5, "interval": 60}).status_code == 200
    limited.publish_ok("q", b"3")


def test_a_removed_limit_no_longer_applies(limited: Lmstfy, admin: httpx.Client) -> None:
    set_limit(admin, limited, read=1000, write=1, interval=60)
    limited.publish_ok("q", b"1")
    assert_limited(limited.publish("q", b"2"))
    assert admin.delete(f"/token/{limited.namespace}/{limited.token}/limit").status_code == 200
    for n in range(5):
        limited.publish_ok("q", f"{n}".encode())


def test_the_limit_is_per_interval(limited: Lmstfy, admin: httpx.Client) -> None:
    set_limit(admin, limited, read=1000, write=1, interval=1)
    limited.publish_ok("q", b"1")
    assert_limited(limited.publish("q", b"2"))
    wait_until(
        lambda: limited.publish("q", b"3").status_code == 201,
        within=30,  # a bound on a hang: the limit's interval is 1 s
        interval=0.1,
        what="the next interval",
    )


INVALID_LIMITS = [
    b"not json",
    b"[]",
    b'{"read": 1, "write": 1, "interval": 0}',
    b'{"read": -1, "write": 1, "interval": 10}',
    b'{"read": "x", "write": 1, "interval": 10}',
]


def test_an_invalid_limit_is_refused_and_sets_nothing(limited: Lmstfy, admin: httpx.Client) -> None:
    path = f"/token/{limited.namespace}/{limited.token}/limit"

    def check(body: bytes) -> None:
        answer = admin.post(path, content=body, headers={"Content-Type": "application/json"})
        assert 400 <= answer.status_code < 500, (answer.status_code, answer.text)

    each(INVALID_LIMITS, check)
    for n in range(3):
        limited.publish_ok("q", f"{n}".encode())
