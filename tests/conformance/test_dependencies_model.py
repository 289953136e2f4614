"""Dependencies against a plain model, by random graphs (hypothesis), on every backend.

Each example draws a graph of jobs, each after some of the jobs enqueued before it
(so it is acyclic, as every graph ferryq accepts is), with a policy for a dependency
that does not succeed (fail or run), and what the job itself does: succeed, fail for
good, fail once then succeed on its retry, be claimed by a worker that crashes (when
it is ready as a burst begins: its lease passes, the job is recovered and retried),
be cancelled before anything runs, or expire unstarted. Burst workers run everything,
with time moved on between bursts so that leases, retries and ttls pass.

Checked: a handler never starts before every dependency of its job has ended (read
from the database as it starts); every job ends; a job whose dependency did not
succeed ends dead without running under "fail" and runs under "run"; any other job
ends as its own behaviour says.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

import ferryq
from ferryq.store.base import Finish
from ferryq.testing import drain_async
from tests.conftest import FrozenClock, model_settings

BEHAVIOURS = ("succeed", "fail", "flaky", "crash", "cancel", "expire")
RUNS = ("succeed", "fail", "flaky", "crash")  # the behaviours whose handler runs
_namespaces = itertools.count()


@dataclass(frozen=True)
class Node:
    after: tuple[int, ...]  # indexes of earlier nodes
    policy: str  # "fail" or "run"
    behaviour: str


@st.composite
def graphs(draw: st.DrawFn) -> list[Node]:
    size = draw(st.integers(min_value=1, max_value=12))
    nodes = []
    for index in range(size):
        after = draw(st.lists(st.integers(0, index - 1), max_size=4, unique=True)) if index else []
        nodes.append(Node(tuple(after), draw(st.sampled_from(("fail", "run"))),
                          draw(st.sampled_from(BEHAVIOURS))))  # fmt: skip
    return nodes


async def run_graph(url: str, nodes: list[Node]) -> None:
    clock = FrozenClock()
    app = ferryq.App(url, namespace=f"model{next(_namespaces)}", clock=clock)
    ids: list[int] = []
    ran: set[int] = set()
    early: list[str] = []

    @app.task(max_tries=2, retry=ferryq.backoff.fixed(5))
    async def node(ctx: ferryq.Context, index: int) -> int:
        for dep in nodes[index].after:  # what the database says as the handler starts
            if not (await app.get_job_async(ids[dep])).terminal:
                early.append(f"job {index} started before its dependency {dep} ended")
        ran.add(index)
        behaviour = nodes[index].behaviour
        if behaviour == "fail" or (behaviour == "flaky" and ctx.attempt == 1):
            raise ferryq.Fail("fails") if behaviour == "fail" else RuntimeError("once")
        return index

    try:
        for spec in nodes:
            ids.append((await node.options(**_options(spec, ids)).enqueue_async(len(ids))).id)
        for index, spec in enumerate(nodes):
            if spec.behaviour == "cancel":
                await app.cancel_async(ids[index])
        crashed = await _run_bursts(app, clock)
        jobs = [await app.get_job_async(i) for i in ids]
        assert early == []
        for index, (spec, job) in enumerate(zip(nodes, jobs, strict=True)):
            assert job.terminal, f"job {index} did not end: {job.state}"
            held_back = spec.policy == "fail" and any(
                jobs[d].state != "succeeded" for d in spec.after
            )
            assert job.state in _expected(spec, held_back), (index, spec, job.state, job.error)
            should_run = spec.behaviour in RUNS and not held_back
            assert (index in ran) == should_run, (index, spec, job.state, job.error)
            if held_back and job.state == "dead":
                assert job.error is not None and job.error["type"] == "DependencyFailed"
            if job.id in crashed:  # else a live worker claimed it first, once it was ready
                assert job.attempts == 2 and job.errors[0]["type"] == "LeaseExpired", job
    finally:
        await app.aclose()


def _options(spec: Node, ids: list[int]) -> dict[str, object]:
    options: dict[str, object] = {"after_failed": spec.policy}
    if spec.after:
        options["after"] = [ids[d] for d in spec.after]
    if spec.behaviour == "expire":
        options.update(delay=10, ttl=10)  # due as it expires: never claimable
    if spec.behaviour == "crash":
        options.update(queue="crashy", ttr=5)
    return options


async def _run_bursts(app: ferryq.App, clock: FrozenClock) -> set[int]:
    """Bursts of a live worker, time moving on between them; before each, a worker
    that dies holding what it claims takes the ready jobs of queue crashy (its lease
    passes, and the next burst's maintenance recovers the job as a failed attempt).
    The jobs it took."""
    store, crashed = await app.store(), set[int]()
    for _ in range(6):
        for job in await store.job_claim(app.namespace, ["crashy"], 100, "dead", clock.now):
            if job.id in crashed:  # it crashed once: this time it goes back
                await store.job_finish_many([Finish("returned", job.id, job.fence, clock.now)])
            crashed.add(job.id)
        await drain_async(app, ["default", "crashy"])
        clock.advance(11)
    return crashed


def _expected(spec: Node, held_back: bool) -> set[str]:
    """How a job may end: its own behaviour, unless a failed dependency fails it."""
    if spec.behaviour == "cancel":
        return {"cancelled"}
    if spec.behaviour == "expire":  # a worker may fail it before its ttl passes
        return {"expired", "dead"} if held_back else {"expired"}
    if held_back or spec.behaviour == "fail":
        return {"dead"}
    return {"succeeded"}


@pytest.mark.parametrize("backend_url", ["sqlite", "postgres"], indirect=True)
def test_dependents_start_only_after_their_dependencies_and_always_end(backend_url: str) -> None:
    @given(graphs())
    @model_settings(backend_url)
    def check(nodes: list[Node]) -> None:
        asyncio.run(run_graph(backend_url, nodes))

    check()
