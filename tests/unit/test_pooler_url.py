"""``?pooler=`` and ``?connections=`` in a PostgreSQL URL (ferryq.store.postgres.pooler):
parsed, stripped before the URL reaches asyncpg, refused when unknown; the budget of
connections as a store spends it (ferryq.store.postgres.connection.Budget)."""

from __future__ import annotations

import pytest

from ferryq.errors import StoreError
from ferryq.store.postgres.connection import DEFAULT_CONNECTIONS, Budget, Database
from ferryq.store.postgres.pooler import assignments, pooling_of

BASE = "postgresql://u:secret@db.example:6432/app"


def test_a_url_without_pooler_is_left_as_it_is() -> None:
    url = f"{BASE}?sslmode=require&idle_in_transaction_session_timeout=30s"
    pooling = pooling_of(url)
    assert (pooling.mode, pooling.url, pooling.settings) == ("none", url, {})
    assert not pooling.pooled and not pooling.transaction


def test_pooler_none_is_only_stripped() -> None:
    pooling = pooling_of(f"{BASE}?search_path=app&pooler=none")
    assert (pooling.mode, pooling.url, pooling.settings) == ("none", f"{BASE}?search_path=app", {})


@pytest.mark.parametrize("mode", ["transaction", "session", "Transaction"])
def test_behind_a_pooler_the_settings_leave_the_url(mode: str) -> None:
    url = f"{BASE}?pooler={mode}&sslmode=require&idle_in_transaction_session_timeout=30s"
    pooling = pooling_of(url)
    assert pooling.mode == mode.lower() and pooling.pooled
    assert pooling.url == f"{BASE}?sslmode=require"  # what asyncpg reads itself stays
    assert pooling.settings == {"idle_in_transaction_session_timeout": "30s"}


@pytest.mark.parametrize("value", ["transactions", "statement", "", "yes"])
def test_an_unknown_pooler_is_refused_naming_the_allowed_values(value: str) -> None:
    with pytest.raises(StoreError) as refused:
        pooling_of(f"{BASE}?pooler={value}")
    message = str(refused.value)
    assert "pooler=transaction" in message and "pooler=session" in message
    assert "pooler=none" in message and "secret" not in message  # no password shown


def test_two_different_pooler_values_are_refused() -> None:
    with pytest.raises(StoreError, match="unknown pooler"):
        pooling_of(f"{BASE}?pooler=transaction&pooler=session")


def test_a_setting_name_that_is_not_one_is_refused() -> None:
    with pytest.raises(StoreError, match="not a server setting"):
        pooling_of(f"{BASE}?pooler=transaction&a%3Bb=1")


def test_settings_become_set_local_with_their_quotes_doubled() -> None:
    assert assignments({"a": "1", "search_path": "o'x"}) == (
        "; SET LOCAL a = '1'; SET LOCAL search_path = 'o''x'"
    )


def test_a_transaction_pooler_begins_every_transaction_with_the_settings() -> None:
    db = Database(f"{BASE}?pooler=transaction&lock_timeout=1s")
    assert db.url == BASE and db.pooling.transaction
    assert db.begin == (
        "BEGIN; SET LOCAL idle_in_transaction_session_timeout = '10s'"
        "; SET LOCAL lock_timeout = '1s'"
    )
    assert Database(BASE).begin is None  # the default: nothing changes


def test_the_store_refuses_an_unknown_pooler_when_made() -> None:
    from ferryq.store import open_store

    with pytest.raises(StoreError, match="unknown pooler=bouncer"):
        open_store(f"{BASE}?pooler=bouncer")


def test_connections_is_ferryqs_own_and_never_reaches_the_server() -> None:
    pooling = pooling_of(f"{BASE}?connections=3&sslmode=disable")
    assert pooling.connections == 3 and pooling.mode == "none"
    assert pooling.url == f"{BASE}?sslmode=disable"
    assert pooling_of(BASE).connections is None


@pytest.mark.parametrize("given", ["three", "", "-1", "2.5", "3&connections=4"])
def test_connections_that_is_not_one_whole_number_is_refused(given: str) -> None:
    with pytest.raises(StoreError, match="give one whole number"):
        pooling_of(f"{BASE}?connections={given}")


def test_a_budget_gives_one_to_the_session_one_to_enqueues_and_the_rest_to_the_pool() -> None:
    assert Budget.of(3, session=True) == Budget(pool=1, inserts=1, session=1)
    assert Budget.of(2, session=False) == Budget(pool=1, inserts=1, session=0)
    assert Budget.of(None, session=True).total == DEFAULT_CONNECTIONS
    with pytest.raises(StoreError, match="give connections=3 or more"):
        Budget.of(2, session=True)
    with pytest.raises(StoreError, match="give connections=2 or more"):
        Budget.of(1, session=False)
