"""One real ``ferryq server`` per test module and backend; a fresh namespace per test.

Sharing the server keeps the suite fast; every test still starts from nothing, because
it works in a namespace (with its own token) that no other test touches.

A test that proves its feature behind a transaction pooler too takes ``ALSO_POOLED``:
it runs on a third server, on PostgreSQL through the session's PgBouncer in
transaction mode (``?pooler=transaction``, no direct URL: its waits poll), whose
database it migrates itself, through the pooler; ``ALSO_DIRECT`` adds a fourth, the
same with a direct URL (``--direct-url``) for LISTEN.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import BACKENDS, POOLED, POOLED_DIRECT, pooled_url
from tests.pg import PgCluster, fresh_database
from tests.pgbouncer import Bouncer
from tests.server.harness import (
    Lmstfy,
    ServerProcess,
    new_namespace,
    running_server,
)

ALSO_POOLED = pytest.mark.parametrize("server_db", [*BACKENDS, POOLED], indirect=True,
                                      scope="module")  # fmt: skip
ALSO_DIRECT = pytest.mark.parametrize("server_db", [*BACKENDS, POOLED, POOLED_DIRECT],
                                      indirect=True, scope="module")  # fmt: skip
#: The direct URL of each pooled server database that has one.
_direct_urls: dict[str, str] = {}


@pytest.fixture(scope="module", params=BACKENDS)
def server_db(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """An empty database for the module's server: a SQLite file or a PostgreSQL database."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path_factory.mktemp('server-db')}/ferryq.db"
        return
    cluster: PgCluster = request.getfixturevalue("pg_cluster")
    if request.param == "postgres":
        with fresh_database(cluster) as url:
            yield url
        return
    bouncer: Bouncer = request.getfixturevalue("pgbouncer")
    with fresh_database(cluster, migrated=False) as url:
        pooled = pooled_url(bouncer.through(url))
        if request.param == POOLED_DIRECT:
            _direct_urls[pooled] = url
        yield pooled
        _direct_urls.pop(pooled, None)


@pytest.fixture(scope="module")
def server(server_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The module's server; on teardown SIGTERM must stop it with exit code 0."""
    direct = _direct_urls.get(server_db)
    options = [] if direct is None else ["--direct-url", direct]
    logs = tmp_path_factory.mktemp("server-logs")
    with running_server(server_db, logs, options=options) as running:
        yield running


@pytest.fixture
def lm(server: ServerProcess) -> Iterator[Lmstfy]:
    """A namespace of this test's own, with a token, on the module's server."""
    namespace = new_namespace()
    client = Lmstfy(server, namespace, server.create_token(namespace))
    yield client
    client.close()
