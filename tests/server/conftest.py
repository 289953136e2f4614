"""One real ``ferryq server`` per test module and backend; a fresh namespace per test.

Sharing the server keeps the suite fast; every test still starts from nothing, because
it works in a namespace (with its own token) that no other test touches.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import BACKENDS
from tests.pg import PgCluster, fresh_database
from tests.server.harness import Lmstfy, ServerProcess, new_namespace, running_server


@pytest.fixture(scope="module", params=BACKENDS)
def server_db(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """An empty database for the module's server: a SQLite file or a PostgreSQL database."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path_factory.mktemp('server-db')}/ferryq.db"
        return
    cluster: PgCluster = request.getfixturevalue("pg_cluster")
    with fresh_database(cluster) as url:
        yield url


@pytest.fixture(scope="module")
def server(server_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The module's server; on teardown SIGTERM must stop it with exit code 0."""
    with running_server(server_db, tmp_path_factory.mktemp("server-logs")) as running:
        yield running


@pytest.fixture
def lm(server: ServerProcess) -> Iterator[Lmstfy]:
    """A namespace of this test's own, with a token, on the module's server."""
    namespace = new_namespace()
    client = Lmstfy(server, namespace, server.create_token(namespace))
    yield client
    client.close()
