"""Hundreds of blocking waits at once, on a server of this module's own.

lmstfy's clients assume a blocking consume answers at its timeout (never before it),
and they wait in hundreds. Each wait here is measured by its client, from sending the
request to the answer: never before its timeout; a job published meanwhile reaches the
consumer waiting for it (a 200 with the job, not the 404 of its timeout); and every
wait is answered while the database refuses every write, the lock held until the last
answer is in. How soon after its timeout an answer comes, or after its publish a job,
is a speed, not asserted: a busy machine makes any bound on it fail now and then.

Each waiter has a client (a connection) of its own, opened beforehand: one connection
pool serving hundreds of requests costs httpx itself up to a second or two to hand out
the answers, which would be measured as the server's lateness.
"""

from __future__ import annotations

import asyncio
import sqlite3
import ssl
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import psycopg

import ferryq
from tests.server.conftest import ALSO_POOLED
from tests.server.harness import HTTP_TIMEOUT, NO_JOB, Lmstfy

TIMEOUT = 3  # seconds every wait asks for
CONSUMERS, RESULT_WAITS = 200, 50
#: The wait of a consumer a job is published for: a bound on a hang (it is answered as
#: the job comes), not a speed.
WAIT_FOR_A_JOB = 60


@dataclass
class Answer:
    path: str
    status: int
    body: Any
    sent: float  # time.monotonic() as the request went out
    answered: float  # ... and as its answer was in

    @property
    def took(self) -> float:
        return self.answered - self.sent


@asynccontextmanager
async def clients(
    lm: Lmstfy, count: int, http_timeout: float = HTTP_TIMEOUT
) -> AsyncIterator[list[httpx.AsyncClient]]:
    """``count`` clients of the namespace, each with its connection open already."""
    tls = ssl.create_default_context()  # one for all: each would cost tens of ms
    opened = [
        httpx.AsyncClient(base_url=lm.server.api, headers={"X-Token": lm.token}, verify=tls,
                          timeout=http_timeout)
        for _ in range(count)
    ]  # fmt: skip
    try:
        await asyncio.gather(*(client.get("/healthz") for client in opened))
        yield opened
    finally:
        await asyncio.gather(*(client.aclose() for client in opened))


async def timed_get(client: httpx.AsyncClient, path: str, **params: str | int) -> Answer:
    sent = time.monotonic()
    response = await client.get(path, params=params)
    answered = time.monotonic()
    body = response.json() if response.headers.get("content-type") == "application/json" else None
    return Answer(path, response.status_code, body, sent, answered)


def early(answers: list[Answer], timeout: float) -> list[str]:
    """The answers that came before ``timeout``."""
    return [f"{a.path}: {a.status} after {a.took:.2f} s" for a in answers if a.took < timeout]


def never_run_jobs(lm: Lmstfy, count: int) -> list[int]:
    """Jobs of a task no worker runs: their results never come."""
    ids = []
    for _ in range(count):
        answer = lm.http.post("/v1/jobs", json={"task": "never.runs"},
                              headers={"X-Token": lm.token})  # fmt: skip
        assert answer.status_code == 201, answer.text
        ids.append(int(answer.json()["id"]))
    return ids


async def test_hundreds_of_waits_are_each_answered_at_their_timeout(lm: Lmstfy) -> None:
    results = [f"/v1/jobs/{job_id}/result" for job_id in never_run_jobs(lm, RESULT_WAITS)]
    consumes = [lm.path(f"empty-{n}") for n in range(CONSUMERS)]
    async with clients(lm, CONSUMERS + RESULT_WAITS) as opened:
        answers = await asyncio.gather(*(
            timed_get(client, path, timeout=TIMEOUT)
            for client, path in zip(opened, consumes + results, strict=True)
        ))  # fmt: skip
    assert {(a.status, str(a.body)) for a in answers[:CONSUMERS]} == {(404, str(NO_JOB))}
    assert {(a.status, a.body["state"]) for a in answers[CONSUMERS:]} == {(202, "ready")}
    too_soon = early(answers, TIMEOUT)
    assert not too_soon, f"{len(too_soon)} of {len(answers)} answers early: {too_soon[:10]}"


@ALSO_POOLED
async def test_jobs_published_during_hundreds_of_waits_reach_their_waiting_consumers(
    lm: Lmstfy,
) -> None:
    # Half the jobs are published through the server, which then knows whom to wake;
    # the other half by another process (this one), which the server only sees in the
    # database. A quarter of the consumers get nothing and are answered at their timeout.
    # Those that get a job wait long enough for any machine to publish it: on a busy one
    # publishing a hundred jobs took longer than a short wait, which then ended first.
    queues = [f"q-{n}" for n in range(CONSUMERS)]
    through_server, elsewhere = queues[: CONSUMERS // 4], queues[CONSUMERS // 4 : CONSUMERS // 2]
    to_publish = set(through_server + elsewhere)

    def _wait_in(queue: str) -> int:
        return WAIT_FOR_A_JOB if queue in to_publish else TIMEOUT

    async with clients(lm, CONSUMERS, http_timeout=WAIT_FOR_A_JOB + HTTP_TIMEOUT) as opened:
        waits = [
            asyncio.ensure_future(timed_get(client, lm.path(queue), timeout=_wait_in(queue)))
            for client, queue in zip(opened, queues, strict=True)
        ]
        await lm_round_trip(lm)  # the consumes are in the server's hands by now
        published = await publish(lm, through_server, elsewhere)
        answers = dict(zip(queues, await asyncio.gather(*waits), strict=True))
    for queue, job_id in published.items():
        answer = answers[queue]
        assert (answer.status, answer.body["job_id"]) == (200, job_id), answer
    unpublished = [answers[queue] for queue in queues if queue not in published]
    assert {(a.status, str(a.body)) for a in unpublished} == {(404, str(NO_JOB))}
    too_soon = early(unpublished, TIMEOUT)
    assert not too_soon, f"{len(too_soon)} of {len(unpublished)} answers early: {too_soon[:10]}"


async def lm_round_trip(lm: Lmstfy) -> None:
    """One more round trip to the server, after the requests sent so far."""
    assert (await asyncio.to_thread(lm.http.get, "/healthz")).status_code == 200


async def publish(lm: Lmstfy, through_server: list[str], elsewhere: list[str]) -> dict[str, str]:
    """A job in each queue: its id."""
    published: dict[str, str] = {}
    async with httpx.AsyncClient(base_url=lm.server.api, headers={"X-Token": lm.token},
                                 timeout=HTTP_TIMEOUT) as client:  # fmt: skip
        for queue in through_server:
            answer = await client.put(lm.path(queue), content=f"for {queue}".encode())
            assert answer.status_code == 201, answer.text
            published[queue] = answer.json()["job_id"]
    app = ferryq.App(lm.server.url, namespace=lm.namespace)
    try:
        for queue in elsewhere:
            handle = await app.enqueue_async("from.elsewhere", [queue], queue=queue)
            published[queue] = str(handle.id)
    finally:
        await app.aclose()
        app.close()
    return published


async def test_waits_are_answered_at_their_timeout_while_the_database_refuses_writes(
    lm: Lmstfy,
) -> None:
    # Every take blocks until the lock goes: each consume is answered at its timeout all
    # the same. The one whose take went on to lease a job gives it back, uncharged.
    job_id = lm.publish_ok("held", b"taken too late", tries=2)
    timeout = 2
    paths = [lm.path("held")] + [lm.path(f"locked-{n}") for n in range(20)]
    async with clients(lm, len(paths)) as opened:
        # The token is looked up now and cached: no read for it while writes wait.
        assert (await opened[0].get(lm.path("nothing-here"))).status_code == 404
        # The lock goes once every answer is in: a wait that needed the lock to end
        # would never be answered (the client gives up after HTTP_TIMEOUT, failing).
        with writes_locked(lm.server.url):
            answers = await asyncio.gather(*(
                timed_get(client, path, timeout=timeout)
                for client, path in zip(opened, paths, strict=True)
            ))  # fmt: skip
    assert {(a.status, str(a.body)) for a in answers} == {(404, str(NO_JOB))}
    too_soon = early(answers, timeout)
    assert not too_soon, f"{len(too_soon)} of {len(answers)} answers early: {too_soon[:10]}"
    again = lm.consume_ok("held", timeout=5)
    assert (again["job_id"], again["remain_tries"]) == (job_id, 1)


@contextmanager
def writes_locked(url: str) -> Iterator[None]:
    """The server's database refusing writes (reads go on) until the end of the block:
    SQLite's write lock, or PostgreSQL's lock on the jobs table."""
    conn: sqlite3.Connection | psycopg.Connection[Any]
    if url.startswith("sqlite:"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
    else:
        conn = psycopg.connect(url)
        conn.execute("LOCK TABLE ferryq_jobs IN EXCLUSIVE MODE")
    try:
        yield
    finally:
        conn.rollback()  # the lock goes with the transaction
        conn.close()
