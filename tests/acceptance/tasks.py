"""Tasks for tests that run real worker processes. The App reads FERRYQ_URL."""

from __future__ import annotations

import os
import signal

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
