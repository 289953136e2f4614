"""The native JSON API under ``/v1`` (SPEC §16; described in docs/http-api.md).

Every call carries a namespace token (``X-Token: T`` or ``Authorization: Bearer T``),
checked before the body is read; the token's namespace scopes everything, so a job of
another namespace is "not found" exactly as a missing one. Jobs are enqueued through
``App.enqueue_raw`` with the options validated as the Python API validates them, and
read through the store and ``ferryq.insights``: the server holds one store for every
namespace. Every refusal is ``{"error": "message"}``; the request shapes are in
``native_models``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Coroutine, Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Security
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message

from ferryq import _json, backoff, insights, lanes, policy
from ferryq.errors import InvalidTransition, JobFailed, JobNotFound, SerializationError
from ferryq.handle import JobHandle
from ferryq.job import Job, State
from ferryq.policy import NAME_RE, JobOptions
from ferryq.server import http
from ferryq.server.engine import RECHECK_SECONDS, Engine
from ferryq.server.http import NO_CONTENT, RequestTooLarge, error
from ferryq.server.native_models import (
    MAX_TEXT,
    NO_NUL,
    BatchIn,
    BatchOut,
    EnqueuedOut,
    EnqueueIn,
    ErrorOut,
    ExplanationOut,
    JobFailedOut,
    JobIdsIn,
    JobOptionsIn,
    JobOut,
    JobPageOut,
    LaneLimitIn,
    LaneRuleOut,
    LaneRulesOut,
    LanesOut,
    PositiveSeconds,
    PurgedOut,
    RespawnedOut,
    ResultOut,
    StatsOut,
    WorkersOut,
)
from ferryq.server.tokens import POOL, split_pool
from ferryq.store.base import JobFilter, Store, Token, WorkerInfo

#: One job: args and context of up to 1 MiB each (App.max_payload_bytes), with room
#: for the escapes JSON may spend on them.
BODY_BYTES = 3 << 20
BATCH_BODY_BYTES = 16 << 20
MAX_PAGE = 1000
MAX_WAIT_SECONDS = 60.0
DEFAULT_WAIT_SECONDS = 30.0
RESPAWNABLE = frozenset({State.DEAD, State.CANCELLED, State.EXPIRED})
_TOKEN_KEY = "ferryq.token"


class ApiError(Exception):
    """A refusal: the status and the message of its ``{"error": ...}`` body."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


# -- the caller's token ----------------------------------------------------------------

_TOKEN_HEADER = APIKeyHeader(name="X-Token", auto_error=False, scheme_name="token")
_BEARER = HTTPBearer(auto_error=False, scheme_name="bearer")


async def _caller(
    request: Request,
    _header: Annotated[str | None, Security(_TOKEN_HEADER)],
    _bearer: Annotated[HTTPAuthorizationCredentials | None, Security(_BEARER)],
) -> Token:
    """The token the route class checked (the parameters document the schemes)."""
    token: Token = request.scope[_TOKEN_KEY]
    return token


Caller = Annotated[Token, Depends(_caller)]


async def _authorize(engine: Engine, request: Request) -> Token:
    raw = request.headers.get("x-token")
    if raw is None:
        scheme, _, value = request.headers.get("authorization", "").partition(" ")
        raw = value.strip() if scheme.lower() == "bearer" else None
    if not raw:
        raise ApiError(401, "token required: send it as X-Token or Authorization: Bearer")
    pool, secret = split_pool(raw)
    token = await engine.tokens.lookup(secret) if pool == POOL and secret else None
    if token is None:
        raise ApiError(401, "invalid token")
    return token


# -- what every route does first -------------------------------------------------------


def _route_class(engine: Engine) -> type[APIRoute]:
    class NativeRoute(APIRoute):
        """The token first, then a bounded body; every refusal as ``{"error": ...}``."""

        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            handle = super().get_route_handler()
            limit = BATCH_BODY_BYTES if self.path.endswith("/batch") else BODY_BYTES
            has_body = self.body_field is not None

            async def guarded(request: Request) -> Response:
                try:
                    request.scope[_TOKEN_KEY] = await _authorize(engine, request)
                    return await handle(await _bounded(request, limit) if has_body else request)
                except ApiError as exc:
                    return error(exc.status, exc.message)
                except RequestValidationError as exc:
                    return error(422, _describe(exc))
                except HTTPException as exc:  # FastAPI's own: a body it could not parse
                    return error(exc.status_code, str(exc.detail))

            return guarded

    return NativeRoute


async def _bounded(request: Request, limit: int) -> Request:
    """The request with its body read already, refused past ``limit`` bytes."""
    try:
        body = await http.read_body(request, limit)
    except RequestTooLarge:
        raise ApiError(413, f"the request body is over the limit of {limit} bytes") from None
    replayed = False

    async def receive() -> Message:
        nonlocal replayed
        if replayed:
            return await request.receive()
        replayed = True
        return {"type": "http.request", "body": body, "more_body": False}

    return Request(request.scope, receive)


def _describe(exc: RequestValidationError) -> str:
    problems = []
    for problem in list(exc.errors())[:5]:
        if problem.get("type") == "json_invalid":
            reason = problem.get("ctx", {}).get("error", "")
            problems.append(f"the body is not valid JSON: {reason}")
            continue
        loc = [str(part) for part in problem.get("loc", ())]
        where = ".".join(loc[1:]) or (loc[0] if loc else "request")
        problems.append(f"{where}: {problem.get('msg', 'invalid')}")
    return "; ".join(problems) or "invalid request"


# -- the documented answers ------------------------------------------------------------

_REFUSALS = {
    400: "Values the schema allows but ferryq refuses; the message says which.",
    401: "No token, or not a token of any namespace.",
    404: "No such job in the token's namespace (or no such lane rule).",
    409: "The job's state does not allow this.",
    413: "The request body is over the limit.",
    422: "The request does not match the schema: malformed JSON, wrong types, missing or "
    "unknown fields, values out of range.",
    429: "The token's publish rate limit is reached; retry later.",
}


def _refusals(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {code: {"model": ErrorOut, "description": _REFUSALS[code]}
            for code in sorted({401, *codes})}  # fmt: skip


def _answer(model: type[Any], description: str) -> dict[str, Any]:
    return {"model": model, "description": description}


JobIdPath = Annotated[int, Path(ge=1, le=(1 << 63) - 1, description="The job's id.")]
TextQuery = Annotated[str | None, Query(min_length=1, max_length=MAX_TEXT, pattern=NO_NUL)]
ArgsTextQuery = Annotated[
    str | None,
    Query(min_length=1, max_length=MAX_TEXT, pattern=NO_NUL,
          description="A substring of the job's arguments as JSON."),
]  # fmt: skip
AfterQuery = Annotated[
    int | None,
    Query(ge=1, le=(1 << 63) - 1, description="The `next` of the previous page."),
]
LimitQuery = Annotated[int, Query(ge=1, le=MAX_PAGE)]
WaitQuery = Annotated[
    float,
    Query(ge=0.0, le=MAX_WAIT_SECONDS, allow_inf_nan=False,
          description="Seconds to wait for the job to finish."),
]  # fmt: skip
TtlQuery = Annotated[PositiveSeconds | None, Query(description="A new ttl, from now.")]
PatternPath = Annotated[
    str, Path(max_length=MAX_TEXT, pattern=NO_NUL, description="A lane, or a prefix: tenant:*")
]


class NativeApi:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def router(self) -> APIRouter:
        router = APIRouter(prefix="/v1", route_class=_route_class(self.engine), tags=["v1"])
        job_routes: list[tuple[str, str, Callable[..., Any], dict[str, Any]]] = [
            ("POST", "/jobs", self.enqueue, dict(
                status_code=201, response_model=EnqueuedOut,
                responses={200: _answer(EnqueuedOut, "Deduplicated: an unfinished job (or one "
                                        "created within unique_for) has the unique_key."),
                           **_refusals(400, 413, 422, 429)},
                summary="Enqueue a job")),
            ("POST", "/jobs/batch", self.enqueue_batch, dict(
                status_code=201, response_model=BatchOut,
                responses={200: _answer(BatchOut, "Every job was deduplicated."),
                           **_refusals(400, 413, 422, 429)},
                summary="Enqueue jobs of one task and options, one per args, in one transaction")),
            ("GET", "/jobs", self.list_jobs, dict(
                response_model=JobPageOut, responses=_refusals(422),
                summary="List jobs, newest first, with keyset paging")),
            ("GET", "/jobs/{job_id}", self.get_job, dict(
                response_model=JobOut, responses=_refusals(404, 422), summary="A job")),
            ("GET", "/jobs/{job_id}/explain", self.explain, dict(
                response_model=ExplanationOut, responses=_refusals(404, 422),
                summary="Why a job is (not) running")),
            ("GET", "/jobs/{job_id}/result", self.result, dict(
                response_model=ResultOut,
                responses={202: _answer(ResultOut, "Not finished within the timeout; ask again."),
                           409: _answer(JobFailedOut, "The job ended dead, cancelled or "
                                        "expired; job_error is its stored error."),
                           **_refusals(404, 422)},
                summary="Wait for a job's result")),
            ("POST", "/jobs/{job_id}/cancel", self.cancel, dict(
                response_model=JobOut, responses=_refusals(404, 409, 422),
                summary="Cancel a job (a running one is asked to stop)")),
            ("POST", "/jobs/{job_id}/respawn", self.respawn, dict(
                response_model=JobOut, responses=_refusals(404, 409, 422),
                summary="Queue a dead, cancelled or expired job again")),
            ("POST", "/dead/respawn", self.dead_respawn, dict(
                response_model=RespawnedOut, responses=_refusals(400, 413, 422),
                summary="Queue dead jobs again with a fresh try count")),
            ("POST", "/dead/purge", self.dead_purge, dict(
                response_model=PurgedOut, responses=_refusals(400, 413, 422),
                summary="Delete dead jobs for good")),
            ("GET", "/lanes", self.lanes, dict(
                response_model=LanesOut, responses=_refusals(422),
                summary="Lanes with unfinished jobs, busiest first, then halted lanes")),
            ("GET", "/lanes/limits", self.lane_limits, dict(
                response_model=LaneRulesOut, responses=_refusals(),
                summary="Lane limits, by pattern")),
            ("PUT", "/lanes/limits/{pattern:path}", self.lane_limit_set, dict(
                response_model=LaneRuleOut, responses=_refusals(400, 413, 422),
                summary="Set the limit of a lane (post:42) or a prefix (tenant:*)")),
            ("DELETE", "/lanes/limits/{pattern:path}", self.lane_limit_delete, dict(
                status_code=204, response_class=Response, responses=_refusals(404, 422),
                summary="Remove a lane limit")),
            ("GET", "/stats", self.stats, dict(
                response_model=StatsOut, responses=_refusals(), summary="Jobs by queue and state")),
            ("GET", "/workers", self.workers, dict(
                response_model=WorkersOut, responses=_refusals(), summary="Registered workers")),
        ]  # fmt: skip
        for method, path, endpoint, options in job_routes:
            router.add_api_route(path, endpoint, methods=[method], **options)
        return router

    @property
    def store(self) -> Store:
        return self.engine.store

    # -- enqueue -----------------------------------------------------------------------

    async def enqueue(self, body: EnqueueIn, token: Caller) -> Response:
        [handle] = await self._enqueue(token, body.task, [body.args], body)
        return http.json(201 if handle.created else 200, _enqueued(handle))

    async def enqueue_batch(self, body: BatchIn, token: Caller) -> Response:
        handles = await self._enqueue(token, body.task, body.args, body)
        status = 201 if any(h.created for h in handles) else 200
        return http.json(status, {"jobs": [_enqueued(h) for h in handles]})

    async def _enqueue(
        self, token: Token, task: str, args: Sequence[Any], body: JobOptionsIn
    ) -> list[JobHandle]:
        options = _job_options(token.namespace, body)
        encoded = [_storable_json(one, f"arguments of {task}") for one in args]
        if not self.engine.limiter.take(token, "write", len(encoded)):
            raise ApiError(429, "the publish rate limit of this token is reached; retry later")
        try:
            handles = await self.engine.app.enqueue_raw(task, encoded, options)
        except SerializationError as exc:
            self.engine.limiter.refund(token, "write", len(encoded))
            raise ApiError(400, str(exc)) from None
        except BaseException:
            self.engine.limiter.refund(token, "write", len(encoded))
            raise
        self.engine.notify()
        return handles

    # -- one job -----------------------------------------------------------------------

    async def get_job(self, job_id: JobIdPath, token: Caller) -> Response:
        return http.json(200, (await self._job(token, job_id)).to_dict())

    async def explain(self, job_id: JobIdPath, token: Caller) -> Response:
        await self._job(token, job_id)
        try:
            explanation = await insights.explain(self.store, job_id, self.engine.now())
        except JobNotFound:
            raise _not_found(job_id) from None
        return http.json(200, explanation.to_dict())

    async def result(
        self,
        job_id: JobIdPath,
        token: Caller,
        timeout: WaitQuery = DEFAULT_WAIT_SECONDS,
    ) -> Response:
        job = await self._wait(await self._job(token, job_id), timeout)
        if job.state == State.SUCCEEDED:
            return http.json(200, {"id": job.id, "state": job.state, "result": job.result})
        if job.terminal:
            message = str(JobFailed(job.id, job.state, job.error))
            return http.json(409, {"error": message, "id": job.id, "state": job.state,
                                   "job_error": job.error})  # fmt: skip
        return http.json(202, {"id": job.id, "state": job.state, "result": None})

    async def _wait(self, job: Job, timeout: float) -> Job:
        """The job once terminal, or as it is when ``timeout`` runs out (or the server
        stops)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        poll = 0.002
        while not job.terminal and not self.engine.closing:
            left = deadline - loop.time()
            if left <= 0:
                break
            await self.store.wait_for_finish(min(left, RECHECK_SECONDS), poll)
            poll = min(poll * 1.5, 0.1)
            found = await self.store.job_get(job.id)
            if found is None:
                raise _not_found(job.id)
            job = found
        return job

    async def cancel(self, job_id: JobIdPath, token: Caller) -> Response:
        await self._job(token, job_id)
        try:
            job = await self.store.job_cancel(job_id, self.engine.now())
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
        now = self.engine.now()
        if not await self.store.job_respawn([job_id], now, policy.expires_at(now, ttl)):
            raise ApiError(409, f"job {job_id} changed state meanwhile; nothing was done")
        self.engine.notify()
        return http.json(200, (await self._job(token, job_id)).to_dict())

    async def _job(self, token: Token, job_id: int) -> Job:
        job = await self.store.job_get(job_id)
        if job is None or job.namespace != token.namespace:
            raise _not_found(job_id)
        return job

    # -- many jobs ---------------------------------------------------------------------

    async def list_jobs(
        self,
        token: Caller,
        state: State | None = None,
        queue: Annotated[str | None, Query(pattern=NAME_RE.pattern)] = None,
        task: TextQuery = None,
        lane: TextQuery = None,
        text: ArgsTextQuery = None,
        after: AfterQuery = None,
        limit: LimitQuery = 50,
    ) -> Response:
        found = await self.store.job_list(JobFilter(
            namespace=token.namespace, queue=queue, state=state, task=task, lane=lane,
            text=text, after_id=after, limit=limit + 1,
        ))  # fmt: skip
        page = found[:limit]
        following = page[-1].id if len(found) > limit else None
        return http.json(200, {"jobs": [job.to_dict() for job in page], "next": following})

    async def dead_respawn(self, body: JobIdsIn, token: Caller) -> Response:
        ids = await self._dead(token, body.ids)
        moved = await self.store.job_respawn(ids, self.engine.now()) if ids else []
        if moved:
            self.engine.notify()
        return http.json(200, {"respawned": moved})

    async def dead_purge(self, body: JobIdsIn, token: Caller) -> Response:
        ids = await self._dead(token, body.ids)
        purged = await self.store.job_purge(ids, self.engine.now()) if ids else 0
        if purged:
            self.engine.notify()  # a purge can release a halted lane
        return http.json(200, {"purged": purged})

    async def _dead(self, token: Token, job_ids: Sequence[int]) -> list[int]:
        """The ids (once each, in order) of the dead jobs among these, in the namespace."""
        dead = []
        for job_id in dict.fromkeys(job_ids):
            job = await self.store.job_get(job_id)
            if job is not None and job.namespace == token.namespace and job.state == State.DEAD:
                dead.append(job_id)
        return dead

    # -- lanes -------------------------------------------------------------------------

    async def lanes(self, token: Caller, limit: LimitQuery = 50) -> Response:
        found = await self.store.lane_list(token.namespace, limit)
        return http.json(200, {"lanes": [dataclasses.asdict(info) for info in found]})

    async def lane_limits(self, token: Caller) -> Response:
        rules = await self.store.lane_rules(token.namespace)
        return http.json(200, {"limits": [dataclasses.asdict(rule) for rule in rules]})

    async def lane_limit_set(
        self, pattern: PatternPath, body: LaneLimitIn, token: Caller
    ) -> Response:
        try:
            rule = lanes.check_rule(pattern, body.limit, body.on_dead)
        except ValueError as exc:
            raise ApiError(400, str(exc)) from None
        await self.store.lane_rule_set(token.namespace, rule, self.engine.now())
        self.engine.notify()  # a higher limit admits jobs at once
        return http.json(200, dataclasses.asdict(rule))

    async def lane_limit_delete(self, pattern: PatternPath, token: Caller) -> Response:
        if not await self.store.lane_rule_delete(token.namespace, pattern, self.engine.now()):
            raise ApiError(404, f"no limit is set for {pattern!r}")
        self.engine.notify()
        return NO_CONTENT

    # -- the namespace at large --------------------------------------------------------

    async def stats(self, token: Caller) -> Response:
        now = self.engine.now()
        found = await insights.stats(self.store, token.namespace, now)
        workers = [_worker(w, now) for w in found.workers]
        return http.json(200, {"queues": found.counts, "workers": workers})

    async def workers(self, token: Caller) -> Response:
        now = self.engine.now()
        listed = await self.store.worker_list()
        workers = [_worker(w, now) for w in listed if w.namespace == token.namespace]
        return http.json(200, {"workers": workers})


def native_router(engine: Engine) -> APIRouter:
    return NativeApi(engine).router()


def _job_options(namespace: str, body: JobOptionsIn) -> JobOptions:
    """JobOptions from the body, checked as the Python API checks them (400 if not)."""
    values = body.model_dump(include=set(JobOptionsIn.model_fields), exclude={"retry"})
    try:
        retry = None if body.retry is None else backoff.from_signed(body.retry)
        options = JobOptions(namespace=namespace, retry=retry, **values)
        options.validate()
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
