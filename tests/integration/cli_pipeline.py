"""Tasks for the command-line tests of stages and periodic tasks (imported by name)."""

from __future__ import annotations

import os
from typing import Any

import ferryq

app = ferryq.App(os.environ["FERRYQ_URL"])


@app.task(name="two_stages")
def two_stages(ctx: ferryq.Context) -> Any:
    if ctx.stage is None:
        return ferryq.Next("finish", context={"from": "first"})
    return ctx.context


@app.periodic(every=86400, name="daily_report")
def daily_report() -> None:
    return None
