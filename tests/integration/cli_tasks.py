"""Tasks for the command-line tests: the worker subprocess imports this module by name."""

from __future__ import annotations

import os
import sys

import ferryq

app = ferryq.App(os.environ["FERRYQ_URL"])


@app.task(name="echo")
def echo(value: object) -> object:
    return value


@app.task(name="always_fails", max_tries=2, retry=ferryq.backoff.fixed(0))
def always_fails(reason: str) -> None:
    raise RuntimeError(reason)


@app.task(name="switch_interval")
def switch_interval() -> float:
    return sys.getswitchinterval()
