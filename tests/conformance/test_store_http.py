"""API tokens through the Store, on every backend."""

from __future__ import annotations

from ferryq.store import Store
from ferryq.store.base import Token
from tests.conformance.jobs import NS
from tests.conftest import START

NOW = START


# -- tokens ------------------------------------------------------------------------


def _token(
    digest: str,
    namespace: str = NS,
    created_at: float = NOW,
    limit_read: int | None = None,
    limit_write: int | None = None,
    limit_interval: float | None = None,
) -> Token:
    return Token(namespace, digest, f"token {digest}", digest[:4], created_at, limit_read,
                 limit_write, limit_interval)  # fmt: skip


async def test_tokens_are_created_once_read_and_listed_oldest_first(store: Store) -> None:
    assert await store.token_create(_token("d2", created_at=NOW + 1))
    assert await store.token_create(_token("d1", created_at=NOW))
    assert await store.token_create(_token("d3", "other", NOW - 1))
    assert not await store.token_create(_token("d1", "other", NOW + 5))  # digest taken
    assert await store.token_get("d1") == _token("d1", created_at=NOW)
    assert await store.token_get("nope") is None
    assert [t.digest for t in await store.token_list(NS)] == ["d1", "d2"]
    assert [t.digest for t in await store.token_list("other")] == ["d3"]
    assert [t.digest for t in await store.token_list(None)] == ["d3", "d1", "d2"]
    assert await store.token_list("nobody") == []


async def test_a_token_is_deleted_only_within_its_namespace(store: Store) -> None:
    await store.token_create(_token("d1"))
    assert not await store.token_delete("other", "d1")
    assert await store.token_get("d1") is not None
    assert await store.token_delete(NS, "d1")
    assert await store.token_get("d1") is None
    assert not await store.token_delete(NS, "d1")


async def test_token_limits_are_set_changed_and_cleared(store: Store) -> None:
    await store.token_create(_token("d1", limit_read=5, limit_write=6, limit_interval=7.0))
    assert await store.token_get("d1") == _token(
        "d1", limit_read=5, limit_write=6, limit_interval=7.0
    )
    assert await store.token_limit_set("d1", 100, None, 1.5)
    token = await store.token_get("d1")
    assert token is not None
    assert (token.limit_read, token.limit_write, token.limit_interval) == (100, None, 1.5)
    assert await store.token_limit_set("d1", None, None, None)
    assert await store.token_get("d1") == _token("d1")
    assert not await store.token_limit_set("missing", 1, 1, 1.0)
