"""The native JSON API under ``/v1`` (described in docs/http-api.md, "Native API").

Every call carries a namespace token (``X-Token: T`` or ``Authorization: Bearer T``),
checked before the body is read; the token's namespace scopes everything, so a job of
another namespace is "not found" exactly as a missing one. Jobs are enqueued through
``App.enqueue_raw`` with the options validated as the Python API validates them;
everything else goes through the operations layer (``ferryq.ops``), confined to the
token's namespace. What every route checks first, and the shape of refusals
(``{"error": "message"}``), are in ``native_guard``; the request and response shapes,
in ``native_models``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from ferryq import _json, backoff, insights, tracecontext
from ferryq.errors import (
    InvalidTransition,
    JobFailed,
    JobNotFound,
    SerializationError,
    UnknownDependency,
)
from ferryq.handle import JobHandle
from ferryq.job import Job, State
from ferryq.ops import RESPAWNABLE, JobFilter, Operations, Token, WorkerInfo
from ferryq.policy import JobOptions, dependency_ids
from ferryq.server import http
from ferryq.server.engine import Engine
from ferryq.server.http import NO_CONTENT
from ferryq.server.native_guard import ApiError, Caller, answer, refusals, route_class
from ferryq.server.native_models import (
    DEFAULT_WAIT_SECONDS,
    AfterQuery,
    ArgsTextQuery,
    BatchIn,
    BatchOut,
    DependenciesOut,
    EnqueuedOut,
    EnqueueIn,
    ExplanationOut,
    JobFailedOut,
    JobIdPath,
    JobIdsIn,
    JobOptionsIn,
    JobOut,
    JobPageOut,
    LaneLimitIn,
    LaneRateIn,
    LaneRuleOut,
    LaneRulesOut,
    LanesOut,
    LimitQuery,
    PatternQuery,
    PurgedOut,
    QueueQuery,
    RespawnedOut,
    ResultOut,
    StatsOut,
    TextQuery,
    TtlQuery,
    WaitQuery,
    WorkersOut,
)

#: The W3C trace context headers an enqueue reads (read from the request itself, so
#: that a repeated traceparent is seen as W3C wants: ignored).
TRACE_HEADERS = {"parameters": [
    {"name": "traceparent", "in": "header", "required": False, "schema": {"type": "string"},
     "description": "W3C trace context: stored in the jobs' meta.trace, so that a worker "
                    "with ferryq.otel continues the trace; an invalid one is ignored."},
    {"name": "tracestate", "in": "header", "required": False, "schema": {"type": "string"},
     "description": "W3C trace context, kept with a valid traceparent (512 characters "
                    "at most: longer ones are cut member by member)."},
]}  # fmt: skip


class NativeApi:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def router(self) -> APIRouter:
        router = APIRouter(prefix="/v1", route_class=route_class(self.engine), tags=["v1"])
        routes: list[tuple[str, str, Callable[..., Any], dict[str, Any]]] = [
            ("POST", "/jobs", self.enqueue, dict(
                status_code=201, response_model=EnqueuedOut,
                responses={200: answer(EnqueuedOut, "Deduplicated: an unfinished job (or one "
                                        "created within unique_for) has the unique_key."),
                           **refusals(400, 413, 422, 429)},
                openapi_extra=TRACE_HEADERS, summary="Enqueue a job")),
            ("POST", "/jobs/batch", self.enqueue_batch, dict(
                status_code=201, response_model=BatchOut,
                responses={200: answer(BatchOut, "Every job was deduplicated."),
                           **refusals(400, 413, 422, 429)}, openapi_extra=TRACE_HEADERS,
                summary="Enqueue jobs of one task and options, one per args, in one transaction")),
            ("GET", "/jobs", self.list_jobs, dict(
                response_model=JobPageOut, responses=refusals(422),
                summary="List jobs, newest first, with keyset paging")),
            ("GET", "/jobs/{job_id}", self.get_job, dict(
                response_model=JobOut, responses=refusals(404, 422), summary="A job")),
            ("GET", "/jobs/{job_id}/explain", self.explain, dict(
                response_model=ExplanationOut, responses=refusals(404, 422),
                summary="Why a job is (not) running")),
            ("GET", "/jobs/{job_id}/dependencies", self.dependencies, dict(
                response_model=DependenciesOut, responses=refusals(404, 422),
                summary="The jobs a job waits for, and those that wait for it")),
            ("GET", "/jobs/{job_id}/result", self.result, dict(
                response_model=ResultOut,
                responses={202: answer(ResultOut, "Not finished within the timeout; ask again."),
                           409: answer(JobFailedOut, "The job ended dead, cancelled or "
                                        "expired; job_error is its stored error."),
                           **refusals(404, 422)},
                summary="Wait for a job's result")),
            ("POST", "/jobs/{job_id}/cancel", self.cancel, dict(
                response_model=JobOut, responses=refusals(404, 409, 422),
                summary="Cancel a job (a running one is asked to stop)")),
            ("POST", "/jobs/{job_id}/respawn", self.respawn, dict(
                response_model=JobOut, responses=refusals(404, 409, 422),
                summary="Queue a dead, cancelled or expired job again")),
            ("POST", "/dead/respawn", self.dead_respawn, dict(
                response_model=RespawnedOut, responses=refusals(400, 413, 422),
                summary="Queue dead jobs again with a fresh try count")),
            ("POST", "/dead/purge", self.dead_purge, dict(
                response_model=PurgedOut, responses=refusals(400, 413, 422),
                summary="Delete dead jobs for good")),
            ("GET", "/lanes", self.lanes, dict(
                response_model=LanesOut, responses=refusals(422),
                summary="Lanes with unfinished jobs, busiest first, then halted lanes")),
            ("GET", "/lanes/limits", self.lane_limits, dict(
                response_model=LaneRulesOut, responses=refusals(),
                summary="Lane limits, by pattern")),
            ("PUT", "/lanes/limits", self.lane_limit_set, dict(
                response_model=LaneRuleOut, responses=refusals(400, 413, 422),
                summary="Set the limit of a lane (post:42) or a prefix (tenant:*)")),
            ("DELETE", "/lanes/limits", self.lane_limit_delete, dict(
                status_code=204, response_class=Response, responses=refusals(404, 422),
                summary="Remove a lane limit")),
            ("PUT", "/lanes/rates", self.lane_rate_set, dict(
                response_model=LaneRuleOut, responses=refusals(400, 413, 422),
                summary="Set the rate of a lane (api:acme) or a prefix (api:*): at most n "
                        "starts in any per seconds; the rule keeps its limit and policy")),
            ("DELETE", "/lanes/rates", self.lane_rate_delete, dict(
                response_model=LaneRuleOut, responses=refusals(400, 404, 422),
                summary="Take the rate off a rule; its limit and policy stay")),
            ("GET", "/stats", self.stats, dict(
                response_model=StatsOut, responses=refusals(), summary="Jobs by queue and state")),
            ("GET", "/workers", self.workers, dict(
                response_model=WorkersOut, responses=refusals(), summary="Registered workers")),
        ]  # fmt: skip
        for method, path, endpoint, options in routes:
            router.add_api_route(path, endpoint, methods=[method], **options)
        return router

    @property
    def ops(self) -> Operations:
        return self.engine.ops

    # -- enqueue -----------------------------------------------------------------------

    async def enqueue(self, body: EnqueueIn, token: Caller, request: Request) -> Response:
        [handle] = await self._enqueue(token, body.task, [body.args], body, request)
        return http.json(201 if handle.created else 200, _enqueued(handle))

    async def enqueue_batch(self, body: BatchIn, token: Caller, request: Request) -> Response:
        handles = await self._enqueue(token, body.task, body.args, body, request)
        status = 201 if any(h.created for h in handles) else 200
        return http.json(status, {"jobs": [_enqueued(h) for h in handles]})

    async def _enqueue(
        self, token: Token, task: str, args: Sequence[Any], body: JobOptionsIn, request: Request
    ) -> list[JobHandle]:
        options = _job_options(token.namespace, body, self.engine.now())
        if (trace := tracecontext.from_headers(request.headers)) is not None:
            options = dataclasses.replace(options, meta={tracecontext.META_KEY: trace})
        encoded = [_storable_json(one, f"arguments of {task}") for one in args]
        if not self.engine.limiter.take(token, "write", len(encoded)):
            raise ApiError(429, "the publish rate limit of this token is reached; retry later")
        try:
            handles = await self.engine.app.enqueue_raw(task, encoded, options)
        except (SerializationError, UnknownDependency) as exc:
            self.engine.limiter.refund(token, "write", len(encoded))
            raise ApiError(400, str(exc)) from None
        except BaseException:
            self.engine.limiter.refund(token, "write", len(encoded))
            raise
        self.engine.notify(options.namespace, options.queue)
        return handles

    # -- one job -----------------------------------------------------------------------

    async def get_job(self, job_id: JobIdPath, token: Caller) -> Response:
        return http.json(200, (await self._job(token, job_id)).to_dict())

    async def explain(self, job_id: JobIdPath, token: Caller) -> Response:
        try:
            explanation = await self.ops.explain(job_id, token.namespace)
        except JobNotFound:
            raise _not_found(job_id) from None
        return http.json(200, explanation.to_dict())

    async def dependencies(self, job_id: JobIdPath, token: Caller) -> Response:
        try:
            found = await self.ops.dependencies(job_id, token.namespace)
        except JobNotFound:
            raise _not_found(job_id) from None
        return http.json(200, {
            "after": [{"id": d.id, "ended": d.ended} for d in found.after],
            "dependents": [{"id": d.id, "ended": d.ended} for d in found.dependents],
        })  # fmt: skip

    async def result(
        self,
        job_id: JobIdPath,
        token: Caller,
        timeout: WaitQuery = DEFAULT_WAIT_SECONDS,
    ) -> Response:
        began = asyncio.get_running_loop().time()  # the wait counts from here
        job = await self.engine.wait_finished(await self._job(token, job_id), timeout, began)
        if job is None:  # purged while we waited
            raise _not_found(job_id)
        if job.state == State.SUCCEEDED:
            return http.json(200, {"id": job.id, "state": job.state, "result": job.result})
        if job.terminal:
            message = str(JobFailed(job.id, job.state, job.error))
            return http.json(409, {"error": message, "id": job.id, "state": job.state,
                                   "job_error": job.error})  # fmt: skip
        return http.json(202, {"id": job.id, "state": job.state, "result": None})

    async def cancel(self, job_id: JobIdPath, token: Caller) -> Response:
        try:
            job = await self.ops.cancel(job_id, token.namespace)
        except JobNotFound:
            raise _not_found(job_id) from None
        except InvalidTransition as exc:
            raise ApiError(409, str(exc)) from None
        return http.json(200, job.to_dict())

    async def respawn(
        self,
        job_id: JobIdPath,
        token: Caller,
        ttl: TtlQuery = None,
    ) -> Response:
        job = await self._job(token, job_id)
        if job.state not in RESPAWNABLE:
            raise ApiError(409, f"job {job_id} is {job.state}; only dead, cancelled or expired "
                                "jobs can be respawned")  # fmt: skip
        if not await self.ops.respawn([job_id], ttl, token.namespace):
            raise ApiError(409, f"job {job_id} changed state meanwhile; nothing was done")
        return http.json(200, (await self._job(token, job_id)).to_dict())

    async def _job(self, token: Token, job_id: int) -> Job:
        job = await self.ops.find(job_id, token.namespace)
        if job is None:
            raise _not_found(job_id)
        return job

    # -- many jobs ---------------------------------------------------------------------

    async def list_jobs(
        self,
        token: Caller,
        state: State | None = None,
        queue: QueueQuery = None,
        task: TextQuery = None,
        lane: TextQuery = None,
        text: ArgsTextQuery = None,
        after: AfterQuery = None,
        limit: LimitQuery = 50,
    ) -> Response:
        found = await self.ops.jobs(JobFilter(
            namespace=token.namespace, queue=queue, state=state, task=task, lane=lane,
            text=text, after_id=after, limit=limit + 1,
        ))  # fmt: skip
        page = found[:limit]
        following = page[-1].id if len(found) > limit else None
        return http.json(200, {"jobs": [job.to_dict() for job in page], "next": following})

    async def dead_respawn(self, body: JobIdsIn, token: Caller) -> Response:
        dead = frozenset({State.DEAD})
        moved = await self.ops.respawn(body.ids, None, token.namespace, states=dead)
        return http.json(200, {"respawned": moved})

    async def dead_purge(self, body: JobIdsIn, token: Caller) -> Response:
        dead = frozenset({State.DEAD})
        purged = await self.ops.purge(body.ids, token.namespace, states=dead)
        return http.json(200, {"purged": purged})

    # -- lanes -------------------------------------------------------------------------

    async def lanes(self, token: Caller, limit: LimitQuery = 50) -> Response:
        found = await self.ops.lanes(token.namespace, limit)
        return http.json(200, {"lanes": [dataclasses.asdict(info) for info in found]})

    async def lane_limits(self, token: Caller) -> Response:
        rules = await self.ops.lane_rules(token.namespace)
        return http.json(200, {"limits": [dataclasses.asdict(rule) for rule in rules]})

    async def lane_limit_set(self, body: LaneLimitIn, token: Caller) -> Response:
        try:
            rule = await self.ops.set_lane_limit(
                token.namespace, body.pattern, body.limit, body.on_dead
            )
        except ValueError as exc:
            raise ApiError(400, str(exc)) from None
        return http.json(200, dataclasses.asdict(rule))

    async def lane_rate_set(self, body: LaneRateIn, token: Caller) -> Response:
        try:
            rule = await self.ops.set_lane_rate(token.namespace, body.pattern, body.n, body.per)
        except ValueError as exc:
            raise ApiError(400, str(exc)) from None
        return http.json(200, dataclasses.asdict(rule))

    async def lane_rate_delete(self, pattern: PatternQuery, token: Caller) -> Response:
        try:
            rule = await self.ops.clear_lane_rate(token.namespace, pattern)
        except ValueError as exc:
            raise ApiError(400, str(exc)) from None
        if rule is None:
            raise ApiError(404, f"no rule is set for {pattern!r}")
        return http.json(200, dataclasses.asdict(rule))

    async def lane_limit_delete(self, pattern: PatternQuery, token: Caller) -> Response:
        if not await self.ops.clear_lane_limit(token.namespace, pattern):
            raise ApiError(404, f"no limit is set for {pattern!r}")
        return NO_CONTENT

    # -- the namespace at large --------------------------------------------------------

    async def stats(self, token: Caller) -> Response:
        now = self.engine.now()
        found = await self.ops.stats(token.namespace)
        workers = [_worker(w, now) for w in found.workers]
        periodic = found.to_dict()["periodic"]
        return http.json(200, {"queues": found.counts, "workers": workers, "periodic": periodic})

    async def workers(self, token: Caller) -> Response:
        now = self.engine.now()
        workers = [_worker(w, now) for w in await self.ops.workers(token.namespace)]
        return http.json(200, {"workers": workers})


def native_router(engine: Engine) -> APIRouter:
    return NativeApi(engine).router()


def _job_options(namespace: str, body: JobOptionsIn, now: float) -> JobOptions:
    """JobOptions from the body, checked as the Python API checks them (400 if not)."""
    values = body.model_dump(include=set(JobOptionsIn.model_fields), exclude={"retry"})
    try:
        if values["after"] is not None:
            values["after"] = dependency_ids(values["after"])
        retry = None if body.retry is None else backoff.from_signed(body.retry)
        options = JobOptions(namespace=namespace, retry=retry, **values)
        options.validate(now)
    except ValueError as exc:
        raise ApiError(400, str(exc)) from None
    _storable_json(options.context, "context")
    return options


def _storable_json(value: Any, what: str) -> str:
    """``value`` as the JSON text to store: 400 for what no database can hold."""
    try:
        text = _json.dumps(value, what)
        text.encode()
    except SerializationError as exc:
        raise ApiError(400, str(exc)) from None
    except UnicodeEncodeError:
        raise ApiError(400, f"{what}: a string holds a lone surrogate, which cannot be "
                            "stored") from None  # fmt: skip
    return text


def _enqueued(handle: JobHandle) -> dict[str, Any]:
    return {"id": handle.id, "created": handle.created}


def _not_found(job_id: int) -> ApiError:
    return ApiError(404, f"no job with id {job_id}")


def _worker(worker: WorkerInfo, now: float) -> dict[str, Any]:
    return {
        "id": worker.id, "queues": worker.queues, "host": worker.host, "pid": worker.pid,
        "concurrency": worker.concurrency, "started_at": worker.started_at,
        "heartbeat_at": worker.heartbeat_at,
        "alive": worker.heartbeat_at >= now - insights.WORKER_ALIVE_SECONDS,
        "running": worker.running,
    }  # fmt: skip
