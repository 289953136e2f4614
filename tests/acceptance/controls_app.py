"""Tasks for tests/acceptance/test_controls_in_a_worker_process.py: time limits in a
real worker process.

Each handler writes ``<name> <attempt> <monotonic start>`` to FERRYQ_TEST_LOG_DIR."""

from __future__ import annotations

import asyncio
import os
import time

import ferryq

app = ferryq.App(os.environ.get("FERRYQ_URL"))


def _started(name: str, ctx: ferryq.Context) -> None:
    path = os.path.join(os.environ["FERRYQ_TEST_LOG_DIR"], f"{os.getpid()}.log")
    with open(path, "a") as log:
        log.write(f"{name} {ctx.job_id} {ctx.attempt} {time.time():.6f}\n")


@app.task(timeout=1, max_tries=2, retry=ferryq.backoff.fixed(0))
async def sleepy(ctx: ferryq.Context) -> None:
    _started("sleepy", ctx)
    await asyncio.sleep(3600)


@app.task(timeout=1, max_tries=2, retry=ferryq.backoff.fixed(0))
def spin(ctx: ferryq.Context) -> None:
    _started("spin", ctx)
    while True:
        pass


@app.task
def deaf(ctx: ferryq.Context) -> None:
    """Never reads ctx.cancelled: only an interruption stops it."""
    _started("deaf", ctx)
    while True:
        pass


@app.task(max_tries=2, retry=ferryq.backoff.fixed(0))
async def flaky(ctx: ferryq.Context) -> str:
    _started("flaky", ctx)
    if ctx.attempt == 1:
        raise ConnectionError("first try fails")
    return "ok"


@app.task(max_tries=3, fail_on=ValueError)
async def bad_input(ctx: ferryq.Context) -> None:
    _started("bad_input", ctx)
    raise ValueError("not a number: 'x'")
