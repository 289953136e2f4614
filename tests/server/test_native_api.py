"""The native JSON API (/v1) of a real ``ferryq server``, on both backends.

Jobs are run by a burst worker in this process (``ferryq.testing.drain``) against the
server's database, or consumed and acknowledged through the lmstfy API; the server
and the worker share nothing but the database.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

import ferryq
from ferryq import testing
from ferryq.store import open_store
from ferryq.store.base import PeriodicEntry
from tests.server.conftest import ALSO_DIRECT, ALSO_POOLED
from tests.server.harness import ServerProcess, http_client, new_namespace

MiB = 1 << 20


class V1:
    """One namespace of the server under test, with its token, speaking /v1."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        self.namespace = new_namespace()
        self.token = server.create_token(self.namespace)
        self.http = http_client(f"{server.api}/v1", headers={"X-Token": self.token}, timeout=30)

    def close(self) -> None:
        self.http.close()

    def enqueue(self, task: str = "noop", args: Any = (), **options: Any) -> int:
        answer = self.http.post("/jobs", json={"task": task, "args": list(args), **options})
        assert answer.status_code == 201, answer.text
        assert answer.json()["created"] is True
        return int(answer.json()["id"])

    def job(self, job_id: int) -> dict[str, Any]:
        answer = self.http.get(f"/jobs/{job_id}")
        assert answer.status_code == 200, answer.text
        found: dict[str, Any] = answer.json()
        return found

    def explain(self, job_id: int) -> dict[str, Any]:
        answer = self.http.get(f"/jobs/{job_id}/explain")
        assert answer.status_code == 200, answer.text
        found: dict[str, Any] = answer.json()
        return found

    def jobs(self, **params: Any) -> dict[str, Any]:
        answer = self.http.get("/jobs", params=params)
        assert answer.status_code == 200, answer.text
        found: dict[str, Any] = answer.json()
        return found

    def ids(self, **params: Any) -> list[int]:
        return [job["id"] for job in self.jobs(limit=1000, **params)["jobs"]]

    def run(self, queues: list[str] | None = None, **handlers: Callable[..., Any]) -> int:
        """Run every due job of these queues with these handlers; attempts finished."""
        app = ferryq.App(self.server.url, namespace=self.namespace)
        for name, handler in handlers.items():
            app.task(name=name)(handler)
        try:
            return testing.drain(app, queues or ["default"]).finished
        finally:
            app.close()


@pytest.fixture
def v1(server: ServerProcess) -> Iterator[V1]:
    client = V1(server)
    yield client
    client.close()


@pytest.fixture
def other(server: ServerProcess) -> Iterator[V1]:
    client = V1(server)
    yield client
    client.close()


def refused(answer: httpx.Response, status: int) -> str:
    assert answer.status_code == status, (answer.status_code, answer.text)
    body = answer.json()
    assert set(body) == {"error"} and isinstance(body["error"], str) and body["error"], body
    message: str = body["error"]
    return message


def add(a: int, b: int) -> int:
    return a + b


def boom() -> None:
    raise RuntimeError("boom")


def noop(*args: Any, **kwargs: Any) -> None:
    return None


# -- tokens and namespaces -------------------------------------------------------------


def test_every_route_needs_a_token_of_some_namespace(v1: V1) -> None:
    job_id = v1.enqueue()
    routes = [
        ("POST", "/jobs"), ("POST", "/jobs/batch"), ("GET", "/jobs"), ("GET", f"/jobs/{job_id}"),
        ("GET", f"/jobs/{job_id}/explain"), ("GET", f"/jobs/{job_id}/result"),
        ("POST", f"/jobs/{job_id}/cancel"), ("POST", f"/jobs/{job_id}/respawn"),
        ("POST", "/dead/respawn"), ("POST", "/dead/purge"), ("GET", "/lanes"),
        ("GET", "/lanes/limits"), ("PUT", "/lanes/limits"), ("DELETE", "/lanes/limits?pattern=a"),
        ("PUT", "/lanes/rates"), ("DELETE", "/lanes/rates?pattern=a"),
        ("GET", "/stats"), ("GET", "/workers"),
    ]  # fmt: skip
    with httpx.Client(base_url=f"{v1.server.api}/v1") as anonymous:
        for method, path in routes:
            # The token is checked first: a malformed body does not get that far.
            missing = anonymous.request(method, path, content=b"{not json")
            assert "token required" in refused(missing, 401), path
            wrong = anonymous.request(method, path, headers={"X-Token": "N" * 26})
            assert refused(wrong, 401) == "invalid token", path
            pooled = anonymous.request(method, path, headers={"X-Token": f"other:{v1.token}"})
            assert refused(pooled, 401) == "invalid token", path
    assert v1.job(job_id)["state"] == "ready", "nothing was changed"


def test_a_bearer_token_works_as_well(v1: V1) -> None:
    job_id = v1.enqueue()
    with httpx.Client(base_url=f"{v1.server.api}/v1") as client:
        answer = client.get(f"/jobs/{job_id}", headers={"Authorization": f"Bearer {v1.token}"})
        assert answer.status_code == 200 and answer.json()["namespace"] == v1.namespace
        basic = client.get(f"/jobs/{job_id}", headers={"Authorization": f"Basic {v1.token}"})
        refused(basic, 401)


def test_another_namespace_sees_nothing_and_changes_nothing(v1: V1, other: V1) -> None:
    ready = v1.enqueue("noop", queue="idle", lane="post:1")
    dead = v1.enqueue("boom", queue="mine", max_tries=1)
    v1.run(["mine"], boom=boom)
    assert v1.job(dead)["state"] == "dead"
    missing = 10**15
    for job_id in (ready, dead):
        for path in ("", "/explain", "/result?timeout=0"):
            theirs, nothing = (
                other.http.get(f"/jobs/{job_id}{path}"),
                other.http.get(f"/jobs/{missing}{path}"),
            )
            assert refused(theirs, 404) == f"no job with id {job_id}"
            assert refused(nothing, 404) == f"no job with id {missing}"
        for action in ("cancel", "respawn"):
            refused(other.http.post(f"/jobs/{job_id}/{action}"), 404)
    assert other.http.post("/dead/respawn", json={"ids": [dead]}).json() == {"respawned": []}
    assert other.http.post("/dead/purge", json={"ids": [dead]}).json() == {"purged": 0}
    assert other.jobs() == {"jobs": [], "next": None}
    assert other.http.get("/stats").json() == {"queues": {}, "workers": [], "periodic": []}
    assert other.http.get("/lanes").json() == {"lanes": []}
    assert v1.job(ready)["state"] == "ready" and v1.job(dead)["state"] == "dead"
    assert [lane["lane"] for lane in v1.http.get("/lanes").json()["lanes"]] == ["post:1"]


def test_enqueues_count_against_the_token_publish_limit(v1: V1) -> None:
    with v1.server.admin_client() as admin:
        limited = admin.post(f"/token/{v1.namespace}/{v1.token}/limit",
                             json={"read": 100, "write": 3, "interval": 3600})  # fmt: skip
    assert limited.status_code == 201, limited.text
    v1.enqueue()
    refused(v1.http.post("/jobs/batch", json={"task": "t", "args": [[1], [2], [3]]}), 429)
    refused(v1.http.post("/jobs", json={"task": "t", "delay": 1, "run_at": 1}), 400)
    v1.enqueue()
    v1.enqueue()  # a refused request used none of the limit
    refused(v1.http.post("/jobs", json={"task": "t"}), 429)
    assert len(v1.ids()) == 3


# -- enqueue ---------------------------------------------------------------------------


@ALSO_POOLED
def test_enqueue_with_every_option(v1: V1) -> None:
    options = {
        "queue": "mail", "lane": "post:42", "priority": 600, "delay": 30, "ttl": 3600,
        "ttr": 90, "max_tries": 5, "retry": -7, "unique_key": "mail:a", "unique_for": 600,
        "stage": "render", "context": {"step": 1, "seen": ["a"]},
    }  # fmt: skip
    job_id = v1.enqueue("send", ["a@example.com"], **options)
    job = v1.job(job_id)
    assert {k: job[k] for k in options if k not in ("delay", "ttl", "retry", "unique_for")} == {
        k: v for k, v in options.items() if k not in ("delay", "ttl", "retry", "unique_for")
    }
    assert job["namespace"] == v1.namespace and job["task"] == "send"
    assert job["args"] == ["a@example.com"]
    assert job["state"] == "scheduled"  # first in its lane, so admitted, and not due
    assert job["run_at"] == pytest.approx(job["created_at"] + 30)
    assert job["order_time"] == pytest.approx(job["run_at"] - 600)
    assert job["expires_at"] == pytest.approx(job["created_at"] + 3600)
    assert job["retry"] == {"kind": "fixed", "seconds": [7.0], "jitter": 0.0}
    assert set(job) == set(ferryq.Job.__slots__)

    at = v1.enqueue("send", run_at=4_000_000_000, retry=300)
    assert v1.job(at)["run_at"] == 4_000_000_000
    assert v1.job(at)["retry"] == {"kind": "exponential", "seconds": [1.0, 300.0], "jitter": 0.0}
    keywords = v1.http.post("/jobs", json={"task": "add", "args": {"a": 1, "b": 2}})
    assert keywords.status_code == 201
    assert v1.job(keywords.json()["id"])["args"] == {"a": 1, "b": 2}
    plain = v1.job(v1.enqueue("noop"))
    assert (plain["queue"], plain["ttr"], plain["max_tries"], plain["args"]) == (
        "default",
        60.0,
        3,
        [],
    )


def test_dedup_returns_the_existing_job_with_200(v1: V1) -> None:
    first = v1.http.post("/jobs", json={"task": "noop", "unique_key": "k"})
    again = v1.http.post("/jobs", json={"task": "noop", "args": [2], "unique_key": "k"})
    assert first.status_code == 201 and first.json()["created"] is True
    assert again.status_code == 200
    assert again.json() == {"id": first.json()["id"], "created": False}
    other_key = v1.http.post("/jobs", json={"task": "noop", "unique_key": "k2"})
    assert other_key.status_code == 201 and other_key.json()["id"] != first.json()["id"]
    batch = v1.http.post("/jobs/batch", json={"task": "noop", "args": [[1]], "unique_key": "k"})
    assert batch.status_code == 200
    assert batch.json() == {"jobs": [{"id": first.json()["id"], "created": False}]}
    assert len(v1.ids()) == 2


def test_a_batch_is_one_job_per_args_in_order(v1: V1) -> None:
    answer = v1.http.post("/jobs/batch", json={
        "task": "add", "args": [[1, 2], {"a": 3, "b": 4}, [5, 6]], "queue": "sums", "lane": "L",
    })  # fmt: skip
    assert answer.status_code == 201, answer.text
    jobs = answer.json()["jobs"]
    ids = [job["id"] for job in jobs]
    assert ids == sorted(ids) and all(job["created"] for job in jobs)
    assert [v1.job(i)["args"] for i in ids] == [[1, 2], {"a": 3, "b": 4}, [5, 6]]
    assert [v1.job(i)["state"] for i in ids] == ["ready", "waiting", "waiting"]
    assert v1.run(["sums"], add=add) == 3
    assert [v1.job(i)["result"] for i in ids] == [3, 7, 11]


BAD_BODIES: list[tuple[int, Any]] = [
    (422, {"args": []}),  # no task
    (422, {"task": ""}),
    (422, {"task": "t", "args": "a string"}),
    (422, {"task": "t", "priorty": 5}),  # a typo is not ignored
    (422, {"task": "t", "namespace": "someone-else"}),
    (422, {"task": "t", "max_tries": 0}),
    (422, {"task": "t", "max_tries": "3"}),
    (422, {"task": "t", "ttr": 0}),
    (422, {"task": "t", "delay": -1}),
    (422, {"task": "t", "priority": 2 * 365 * 86400}),
    (422, {"task": "t", "retry": "fixed"}),
    (422, {"task": "t", "queue": "no spaces"}),
    (422, {"task": "t", "lane": ""}),
    (422, {"task": "t", "lane": "a\x00b"}),
    (422, {"task": "t", "run_at": 1e20}),
    (422, ["task", "t"]),
    (400, {"task": "t", "delay": 1, "run_at": 5}),
    (400, {"task": "t", "unique_for": 60}),
    (400, {"task": "t", "delay": 30, "ttl": 10}),
    (400, {"task": "t", "run_at": 4e9, "ttl": 60}),  # 2096
    (400, {"task": "t", "args": ["\ud800"]}),
    (400, {"task": "t", "context": {"k": "\udfff"}}),
    (400, {"task": "t", "args": ["x" * (MiB + 1)]}),
]


@pytest.mark.parametrize(("status", "body"), BAD_BODIES, ids=lambda value: str(value)[:40])
def test_bad_input_is_refused_and_writes_nothing(v1: V1, status: int, body: Any) -> None:
    content = json.dumps(body).encode()
    answer = v1.http.post("/jobs", content=content, headers={"content-type": "application/json"})
    refused(answer, status)
    if isinstance(body, dict):
        batch = {**body, "args": [body.get("args", [])]} if "task" in body else body
        answer = v1.http.post("/jobs/batch", content=json.dumps(batch).encode(),
                              headers={"content-type": "application/json"})  # fmt: skip
        assert answer.status_code in (400, 413, 422), answer.text
    assert v1.jobs() == {"jobs": [], "next": None}


def test_a_ttl_shorter_than_the_delay_is_refused_as_the_python_api_refuses_it(v1: V1) -> None:
    said = refused(v1.http.post("/jobs", json={"task": "t", "delay": 30, "ttl": 10}), 400)
    assert said == "ttl must be at least delay: the job would expire before it is due " \
        "(got ttl 10, delay 30)"  # fmt: skip
    assert v1.http.post("/jobs", json={"task": "t", "delay": 30, "ttl": 30}).status_code == 201


def test_malformed_or_oversized_bodies_are_refused(v1: V1) -> None:
    post = v1.http.post
    assert "not valid JSON" in refused(post("/jobs", content=b'{"task": "t",', headers={
        "content-type": "application/json"}), 422)  # fmt: skip
    refused(post("/jobs", content=b'{"task": "t", "args": [NaN]}',
                 headers={"content-type": "application/json"}), 400)  # fmt: skip
    refused(post("/jobs", content=b'{"task": "t"}'), 422)  # not declared as JSON
    refused(post("/jobs", content=b"[" * 100_000, headers={"content-type": "application/json"}),
            400)  # fmt: skip
    huge = json.dumps({"task": "t", "args": ["x" * (4 * MiB)]}).encode()
    refused(post("/jobs", content=huge, headers={"content-type": "application/json"}), 413)
    chunked = post("/jobs", content=iter([huge[:MiB], huge[MiB:]]),
                   headers={"content-type": "application/json"})  # fmt: skip
    refused(chunked, 413)
    refused(post("/jobs/batch", json={"task": "t", "args": []}), 422)
    refused(post("/jobs/batch", json={"task": "t", "args": [[]] * 1001}), 422)
    assert v1.jobs() == {"jobs": [], "next": None}


def test_a_json_body_that_is_not_utf8_is_malformed_json(v1: V1) -> None:
    # JSON text is UTF-8 (RFC 8259); json.loads would also guess UTF-16 and UTF-32 from
    # the NUL bytes of their ASCII characters.
    for path, text in (("/jobs", b'{"task":"t"}'), ("/jobs/batch", b'{"task":"t","args":[[]]}')):
        bodies = [text.replace(b'"t"', b'"\xff"'), text.replace(b'"t"', b'"t\xc3"'),
                  text.decode().encode("utf-16-le"), text.decode().encode("utf-32")]  # fmt: skip
        for body in bodies:
            answer = v1.http.post(path, content=body, headers={"content-type": "application/json"})
            assert "the body is not valid JSON" in refused(answer, 422), (path, body)
    assert v1.jobs() == {"jobs": [], "next": None}


@pytest.mark.parametrize(
    "path",
    ["/jobs?limit=0", "/jobs?limit=1001", "/jobs?state=lost", "/jobs?after=0", "/jobs?queue=a b",
     "/jobs?lane=", "/jobs?lane=a&lane=b", "/jobs/0", f"/jobs/{1 << 53}", "/jobs/x/explain",
     "/jobs/1/result?timeout=61", "/jobs/1/result?timeout=nan", "/jobs/1/result?timeout=-1",
     "/lanes?limit=0"],
)  # fmt: skip
def test_bad_parameters_are_refused(v1: V1, path: str) -> None:
    refused(v1.http.get(path), 422)


# -- one job ---------------------------------------------------------------------------


def test_explain_says_why_a_job_is_not_running(v1: V1) -> None:
    def reason(job_id: int) -> str:
        found = v1.explain(job_id)
        assert found["job_id"] == job_id and found["message"].startswith(f"job {job_id}:")
        return str(found["reason"])

    later = v1.enqueue("noop", delay=3600)
    first, second = v1.enqueue("noop", lane="L"), v1.enqueue("noop", lane="L")
    ready = v1.enqueue("noop", queue="nobody")
    assert reason(later) == "scheduled"
    assert reason(first) == "no_worker" and reason(ready) == "no_worker"
    assert reason(second) == "lane_order"
    assert v1.explain(second)["data"]["waiting_for"] == first
    v1.http.put("/lanes/limits", json={"pattern": "wide", "limit": 2})
    a, b, c = (v1.enqueue("noop", lane="wide", delay=3600) for _ in range(3))
    assert [reason(a), reason(b), reason(c)] == ["scheduled", "scheduled", "lane_limit"]
    cancelled = v1.enqueue("noop")
    v1.http.post(f"/jobs/{cancelled}/cancel")
    assert reason(cancelled) == "cancelled"
    v1.http.put("/lanes/limits", json={"pattern": "strict", "limit": 1, "on_dead": "halt"})
    dies, held = v1.enqueue("boom", lane="strict", max_tries=1), v1.enqueue("noop", lane="strict")
    v1.run(boom=boom, noop=noop)
    assert reason(first) == "done" and reason(second) == "done"
    assert reason(dies) == "dead"
    assert v1.explain(dies)["data"]["error"]["message"] == "boom"
    assert reason(held) == "lane_halted"
    assert v1.explain(held)["data"]["halted_by"] == dies


def test_a_job_after_others_waits_for_them_and_shows_its_graph(v1: V1, other: V1) -> None:
    first, second = v1.enqueue("noop"), v1.enqueue("boom", max_tries=1)
    callback = v1.enqueue("noop", after=[first, second], after_failed="run")
    failing = v1.enqueue("noop", after=[second])
    job = v1.job(callback)
    assert job["state"] == "scheduled"
    found = v1.explain(callback)
    assert found["reason"] == "dependencies" and found["data"]["waiting_for"] == [first, second]
    answer = v1.http.get(f"/jobs/{callback}/dependencies")
    assert answer.json() == {
        "after": [{"id": first, "ended": None}, {"id": second, "ended": None}],
        "dependents": [],
    }
    assert v1.run(boom=boom, noop=noop) == 4
    assert v1.job(callback)["state"] == "succeeded" and v1.job(failing)["state"] == "dead"
    answer = v1.http.get(f"/jobs/{second}/dependencies")
    assert answer.json()["dependents"] == [
        {"id": callback, "ended": "dead"}, {"id": failing, "ended": "dead"}
    ]  # fmt: skip
    before = v1.ids()
    message = refused(v1.http.post("/jobs", json={"task": "noop", "after": [first + 10**6]}), 400)
    assert f"no job {first + 10**6}" in message
    assert f"no job {first}" in refused(
        other.http.post("/jobs", json={"task": "noop", "after": [first]}), 400
    )
    for bad in ([0], ["x"], [True], 5):
        refused(v1.http.post("/jobs", json={"task": "noop", "after": bad}), 422)
    refused(v1.http.post("/jobs", json={"task": "noop", "after": [first], "after_failed": "x"}),
            422)  # fmt: skip
    refused(other.http.get(f"/jobs/{first}/dependencies"), 404)
    assert v1.ids() == before


@ALSO_DIRECT
def test_result_waits_for_a_worker(v1: V1) -> None:
    job_id = v1.enqueue("add", [2, 3])
    pending = v1.http.get(f"/jobs/{job_id}/result", params={"timeout": 0})
    assert pending.status_code == 202
    assert pending.json() == {"id": job_id, "state": "ready", "result": None}
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(v1.http.get, f"/jobs/{job_id}/result", params={"timeout": 20})
        assert v1.run(add=add) == 1
        answer = waiting.result()
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"id": job_id, "state": "succeeded", "result": 5}


def test_result_of_a_job_that_did_not_succeed_is_409_with_its_error(v1: V1) -> None:
    dead = v1.enqueue("boom", max_tries=1)
    v1.run(boom=boom)
    answer = v1.http.get(f"/jobs/{dead}/result")
    assert answer.status_code == 409
    body = answer.json()
    assert body["error"] == f"job {dead} is dead: boom"
    assert (body["id"], body["state"]) == (dead, "dead")
    assert body["job_error"]["message"] == "boom" and "RuntimeError" in body["job_error"]["type"]
    cancelled = v1.enqueue("noop")
    v1.http.post(f"/jobs/{cancelled}/cancel")
    answer = v1.http.get(f"/jobs/{cancelled}/result")
    assert answer.status_code == 409 and answer.json()["state"] == "cancelled"


@ALSO_POOLED
def test_result_of_a_job_acknowledged_through_the_lmstfy_api(v1: V1) -> None:
    job_id = v1.enqueue("anything", ["hello"], queue="q1")
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(v1.http.get, f"/jobs/{job_id}/result", params={"timeout": 20})
        lmstfy = httpx.Client(base_url=f"{v1.server.api}/api/{v1.namespace}",
                              headers={"X-Token": v1.token})  # fmt: skip
        with lmstfy:
            consumed = lmstfy.get("/q1", params={"ttr": 30, "timeout": 5})
            assert consumed.status_code == 200 and consumed.json()["job_id"] == str(job_id)
            assert v1.explain(job_id)["reason"] == "running"
            assert lmstfy.delete(f"/q1/job/{job_id}").status_code == 204
        answer = waiting.result()
    assert answer.status_code == 200
    assert answer.json() == {"id": job_id, "state": "succeeded", "result": None}


def test_cancel_and_respawn(v1: V1) -> None:
    job_id = v1.enqueue("noop", ttl=60)
    refused(v1.http.post(f"/jobs/{job_id}/respawn"), 409)
    cancelled = v1.http.post(f"/jobs/{job_id}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
    again = v1.http.post(f"/jobs/{job_id}/cancel")
    assert again.status_code == 200 and again.json()["state"] == "cancelled"
    respawned = v1.http.post(f"/jobs/{job_id}/respawn", params={"ttl": 7200})
    assert respawned.status_code == 200, respawned.text
    job = respawned.json()
    assert job["state"] == "ready" and job["attempts"] == 0
    assert job["expires_at"] == pytest.approx(job["run_at"] + 7200, abs=5)
    v1.run(noop=noop)
    assert "succeeded" in refused(v1.http.post(f"/jobs/{job_id}/cancel"), 409)
    assert "succeeded" in refused(v1.http.post(f"/jobs/{job_id}/respawn"), 409)


def test_cancel_of_a_running_job_asks_its_worker(v1: V1) -> None:
    seen: dict[str, Any] = {}
    job_id = v1.enqueue("watch")

    def watch(ctx: ferryq.Context) -> None:
        seen["workers"] = v1.http.get("/workers").json()["workers"]
        seen["explain"] = v1.explain(job_id)
        seen["cancel"] = v1.http.post(f"/jobs/{job_id}/cancel").json()

    v1.run(watch=watch)
    [worker] = seen["workers"]
    assert worker["alive"] is True and worker["queues"] == ["default"]
    assert seen["explain"]["reason"] in ("running", "cancelling")
    assert seen["cancel"]["state"] == "running" and seen["cancel"]["cancel_requested"] is True
    assert v1.http.get("/workers").json() == {"workers": []}  # the burst worker has left


def test_a_time_limit_and_progress_in_get_and_explain(v1: V1) -> None:
    job_id = v1.enqueue("resize", ["a.png"], timeout=30)
    job = v1.job(job_id)
    assert job["timeout"] == 30 and job["progress"] is None
    assert v1.job(v1.enqueue("resize", queue="other"))["timeout"] is None
    assert v1.explain(job_id)["data"] == {"queue": "default"}  # ready: nothing about either
    report = {"done": 4000, "total": 10000, "note": "resizing", "at": time.time()}

    async def claim_and_report() -> None:  # as a worker does, with a lease renewal
        store = open_store(v1.server.url)
        await store.open()
        try:
            (claimed,) = await store.job_claim(v1.namespace, ["default"], 1, "w1", time.time())
            await store.job_leases([(job_id, claimed.fence)], [job_id], time.time(),
                                   progress={job_id: json.dumps(report)})  # fmt: skip
        finally:
            await store.close()

    asyncio.run(claim_and_report())
    job = v1.job(job_id)
    assert job["state"] == "running" and job["progress"] == report and job["timeout"] == 30
    explained = v1.explain(job_id)
    assert explained["reason"] == "running"
    assert "time limit 30 s: stopped at" in explained["message"]
    assert "progress 4,000 / 10,000 (40%) — resizing, reported" in explained["message"]
    data = explained["data"]
    assert data["timeout"] == 30 and data["progress"] == report
    assert data["deadline"] == pytest.approx(job["started_at"] + 30)


# -- many jobs -------------------------------------------------------------------------


def test_dead_letters_respawn_and_purge(v1: V1) -> None:
    dead = [v1.enqueue("boom", max_tries=1) for _ in range(3)]
    ready = v1.enqueue("noop", queue="elsewhere")
    v1.run(boom=boom)
    assert v1.ids(state="dead") == dead[::-1]
    answer = v1.http.post("/dead/respawn", json={"ids": [dead[0], dead[0], ready, 10**15]})
    assert answer.json() == {"respawned": [dead[0]]}
    assert v1.job(dead[0])["state"] == "ready"
    assert v1.http.post("/dead/purge", json={"ids": [dead[1], ready]}).json() == {"purged": 1}
    refused(v1.http.get(f"/jobs/{dead[1]}"), 404)
    assert v1.ids(state="dead") == [dead[2]]
    refused(v1.http.post("/dead/purge", json={"ids": []}), 422)
    refused(v1.http.post("/dead/purge", json={"ids": [0]}), 422)


def test_list_filters_and_keyset_paging(v1: V1) -> None:
    ids = [
        v1.enqueue("add", [i, i], queue="even" if i % 2 == 0 else "odd", lane=f"L{i % 3}")
        for i in range(7)
    ]
    v1.enqueue("noop", ["needle-in-args"])
    ids.append(v1.ids()[0])
    pages, after = [], None
    while True:
        params = {"limit": 3} | ({"after": after} if after is not None else {})
        page = v1.jobs(**params)
        pages.append([job["id"] for job in page["jobs"]])
        after = page["next"]
        if after is None:
            break
        assert after == pages[-1][-1]
    assert pages == [ids[::-1][0:3], ids[::-1][3:6], ids[::-1][6:8]]
    assert v1.ids(queue="even") == [ids[6], ids[4], ids[2], ids[0]]
    assert v1.ids(task="noop") == [ids[7]]
    assert v1.ids(lane="L1") == [ids[4], ids[1]]
    assert v1.ids(text="needle") == [ids[7]]
    assert v1.ids(state="waiting", queue="odd") == [ids[5], ids[3]]
    assert v1.ids(state="succeeded") == []
    v1.run(["even", "odd", "default"], add=add, noop=noop)
    assert len(v1.ids(state="succeeded")) == 8
    assert v1.jobs(limit=8)["next"] is None
    assert v1.jobs(limit=7)["next"] == ids[1]


def test_lanes_and_their_limits(v1: V1) -> None:
    for _ in range(3):
        v1.enqueue("noop", lane="post:1")
    v1.enqueue("noop", lane="post:2")
    lanes = v1.http.get("/lanes").json()["lanes"]
    assert lanes[0] == {"lane": "post:1", "waiting": 2, "admitted": 1, "running": 0,
                        "halted_by": None,
                        "rule": {"pattern": "*", "limit": 1, "on_dead": "continue",
                                 "rate": None}}  # fmt: skip
    assert [lane["lane"] for lane in lanes] == ["post:1", "post:2"]
    assert v1.http.get("/lanes", params={"limit": 1}).json()["lanes"] == lanes[:1]

    put = v1.http.put("/lanes/limits", json={"pattern": "post:*", "limit": 2})
    assert put.status_code == 200
    assert put.json() == {"pattern": "post:*", "limit": 2, "on_dead": "continue", "rate": None}
    assert v1.http.get("/lanes").json()["lanes"][0]["admitted"] == 2  # applied at once
    odd = "a/../b c?\n#"  # any lane name works: it travels in the body and the query
    put = v1.http.put("/lanes/limits", json={"pattern": odd, "limit": 3, "on_dead": "halt"})
    assert put.json() == {"pattern": odd, "limit": 3, "on_dead": "halt", "rate": None}
    assert v1.http.get("/lanes/limits").json() == {"limits": [
        {"pattern": odd, "limit": 3, "on_dead": "halt", "rate": None},
        {"pattern": "post:*", "limit": 2, "on_dead": "continue", "rate": None},
    ]}  # fmt: skip
    # A limit changed without a policy keeps the rule's (docs/guarantees.md, "Lanes").
    put = v1.http.put("/lanes/limits", json={"pattern": odd, "limit": 4})
    assert put.json() == {"pattern": odd, "limit": 4, "on_dead": "halt", "rate": None}
    assert v1.http.delete("/lanes/limits", params={"pattern": odd}).status_code == 204
    refused(v1.http.delete("/lanes/limits", params={"pattern": odd}), 404)
    refused(v1.http.delete("/lanes/limits"), 422)
    limit = v1.http.put
    assert "only end" in refused(limit("/lanes/limits", json={"pattern": "a*b", "limit": 1}), 400)
    refused(limit("/lanes/limits", json={"pattern": "x", "limit": 0}), 422)
    refused(limit("/lanes/limits", json={"pattern": "x", "limit": 1, "on_dead": "stop"}), 422)
    refused(limit("/lanes/limits", json={"pattern": "", "limit": 1}), 422)
    refused(limit("/lanes/limits", json={"limit": 1}), 422)
    assert [r["pattern"] for r in v1.http.get("/lanes/limits").json()["limits"]] == ["post:*"]


def test_lane_rates_are_set_kept_and_cleared(v1: V1) -> None:
    v1.http.put("/lanes/limits", json={"pattern": "api:*", "limit": 3, "on_dead": "halt"})
    put = v1.http.put("/lanes/rates", json={"pattern": "api:*", "n": 5, "per": 2})
    assert put.status_code == 200, put.text
    rated = {"pattern": "api:*", "limit": 3, "on_dead": "halt", "rate": {"n": 5, "per": 2.0}}
    assert put.json() == rated
    # A changed limit keeps the rate; a changed rate keeps the limit (docs/guarantees.md, "Lanes").
    put = v1.http.put("/lanes/limits", json={"pattern": "api:*", "limit": 4})
    assert put.json() == {**rated, "limit": 4}
    assert v1.http.get("/lanes/limits").json() == {"limits": [{**rated, "limit": 4}]}
    rate = v1.http.put
    refused(rate("/lanes/rates", json={"pattern": "api:*", "n": 0}), 422)
    refused(rate("/lanes/rates", json={"pattern": "api:*", "n": 1, "per": 0}), 422)
    refused(rate("/lanes/rates", json={"pattern": "api:*", "n": 1, "per": "1"}), 422)
    refused(rate("/lanes/rates", json={"pattern": "api:*", "n": 1, "extra": 1}), 422)
    assert "only end" in refused(rate("/lanes/rates", json={"pattern": "a*b", "n": 1}), 400)
    assert v1.http.get("/lanes/limits").json() == {"limits": [{**rated, "limit": 4}]}
    cleared = v1.http.delete("/lanes/rates", params={"pattern": "api:*"})
    assert cleared.json() == {**rated, "limit": 4, "rate": None}
    refused(v1.http.delete("/lanes/rates", params={"pattern": "none:*"}), 404)
    assert "only end" in refused(v1.http.delete("/lanes/rates", params={"pattern": "a*b"}), 400)
    # A new rule made by a rate has limit 1.
    assert rate("/lanes/rates", json={"pattern": "one", "n": 1, "per": 3600}).json()["limit"] == 1
    first, second = v1.enqueue("noop", lane="one"), v1.enqueue("noop", lane="one")
    assert v1.http.get(f"/jobs/{first}").json()["state"] == "ready"
    assert v1.http.get(f"/jobs/{second}").json()["state"] == "waiting"


def test_stats_count_the_namespace_jobs(v1: V1) -> None:
    v1.enqueue("add", [1, 1], queue="a")
    v1.enqueue("boom", queue="a", max_tries=1)
    v1.enqueue("noop", queue="b", delay=600)
    v1.run(["a", "b"], add=add, boom=boom)
    stats = v1.http.get("/stats").json()
    assert stats["workers"] == []
    counts = {q: {s: n for s, n in states.items() if n} for q, states in stats["queues"].items()}
    assert counts == {"a": {"succeeded": 1, "dead": 1}, "b": {"scheduled": 1}}
    assert set(stats["queues"]["a"]) == {s.value for s in ferryq.State}


def test_stats_list_the_namespace_periodic_tasks(v1: V1, other: V1) -> None:
    async def declare() -> None:
        store = open_store(v1.server.url)
        await store.open()
        try:
            entry = PeriodicEntry("report", "*/5 * * * *", "mail", 1)
            await store.periodic_sync(v1.namespace, [entry], time.time())
        finally:
            await store.close()

    asyncio.run(declare())
    (task,) = v1.http.get("/stats").json()["periodic"]
    assert (task["task"], task["schedule"], task["queue"], task["catch_up"]) == (
        "report", "*/5 * * * *", "mail", 1)  # fmt: skip
    assert task["last_tick"] is None  # declared; no leader has enqueued a tick yet
    assert other.http.get("/stats").json()["periodic"] == []


def test_openapi_documents_every_route_and_answer(server: ServerProcess) -> None:
    with server.api_client() as client:
        schema = client.get("/openapi.json").json()
    routes = {(method.upper(), path) for path, ops in schema["paths"].items() for method in ops}
    assert {path for _, path in routes} >= {"/v1/jobs", "/v1/jobs/{job_id}/result", "/v1/stats"}
    assert len([r for r in routes if r[1].startswith("/v1/")]) == 19
    for path, ops in schema["paths"].items():
        if not path.startswith("/v1/"):
            continue
        for method, operation in ops.items():
            assert {"401", "503"} <= set(operation["responses"]), (method, path)
            assert operation["security"] == [{"token": []}, {"bearer": []}]
            if operation.get("parameters") or operation.get("requestBody"):
                assert "422" in operation["responses"], (method, path)
    assert "HTTPValidationError" not in schema["components"]["schemas"]
