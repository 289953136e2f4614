"""Tracing with OpenTelemetry (``ferryq.otel``, docs/operations.md, Tracing): a span
around every enqueue and attempt, the trace context carried in the job within a
process, from one process to another, and from an HTTP request's ``traceparent`` header
through a real server; and a broken tracer that loses no job."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import ferryq
from ferryq import backoff
from ferryq.otel import Tracing
from ferryq.server import tokens
from ferryq.server.app import build_api
from ferryq.server.engine import Engine
from ferryq.store.base import Token
from ferryq.testing import drain, drain_async
from tests.conftest import FrozenClock
from tests.processes import ROOT
from tests.server.harness import new_namespace, running_server

#: The trace of the HTTP tests' callers: a client span id per request.
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACESTATE = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"


def traceparent(span_id: int) -> str:
    return f"00-{TRACE_ID}-{span_id:016x}-01"


class Flaky(Exception):
    pass


@dataclass
class Spans:
    """A tracer provider of the test's own, and the spans it finished."""

    provider: TracerProvider
    exporter: InMemorySpanExporter

    @property
    def tracer(self) -> trace.Tracer:
        return self.provider.get_tracer("tests")

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if s.name == name]

    def one(self, name: str) -> ReadableSpan:
        [span] = self.named(name)
        return span

    def of_job(self, name: str, job_id: int) -> list[ReadableSpan]:
        """The spans named ``name`` of one job, in the order they ended."""
        job = str(job_id)
        return [s for s in self.named(name) if attributes(s).get("messaging.message.id") == job]


@pytest.fixture
def spans() -> Iterator[Spans]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield Spans(provider, exporter)
    provider.shutdown()


def attributes(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def ids(span: ReadableSpan) -> tuple[int, int]:
    """(trace id, span id) of a span."""
    context = span.get_span_context()
    assert context is not None
    return context.trace_id, context.span_id


def parent_ids(span: ReadableSpan) -> tuple[int, int] | None:
    return None if span.parent is None else (span.parent.trace_id, span.parent.span_id)


def linked(span: ReadableSpan) -> list[tuple[int, int]]:
    return [(link.context.trace_id, link.context.span_id) for link in span.links]


# -- in one process --------------------------------------------------------------------


async def test_the_handler_runs_in_a_consumer_span_whose_parent_is_the_enqueue(
    app: ferryq.App, spans: Spans
) -> None:
    app.use(Tracing(spans.provider))
    tracer = spans.tracer

    @app.task(queue="mail")
    def sync_job(n: int) -> int:
        with tracer.start_as_current_span("sync handler's own"):
            return n

    @app.task(queue="mail")
    async def async_job(n: int) -> int:
        await asyncio.sleep(0)
        with tracer.start_as_current_span("async handler's own"):
            return n

    with tracer.start_as_current_span("request"):
        sync_handle = sync_job.enqueue(1)  # the sync path: hooks run on the portal thread
        async_handle = await async_job.options(lane="post:1").enqueue_async(2)
    await drain_async(app)
    assert await sync_handle.result_async(timeout=1) == 1
    assert await async_handle.result_async(timeout=1) == 2

    trace_id, request_span = ids(spans.one("request"))
    for handle, own in ((sync_handle, "sync handler's own"), (async_handle, "async handler's own")):
        [send] = spans.of_job("send mail", handle.id)
        [process] = spans.of_job("process mail", handle.id)
        assert send.kind is SpanKind.PRODUCER and parent_ids(send) == (trace_id, request_span)
        assert process.kind is SpanKind.CONSUMER
        assert parent_ids(process) == ids(send) and linked(process) == [ids(send)]
        assert parent_ids(spans.one(own)) == ids(process)
        assert send.status.status_code is process.status.status_code is StatusCode.UNSET
        meta = (await app.get_job_async(handle.id)).meta
        assert meta["trace"]["traceparent"].startswith(f"00-{trace_id:032x}-{ids(send)[1]:016x}-")

    [send] = spans.of_job("send mail", async_handle.id)
    assert attributes(send) == {
        "messaging.system": "ferryq", "messaging.operation.type": "send",
        "messaging.operation.name": "send", "messaging.destination.name": "mail",
        "messaging.message.id": str(async_handle.id), "messaging.ferryq.task": async_job.name,
        "messaging.ferryq.lane": "post:1",
    }  # fmt: skip
    [process] = spans.of_job("process mail", async_handle.id)
    assert attributes(process) == {
        "messaging.system": "ferryq", "messaging.operation.type": "process",
        "messaging.operation.name": "process", "messaging.destination.name": "mail",
        "messaging.message.id": str(async_handle.id), "messaging.ferryq.task": async_job.name,
        "messaging.ferryq.attempt": 1, "messaging.ferryq.max_tries": 3,
        "messaging.ferryq.lane": "post:1", "messaging.ferryq.outcome": "succeeded",
        "messaging.ferryq.timed_out": False,
    }  # fmt: skip
    assert trace.get_current_span() is trace.INVALID_SPAN  # nothing left attached


async def test_a_failing_attempt_ends_its_span_in_error_and_a_retry_continues_the_trace(
    app: ferryq.App, spans: Spans
) -> None:
    app.use(Tracing(spans.provider))

    @app.task(max_tries=2, retry=backoff.fixed(0))
    def flaky() -> None:
        raise Flaky("no luck")

    with spans.tracer.start_as_current_span("request"):
        handle = await flaky.enqueue_async()
    await drain_async(app)
    assert (await app.get_job_async(handle.id)).state == "dead"

    send = spans.one("send default")
    attempts = spans.of_job("process default", handle.id)
    assert [attributes(a)["messaging.ferryq.attempt"] for a in attempts] == [1, 2]
    assert [attributes(a)["messaging.ferryq.outcome"] for a in attempts] == ["retry", "dead"]
    for attempt in attempts:
        assert parent_ids(attempt) == ids(send) and linked(attempt) == [ids(send)]
        assert attempt.status.status_code is StatusCode.ERROR
        assert attempt.status.description == "Flaky: no luck"
        assert attributes(attempt)["error.type"] == f"{__name__}.Flaky"
        assert attributes(attempt)["messaging.ferryq.timed_out"] is False
        assert [event.name for event in attempt.events] == ["exception"]
    assert send.status.status_code is StatusCode.UNSET


async def test_a_batch_is_one_send_span_and_an_untraced_job_a_root(
    app: ferryq.App, clock: FrozenClock, spans: Spans
) -> None:
    app.use(Tracing(spans.provider))

    @app.task
    def work(n: int) -> int:
        return n

    handles = await work.enqueue_many_async([(1,), (2,), (3,)])
    untraced = ferryq.App(app.url, clock=clock)  # a producer without ferryq.otel
    try:
        plain = await untraced.enqueue_async(work.name, [4])
    finally:
        await untraced.aclose()
        untraced.close()
    await drain_async(app)

    send = spans.one("send default")
    assert attributes(send)["messaging.batch.message_count"] == 3
    assert "messaging.message.id" not in attributes(send) and send.parent is None
    for handle in handles:
        [process] = spans.of_job("process default", handle.id)
        assert parent_ids(process) == ids(send)
    [root] = spans.of_job("process default", plain.id)
    assert root.parent is None and root.links == ()
    assert (await app.get_job_async(plain.id)).meta == {}


async def test_an_enqueue_that_fails_ends_its_span_in_error(app: ferryq.App, spans: Spans) -> None:
    app.use(Tracing(spans.provider))

    @app.hooks.before_enqueue
    def unstorable(enqueue: ferryq.Enqueue) -> None:
        enqueue.meta["bad"] = object()

    @app.task
    def job() -> None: ...

    with pytest.raises(ferryq.SerializationError):
        await job.enqueue_async()
    send = spans.one("send default")
    assert send.status.status_code is StatusCode.ERROR
    assert attributes(send)["error.type"] == "ferryq.errors.SerializationError"
    assert "messaging.message.id" not in attributes(send)


# -- a tracer that fails ---------------------------------------------------------------


class BrokenSpan(trace.NonRecordingSpan):
    def end(self, end_time: int | None = None) -> None:
        raise RuntimeError("exporter down")


class BrokenTracer(trace.Tracer):
    """Fails to start spans (``fails="start"``), or hands out spans that fail to end."""

    def __init__(self, fails: str) -> None:
        self.fails = fails

    def start_span(self, *args: Any, **kwargs: Any) -> trace.Span:
        if self.fails == "start":
            raise RuntimeError("tracer down")
        return BrokenSpan(trace.SpanContext(1, 1, is_remote=False))

    def start_as_current_span(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("not used")


class BrokenProvider(trace.TracerProvider):
    def __init__(self, fails: str) -> None:
        self.fails = fails

    def get_tracer(self, *args: Any, **kwargs: Any) -> trace.Tracer:
        return BrokenTracer(self.fails)


@pytest.mark.parametrize("fails", ["start", "end"])
async def test_a_broken_tracer_loses_no_job(
    app: ferryq.App, fails: str, caplog: pytest.LogCaptureFixture
) -> None:
    tracing = Tracing(BrokenProvider(fails))
    app.use(tracing)
    seen: list[object] = []

    @app.task
    def work(n: int) -> int:
        seen.append(otel_context.get_current())
        return n

    @app.task
    async def async_work(n: int) -> int:
        return n

    with caplog.at_level(logging.ERROR, logger="ferryq.hooks"):
        handles = [work.enqueue(1), await async_work.enqueue_async(2)]
        await drain_async(app)
    assert [await h.result_async(timeout=1) for h in handles] == [1, 2]
    complaints = [r for r in caplog.records if r.name == "ferryq.hooks"]
    assert complaints and all("RuntimeError" in r.getMessage() for r in complaints)
    assert tracing._sends == {} and tracing._attempts == {}  # nothing held on to
    assert trace.get_current_span() is trace.INVALID_SPAN


# -- across processes ------------------------------------------------------------------


def read_spans(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def run(argv: Sequence[str], env: dict[str, str]) -> str:
    done = subprocess.run(
        argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"{argv} exited with {done.returncode}\n{done.stderr}"
    return done.stdout


def test_the_trace_crosses_from_a_producer_process_to_a_worker_process(tmp_path: Path) -> None:
    base = {**os.environ, "FERRYQ_URL": f"sqlite:///{tmp_path}/ferryq.db"}
    produced, consumed = tmp_path / "producer.jsonl", tmp_path / "worker.jsonl"
    out = run([sys.executable, "-m", "tests.integration.otel_tasks"],
              {**base, "FERRYQ_TEST_SPANS": str(produced)})  # fmt: skip
    job_id = out.split()[-1]
    run([sys.executable, "-m", "ferryq", "worker", "tests.integration.otel_tasks:app", "--burst"],
        {**base, "FERRYQ_TEST_SPANS": str(consumed)})  # fmt: skip

    producer = {span["name"]: span for span in read_spans(produced)}
    worker = {span["name"]: span for span in read_spans(consumed)}
    checkout, send = producer["checkout"], producer["send renders"]
    process, own = worker["process renders"], worker["render page"]
    assert send["kind"] == "PRODUCER" and send["parent_span_id"] == checkout["span_id"]
    assert send["attributes"]["messaging.message.id"] == job_id
    assert process["kind"] == "CONSUMER" and process["attributes"]["messaging.message.id"] == job_id
    assert process["trace_id"] == process["parent_trace_id"] == checkout["trace_id"]
    assert process["parent_span_id"] == send["span_id"] and process["links"] == [send["span_id"]]
    assert own["parent_span_id"] == process["span_id"]
    assert process["attributes"]["messaging.ferryq.outcome"] == "succeeded"


# -- from an HTTP request --------------------------------------------------------------


def test_a_job_published_over_http_continues_the_callers_trace(
    tmp_path: Path, spans: Spans
) -> None:
    """Both lmstfy publishes and both native enqueues keep the request's trace context
    in the job; a worker with Tracing continues it. An invalid traceparent is ignored."""
    url = f"sqlite:///{tmp_path}/ferryq.db"
    namespace = new_namespace()
    want: dict[int, int | None] = {}  # job id: the span id its consumer's parent must have
    with running_server(url, tmp_path / "logs") as server:
        token = server.create_token(namespace)
        with httpx.Client(base_url=server.api, headers={"X-Token": token}, timeout=30) as http:

            def sent(method: str, path: str, span_id: int | None, **kwargs: Any) -> Any:
                headers = {} if span_id is None else {"traceparent": traceparent(span_id),
                                                      "tracestate": TRACESTATE}  # fmt: skip
                answer = http.request(method, path, headers=headers, **kwargs)
                assert answer.status_code == 201, answer.text
                return answer.json()

            lmstfy = f"/api/{namespace}/q"
            want[int(sent("PUT", lmstfy, 0x11, content=b"one")["job_id"])] = 0x11
            for job_id in sent("PUT", f"{lmstfy}/bulk", 0x12, content=b'[{"n":1},{"n":2}]')[
                "job_ids"
            ]:
                want[int(job_id)] = 0x12
            body = {"task": "traced.echo", "queue": "q"}
            want[sent("POST", "/v1/jobs", 0x13, json={**body, "args": ["v1"]})["id"]] = 0x13
            batch = sent("POST", "/v1/jobs/batch", 0x14, json={**body, "args": [["a"], ["b"]]})
            want.update({job["id"]: 0x14 for job in batch["jobs"]})
            for bad in (f"00-{TRACE_ID}-{0:016x}-01", f"00-{TRACE_ID.upper()}-{1:016x}-01"):
                answer = http.put(lmstfy, content=b"bad", headers={"traceparent": bad})
                assert answer.status_code == 201, answer.text
                want[int(answer.json()["job_id"])] = None
                answer = http.post("/v1/jobs", json={**body, "args": ["bad"]},
                                   headers={"traceparent": bad})  # fmt: skip
                assert answer.status_code == 201, answer.text
                want[answer.json()["id"]] = None

    worker = ferryq.App(url, namespace=namespace)
    worker.use(Tracing(spans.provider))
    bodies: list[str] = []

    @worker.task(name="lmstfy", queue="q")
    def published(body: str) -> None:
        bodies.append(body)

    @worker.task(name="traced.echo", queue="q")
    def echo(value: Any) -> Any:
        return value

    try:
        drain(worker)
        for job_id, span_id in want.items():
            [process] = spans.of_job("process q", job_id)
            meta = worker.get_job(job_id).meta
            if span_id is None:
                assert process.parent is None and "trace" not in meta, job_id
                continue
            assert parent_ids(process) == (int(TRACE_ID, 16), span_id), job_id
            assert linked(process) == [(int(TRACE_ID, 16), span_id)]
            assert meta["trace"] == {"traceparent": traceparent(span_id), "tracestate": TRACESTATE}
    finally:
        worker.close()
    assert sorted(bodies) == sorted(["one", '{"n":1}', '{"n":2}', "bad", "bad"])


@dataclass
class Served:
    app: ferryq.App
    api: httpx.AsyncClient


@pytest.fixture
async def served(app: ferryq.App, clock: FrozenClock, spans: Spans) -> AsyncIterator[Served]:
    """The server's routes in this process, on an App with Tracing."""
    app.use(Tracing(spans.provider))
    engine = Engine(app, maintenance=False)
    await engine.start()
    secret = tokens.generate()
    record = Token("ns", tokens.digest(secret), "tests", tokens.hint(secret), clock())
    assert await engine.ops.token_create(record)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=build_api(engine)), base_url="http://ferryq",
        headers={"X-Token": secret},
    ) as api:  # fmt: skip
        yield Served(app, api)
    engine.close()
    await engine.stop()


async def test_a_server_with_tracing_sends_as_a_child_of_the_header_and_keeps_it(
    served: Served, spans: Spans
) -> None:
    """The header's context is the job's creation context: the server's send span is
    its child and links to it, and the job keeps it, so the consumer's parent is the
    caller's span."""
    answer = await served.api.put("/api/ns/q", content=b"x",
                                  headers={"traceparent": traceparent(0x21)})  # fmt: skip
    assert answer.status_code == 201, answer.text
    job_id = int(answer.json()["job_id"])
    caller = (int(TRACE_ID, 16), 0x21)
    [send] = spans.of_job("send q", job_id)
    assert parent_ids(send) == caller and linked(send) == [caller]
    assert (await served.app.get_job_async(job_id)).meta["trace"] == {
        "traceparent": traceparent(0x21)
    }

    consumer = ferryq.App(served.app.url, namespace="ns", clock=served.app.clock)
    consumer.use(Tracing(spans.provider))

    @consumer.task(name="lmstfy", queue="q")
    def published(body: str) -> None: ...

    try:
        await drain_async(consumer)
    finally:
        await consumer.aclose()
        consumer.close()
    [process] = spans.of_job("process q", job_id)
    assert parent_ids(process) == caller and linked(process) == [caller]


def test_ferryq_imports_without_opentelemetry() -> None:
    code = (
        "import sys\n"
        "sys.modules['opentelemetry'] = None\n"
        "import ferryq, ferryq.testing, ferryq.tracecontext, ferryq.worker\n"
        "try:\n"
        "    import ferryq.otel\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = run([sys.executable, "-c", code], dict(os.environ))
    assert "pip install 'ferryq[otel]'" in out
