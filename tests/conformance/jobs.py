"""Builders for conformance tests: jobs written straight through the Store."""

from __future__ import annotations

from typing import Any

from ferryq.job import State
from ferryq.store.base import Claimed, Finish, NewJob, Store

NS = "default"


def new_job(now: float, **fields: Any) -> NewJob:
    delay = fields.pop("delay", 0.0)
    priority = fields.get("priority", 0.0)
    run_at = now + delay
    values: dict[str, Any] = {
        "namespace": NS,
        "queue": "default",
        "task": "t",
        "state": State.WAITING
        if fields.get("lane")
        else State.SCHEDULED
        if delay > 0
        else State.READY,
        "run_at": run_at,
        "order_time": run_at - priority,
        "created_at": now,
        "max_tries": 3,
        "ttr": 30.0,
    }
    values.update(fields)
    return NewJob(**values)


def wakes_only_on_writes(url: str) -> bool:
    """Whether a store at ``url`` wakes its waits only for writes to its own database.
    Behind a transaction pooler without a direct URL it polls the server, where any
    write counts, another database's too (the next test's, made ahead): a wake-up
    without an enqueue is allowed there, a missed one never."""
    return "pooler=transaction" not in url


async def insert(store: Store, now: float, args: str = "[]", **fields: Any) -> int:
    (row,) = await store.job_insert_many(new_job(now, **fields), [args])
    return row.id


async def claim_one(store: Store, now: float, queue: str = "default") -> Claimed:
    (job,) = await store.job_claim(NS, [queue], 1, "w1", now)
    return job


def succeed(job: Claimed, now: float, result: str = "null") -> Finish:
    return Finish("succeeded", job.id, job.fence, now, now, result)
