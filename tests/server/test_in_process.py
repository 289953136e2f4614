"""lmstfy routes served in this process, for what a test must control and a separate
server process hides: the clock, the size of a dead-letter batch, and the moment a
client goes away. Every other protocol test talks to a real server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest
from starlette.types import ASGIApp, Message

import ferryq
from ferryq import insights
from ferryq.server import lmstfy, tokens
from ferryq.server.app import build_api
from ferryq.server.engine import Engine
from ferryq.store.base import Token, WorkerInfo
from ferryq.worker.maintenance import Maintenance
from tests.conformance.jobs import claim_one, insert
from tests.conftest import FrozenClock

NAMESPACE = "ns"


@dataclass
class Served:
    engine: Engine
    asgi: ASGIApp
    api: httpx.AsyncClient
    token: str
    clock: FrozenClock

    def path(self, queue: str, *rest: str) -> str:
        return "/".join(["/api", NAMESPACE, queue, *rest])

    async def dead_size(self, queue: str) -> int:
        answer = await self.api.get(self.path(queue, "deadletter", "size"))
        assert answer.status_code == 200, answer.text
        return int(answer.json()["size"])

    async def make_dead(self, queue: str, count: int) -> None:
        """``count`` jobs with one try, consumed and let go: dead once their lease is over."""
        for n in range(count):
            published = await self.api.put(self.path(queue), content=f"{n}".encode())
            assert published.status_code == 201, published.text
        consumed = await self.api.get(self.path(queue), params={"count": count, "ttr": 1})
        assert consumed.status_code == 200, consumed.text
        self.clock.advance(2)
        await Maintenance(self.engine.ops.store, "test").tick(self.clock())
        assert await self.dead_size(queue) == count


@pytest.fixture
async def served(backend_url: str, clock: FrozenClock) -> AsyncIterator[Served]:
    app = ferryq.App(backend_url, clock=clock)
    engine = Engine(app, maintenance=False)
    await engine.start()
    secret = tokens.generate()
    record = Token(NAMESPACE, tokens.digest(secret), "tests", tokens.hint(secret), clock())
    assert await engine.ops.store.token_create(record)
    asgi = build_api(engine)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=asgi),
        base_url="http://ferryq",
        headers={"X-Token": secret},
    ) as api:
        yield Served(engine, asgi, api, secret, clock)
    engine.close()
    await engine.stop()
    app.close()


async def test_respawn_and_delete_work_through_the_dead_letter_in_batches(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A limit is taken whole, as lmstfy takes it; the server bounds each statement.
    monkeypatch.setattr(lmstfy, "DEAD_BATCH", 2)
    await served.make_dead("q", 5)
    respawned = await served.api.put(served.path("q", "deadletter"), params={"limit": 3})
    assert respawned.json() == {"msg": "respawned", "count": 3}
    assert await served.dead_size("q") == 2
    deleted = await served.api.delete(served.path("q", "deadletter"), params={"limit": 4})
    assert deleted.status_code == 204
    assert await served.dead_size("q") == 0
    size = await served.api.get(served.path("q", "size"))
    assert size.json()["size"] == 3


async def test_a_job_taken_for_a_consumer_already_gone_goes_back(served: Served) -> None:
    # The client sent a blocking consume and closed the connection at once; a job was
    # ready, so the take found it before the server could answer.
    published = await served.api.put(served.path("q"), content=b"x", params={"tries": 2})
    job_id = published.json()["job_id"]
    messages: list[Message] = [{"type": "http.request", "body": b"", "more_body": False}]
    answered: list[Message] = []

    async def receive() -> Message:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        answered.append(message)

    path = served.path("q")
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
        "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "",
        "query_string": b"timeout=10&ttr=600", "client": ("127.0.0.1", 1),
        "server": ("ferryq", 80),
        "headers": [(b"host", b"ferryq"), (b"x-token", served.token.encode())],
    }  # fmt: skip
    await served.asgi(scope, receive, send)
    assert answered[0]["status"] == 404  # to nobody
    peeked = await served.api.get(served.path("q", "job", job_id))
    assert peeked.json()["remain_tries"] == 2
    consumed = await served.api.get(served.path("q"))
    assert (consumed.json()["job_id"], consumed.json()["remain_tries"]) == (job_id, 1)


async def test_explain_counts_on_the_servers_own_maintenance(
    backend_url: str, clock: FrozenClock
) -> None:
    # No worker runs, but the server takes part in maintenance: a lease its holder
    # abandoned is recovered all the same, and explain says so.
    app = ferryq.App(backend_url, clock=clock)
    engine = Engine(app)
    await engine.start()
    try:
        job_id = await insert(engine.ops.store, clock.now)
        assert (await claim_one(engine.ops.store, clock.now)).id == job_id  # by worker w1
        await engine.ops.store.worker_beat(WorkerInfo("w1", "default", ["default"], "host", 1, 1,
                                                  clock.now, clock.now))  # fmt: skip
        clock.advance(20)
        explained = await insights.explain(engine.ops.store, job_id, clock.now)
    finally:
        engine.close()
        await engine.stop()
        app.close()
    assert "worker w1 last heartbeat 20 s ago; it has probably stopped" in explained.message
    assert "; the maintenance leader will recover the lease after " in explained.message
    assert explained.data["live_workers"] == 0 and explained.data["maintained"] is True
