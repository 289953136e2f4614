"""/metrics of a real server: its own counters, every live worker's, and job counts."""

from __future__ import annotations

import asyncio
import re
import time

import httpx

from ferryq.metrics import Registry
from ferryq.store import open_store
from ferryq.store.base import WorkerInfo
from tests.processes import wait_until
from tests.server.conftest import ALSO_POOLED
from tests.server.harness import Lmstfy, ServerProcess

SAMPLE = re.compile(r'^[a-z_]+(\{([a-z_]+="([^"\\]|\\.)*",?)*\})? -?[0-9.e+-]+$')


def scrape(server: ServerProcess) -> str:
    with server.api_client() as api:
        answer = api.get("/metrics")
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain")
    return answer.text


def test_every_line_is_prometheus_text(server: ServerProcess, lm: Lmstfy) -> None:
    lm.publish_ok("q", b"x")
    for line in scrape(server).splitlines():
        assert line.startswith("# ") or SAMPLE.match(line), line


@ALSO_POOLED
def test_http_jobs_are_counted_and_jobs_by_state_come_from_the_database(
    server: ServerProcess, lm: Lmstfy
) -> None:
    ns = lm.namespace
    job_id = lm.publish_ok("q", b"x")
    assert lm.consume_ok("q")["job_id"] == job_id
    assert lm.ack("q", job_id).status_code == 204
    labels = f'namespace="{ns}",queue="q"'
    text = scrape(server)
    for sample in ("ferryq_jobs_enqueued_total{process=", "ferryq_jobs_claimed_total{process="):
        assert re.search(re.escape(sample) + r'"[^"]+",' + re.escape(labels) + r"\} 1$", text, re.M)
    assert re.search(
        r'ferryq_attempts_finished_total\{process="[^"]+",' + re.escape(labels)
        + r',outcome="succeeded"\} 1$', text, re.M,
    )  # fmt: skip
    assert re.search(r'ferryq_http_requests_total\{[^}]*route="/api/\{ns\}/\{q\}",'
                     r'method="PUT",status="201"\} [1-9]', text)  # fmt: skip
    # The native API's routes, included as a router of their own, are labelled too.
    with server.api_client() as api:
        assert api.get("/v1/jobs/1").status_code == 401
    assert re.search(r'ferryq_http_requests_total\{[^}]*route="/v1/jobs/\{job_id\}",'
                     r'method="GET",status="401"\} [1-9]', scrape(server))  # fmt: skip
    for header in ("HELP", "TYPE"):  # each counter's samples carry the name its TYPE gives
        assert f"# {header} ferryq_jobs_enqueued_total " in text
        assert f"# {header} ferryq_jobs_enqueued " not in text
    assert "ferryq_job_lag_seconds_bucket{" in text
    # Job counts are read at most every few seconds: the succeeded job shows up soon.
    wait_until(
        lambda: f'ferryq_jobs{{{labels},state="succeeded"}} 1' in scrape(server),
        within=15, interval=0.5, what="the job counted as succeeded",
    )  # fmt: skip


@ALSO_POOLED
def test_live_workers_metrics_are_rendered_with_their_process(server: ServerProcess) -> None:
    registry = Registry()
    registry.counter("ferryq_jobs_claimed", "c", ("namespace", "queue")).inc(5, "ns", "mail")
    name = f"worker-{time.monotonic_ns()}"

    async def beat() -> None:
        store = open_store(server.url)
        await store.open()
        try:
            now = time.time()
            info = WorkerInfo(name, "ns", ["mail"], "host", 1, 4, now, now, [],
                              stats=registry.snapshot())  # fmt: skip
            await store.worker_beat(info)
        finally:
            await store.close()

    asyncio.run(beat())
    text = scrape(server)
    assert f'ferryq_jobs_claimed_total{{process="{name}",namespace="ns",queue="mail"}} 5' in text


def test_metrics_need_no_token_on_either_port(server: ServerProcess) -> None:
    with httpx.Client(timeout=10) as client:
        for base in (server.api, server.admin):
            assert client.get(f"{base}/metrics").status_code == 200
