"""Tasks for tests that run real worker processes. The App reads FERRYQ_URL."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import ferryq

app = ferryq.App(os.environ.get("FERRYQ_URL"))
_log = None


def _log_line(line: str) -> None:
    global _log
    if _log is None:
        path = os.path.join(os.environ["FERRYQ_TEST_LOG_DIR"], f"{os.getpid()}.log")
        _log = open(path, "a", buffering=1)  # noqa: SIM115 - one file for the process's life
    _log.write(line + "\n")


@app.task
async def record(ctx: ferryq.Context, n: int) -> int:
    _log_line(f"{ctx.job_id} {n} {ctx.fence} {os.getpid()}")
    return n


@app.task(ttr=1, max_tries=3, retry=ferryq.backoff.fixed(0))
def hold(ctx: ferryq.Context, started_fifo: str, go_fifo: str | None) -> str:
    """First attempt: say so through a FIFO, then block until told to go on (if ever)."""
    if ctx.attempt == 1:
        with open(started_fifo, "w") as fifo:
            fifo.write(f"{os.getpid()}\n")
        if go_fifo is None:
            while True:  # killed here
                signal.pause()
        with open(go_fifo) as fifo:
            fifo.read()
    return f"attempt {ctx.attempt} by {os.getpid()}"


@app.task(ttr=1, max_tries=3, retry=ferryq.backoff.fixed(0))
def two_stages(ctx: ferryq.Context, started_fifo: str) -> object:
    """Stage one hands on at once; stage two says it started, then blocks on its
    first try (killed there)."""
    _log_line(f"{ctx.job_id} stage={ctx.stage} attempt={ctx.attempt} {os.getpid()}")
    if ctx.stage is None:
        return ferryq.Next("two", context={"one_by": os.getpid()})
    if ctx.attempt == 1:
        with open(started_fifo, "w") as fifo:
            fifo.write(f"{os.getpid()}\n")
        while True:
            signal.pause()
    return {**ctx.context, "two_by": os.getpid()}


def _record_attempt(ctx: ferryq.Context, began: float, outcome: str) -> None:
    """One line per attempt, written as it ends: job fence pid start end outcome."""
    _log_line(f"attempt {ctx.job_id} {ctx.fence} {os.getpid()} {began!r} {time.time()!r} {outcome}")


@app.task(ttr=3, max_tries=20, retry=ferryq.backoff.fixed(0))
def work(ctx: ferryq.Context, seconds: float, later: float | None = None) -> str:
    """A sync job of ``seconds`` (``later`` on attempts after the first, if given) that
    an interruption stops within ~10 ms."""
    if later is not None and ctx.attempt > 1:
        seconds = later
    began, outcome = time.time(), "interrupted"
    try:
        while time.time() < began + seconds:
            time.sleep(0.01)
        outcome = "done"
        return outcome
    finally:
        _record_attempt(ctx, began, outcome)


@app.task(ttr=3, max_tries=20, retry=ferryq.backoff.fixed(0))
async def work_async(ctx: ferryq.Context, seconds: float, later: float | None = None) -> str:
    """The async twin of ``work``."""
    if later is not None and ctx.attempt > 1:
        seconds = later
    began, outcome = time.time(), "interrupted"
    try:
        await asyncio.sleep(seconds)
        outcome = "done"
        return outcome
    finally:
        _record_attempt(ctx, began, outcome)


@app.task(ttr=2, max_tries=1)
def stuck(ctx: ferryq.Context, seconds: float) -> None:
    """Blocks in C for ``seconds``: nothing interrupts it before the call returns."""
    _log_line(f"started {ctx.job_id} {ctx.fence} {os.getpid()} {time.time()!r}")
    time.sleep(seconds)
