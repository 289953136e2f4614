"""The tasks of ``ferryq demo``.

Worker processes import this module by name (``ferryq.demo_tasks:app``), so the App
takes its database from ``FERRYQ_URL``, which the demo sets before it starts them.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from typing import Any

import ferryq

app = ferryq.App(os.environ["FERRYQ_URL"])


@app.task(name="send_email", queue="mail")
async def send_email(to: str, subject: str) -> dict[str, Any]:
    await asyncio.sleep(random.uniform(0.01, 0.1))
    return {"to": to, "subject": subject, "status": "sent"}


@app.task(name="resize_image", queue="images")
def resize_image(path: str, width: int) -> str:
    time.sleep(random.uniform(0.05, 0.3))
    stem, _, ext = path.rpartition(".")
    return f"{stem}-{width}w.{ext}"


@app.task(name="flaky_upload", queue="uploads", max_tries=3, retry=ferryq.backoff.fixed(1))
def flaky_upload(path: str) -> None:
    raise ConnectionError(f"storage endpoint refused the upload of {path}")


@app.task(name="report", queue="reports")
async def report(period: str) -> dict[str, Any]:
    await asyncio.sleep(0.05)
    return {"period": period, "emails": 200, "images": 40}


@app.task(name="publish_comment", queue="comments")
async def publish_comment(post: int, number: int) -> dict[str, Any]:
    # Each post's comments share the lane post:N: one at a time, in the order written.
    await asyncio.sleep(random.uniform(0.02, 0.08))
    return {"post": post, "comment": number}


@app.task(name="export_rows", queue="exports")
def export_rows(tenant: str, part: int) -> dict[str, Any]:
    # Lanes tenant:NAME, limited together by the rule tenant:* (2 at a time per tenant).
    time.sleep(0.4 if tenant == "slowco" else 0.05)
    return {"tenant": tenant, "part": part}
