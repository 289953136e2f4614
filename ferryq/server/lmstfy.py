"""The lmstfy-compatible queue API under ``/api`` (see docs/http-api.md).

Jobs published here are ordinary ferryq jobs: namespace and queue as given, task
``lmstfy``, args the body (as text when it is UTF-8, else base64, said in ``meta``),
``max_tries`` = ``tries``, retried at once when a lease runs out (lmstfy puts the job
back at the end of its queue). Consumers lease jobs for the ``ttr`` they ask for; an
ack ends the job as succeeded. Job ids are ferryq's ids, as decimal strings.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json as jsonlib
import re
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ferryq import backoff, tracecontext
from ferryq.insights import HTTP_TASK
from ferryq.job import MAX_JOB_ID, Job, State
from ferryq.ops import Token
from ferryq.policy import JobOptions, expires_before_due
from ferryq.server import http
from ferryq.server.engine import Engine
from ferryq.server.http import NO_CONTENT, RequestTooLarge, error, parse_uint
from ferryq.server.tokens import POOL, split_pool

TASK = HTTP_TASK
DEFAULT_TTL = 86400
DEFAULT_TRIES = 1
DEFAULT_TTR = 120
MAX_ATTRIBUTES = 16
MAX_BULK = 64
MAX_COUNT = 100
#: A consume blocks at most this long, whatever its timeout asks (it may ask again).
MAX_BLOCK_SECONDS = 600
#: Dead-letter respawns and deletes work through this many jobs per statement.
DEAD_BATCH = 1000
#: A body is bounded as it arrives (MAX_BODY_BYTES); stored as a JSON string it may grow:
#: by a third as base64, up to six times as escaped text.
ARGS_LIMIT = 6 * http.MAX_BODY_BYTES + 2

Handler = Callable[[Request, str, str, Token], Awaitable[Response]]


class LmstfyApi:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def routes(self) -> list[Route]:
        def route(path: str, method: str, handler: Handler, *, token: bool = True) -> Route:
            return http.route(f"/api/{{ns}}/{{q}}{path}", self._guard(handler, token), [method])

        return [
            route("", "PUT", self.publish),
            route("/bulk", "PUT", self.publish_bulk),
            route("/job/{job_id}", "PUT", self.republish),
            http.route("/api/{ns}/{q}", self.lmstfy_consume, ["GET"]),
            route("/job/{job_id}", "DELETE", self.ack),
            route("/peek", "GET", self.peek_queue),
            route("/job/{job_id}", "GET", self.peek_job),
            route("/size", "GET", self.size, token=False),
            route("", "DELETE", self.destroy),
            route("/deadletter", "GET", self.dead_peek),
            route("/deadletter", "PUT", self.dead_respawn),
            route("/deadletter", "DELETE", self.dead_delete),
            route("/deadletter/size", "GET", self.dead_size, token=False),
        ]

    # -- checks every route shares ----------------------------------------------

    def _guard(
        self, handler: Handler, token_needed: bool
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            namespace, queue = request.path_params["ns"], request.path_params["q"]
            if (problem := http.name_error(namespace, queue)) is not None:
                return error(400, problem)
            token = _NO_TOKEN
            if token_needed:
                found = await self._authorize(request, namespace)
                if isinstance(found, Response):
                    return found
                token = found
            return await handler(request, namespace, queue, token)

        endpoint.__name__ = f"lmstfy_{handler.__name__}"
        return endpoint

    async def _authorize(self, request: Request, namespace: str) -> Token | Response:
        raw = request.headers.get("x-token") or http.query(request, "token")
        if not raw:
            return error(401, "token not found")
        pool, secret = split_pool(raw)
        if pool != POOL:
            return error(404, "pool not found")
        token = await self.engine.tokens.lookup(secret)
        if token is None or token.namespace != namespace:
            return error(401, "invalid token")
        return token

    def _limited(self, token: Token, kind: str, n: int = 1) -> Response | None:
        if self.engine.limiter.take(token, kind, n):
            return None
        verb = "consume" if kind == "read" else "publish"
        return error(429, f"the {verb} of this token has reach the limit rate, please retry later",
                     key="msg")  # fmt: skip

    # -- publish -----------------------------------------------------------------

    async def publish(self, request: Request, ns: str, q: str, token: Token) -> Response:
        return await self._publish(request, ns, q, token, replaces=None)

    async def republish(self, request: Request, ns: str, q: str, token: Token) -> Response:
        """Drop job ``job_id`` and publish the body as a new job; a refused request
        leaves the old job as it was."""
        return await self._publish(request, ns, q, token, replaces=_job_id(request))

    async def _publish(
        self, request: Request, ns: str, q: str, token: Token, replaces: int | None
    ) -> Response:
        options = _publish_options(request, ns, q)
        if isinstance(options, Response):
            return options
        try:
            body = await http.read_body(request)
        except RequestTooLarge:
            return error(413, "body too large")
        if (refused := self._limited(token, "write")) is not None:
            return refused
        try:
            if replaces is not None:
                await self.engine.ack(ns, q, replaces)
            ids = await self._insert(options, [body])
        except BaseException:
            self.engine.limiter.refund(token, "write")
            raise
        return http.json(201, {"msg": "published", "job_id": ids[0]})

    async def publish_bulk(self, request: Request, ns: str, q: str, token: Token) -> Response:
        options = _publish_options(request, ns, q)
        if isinstance(options, Response):
            return options
        try:
            raw = await http.read_body(request, MAX_BULK * http.MAX_BODY_BYTES)
        except RequestTooLarge:
            return error(413, "body too large")
        items = _json_array(raw)
        if items is None:
            return error(400, "request body should be an array of objects")
        if not items:
            return error(400, "no jobs")
        if len(items) > MAX_BULK:
            return error(400, "too many jobs")
        bodies = compact_elements(raw)
        if any(len(b) > http.MAX_BODY_BYTES for b in bodies):
            return error(413, "job too large")
        if (refused := self._limited(token, "write", len(bodies))) is not None:
            return refused
        try:
            ids = await self._insert(options, bodies)
        except BaseException:
            self.engine.limiter.refund(token, "write", len(bodies))
            raise
        return http.json(201, {"msg": "published", "job_ids": ids})

    async def _insert(self, options: JobOptions, bodies: list[bytes]) -> list[str]:
        encoded = [_encode_body(body) for body in bodies]
        texts = [jsonlib.dumps(text, ensure_ascii=False) for text, _ in encoded]
        encodings = {encoding for _, encoding in encoded}

        def enqueue(texts: list[str], encoding: str) -> Awaitable[list[int]]:
            with_encoding = _with_encoding(options, encoding)
            return self.engine.enqueue(TASK, texts, with_encoding, payload_limit=ARGS_LIMIT)

        if len(encodings) == 1:
            ids = await enqueue(texts, encodings.pop())
        else:  # a bulk of text and binary bodies: one by one, so ids keep the order
            ids = [
                (await enqueue([text], encoding))[0]
                for text, (_, encoding) in zip(texts, encoded, strict=True)
            ]
        return [str(job_id) for job_id in ids]

    # -- consume and ack ---------------------------------------------------------

    async def lmstfy_consume(self, request: Request) -> Response:
        arrived = asyncio.get_running_loop().time()  # a blocking consume's wait counts from here
        namespace, queues_raw = request.path_params["ns"], request.path_params["q"]
        queues = queues_raw.split(",")
        if len(namespace) > http.MAX_NAME_LENGTH:
            return error(400, "namespace or queue name too long")
        if not http.NAME.fullmatch(namespace):
            return error(400, "namespace name contains forbidden characters")
        if not all(http.queue_name_ok(q) for q in queues) or len(set(queues)) != len(queues):
            return error(400, "invalid queue name(s)")
        found = await self._authorize(request, namespace)
        if isinstance(found, Response):
            return found
        return await self.consume(request, namespace, queues, found, arrived)

    async def consume(
        self, request: Request, ns: str, queues: list[str], token: Token, arrived: float
    ) -> Response:
        ttr = parse_uint(http.query(request, "ttr"), DEFAULT_TTR, 32)
        if ttr is None or ttr == 0:
            return error(400, "invalid ttr")
        timeout = parse_uint(http.query(request, "timeout"), 0, 32)
        if timeout is None:
            return error(400, "invalid timeout")
        count = parse_uint(http.query(request, "count"), 1, 32)
        if count is None or not 1 <= count <= MAX_COUNT:
            return error(400, "invalid count")
        if (refused := self._limited(token, "read")) is not None:
            return refused
        timeout = min(timeout, MAX_BLOCK_SECONDS)
        jobs = await self._take(request, ns, queues, count, ttr, timeout, arrived)
        if not jobs:
            self.engine.limiter.refund(token, "read")
            return error(404, "no job available", key="msg")
        self.engine.ops.delivered(jobs)
        now = self.engine.now()
        if count == 1:
            return http.json(200, job_object(jobs[0], now, new=True))
        return http.json(200, [job_object(job, now, new=True) for job in jobs])

    async def _take(
        self,
        request: Request,
        ns: str,
        queues: list[str],
        count: int,
        ttr: int,
        timeout: int,
        arrived: float,
    ) -> list[Job]:
        """Engine.take, watching the connection while it waits: a client that goes away
        ends the wait, and jobs taken by then go back (nobody would receive them)."""
        if timeout <= 0:
            return await self.engine.take(ns, queues, count, ttr, timeout)
        gone = asyncio.Event()
        watcher = asyncio.create_task(_until_disconnected(request, gone))
        try:
            jobs = await self.engine.take(ns, queues, count, ttr, timeout, gone, arrived)
            if jobs and gone.is_set():
                await self.engine.give_back(jobs)
                return []
            return jobs
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher

    async def ack(self, request: Request, ns: str, q: str, token: Token) -> Response:
        job_id = _job_id(request)
        if job_id is None:
            return NO_CONTENT
        await self.engine.ack(ns, q, job_id)
        return NO_CONTENT

    # -- looking at a queue ------------------------------------------------------

    async def peek_queue(self, request: Request, ns: str, q: str, token: Token) -> Response:
        job = await self.engine.ops.peek(ns, q)
        if job is None:
            return error(404, "the queue is empty")
        return http.json(200, job_object(job, self.engine.now()))

    async def peek_job(self, request: Request, ns: str, q: str, token: Token) -> Response:
        job_id = _job_id(request)
        job = None if job_id is None else await self.engine.ops.find(job_id, ns)
        if job is None or job.queue != q or job.state in _GONE:
            return error(404, "job not found")
        return http.json(200, job_object(job, self.engine.now()))

    async def size(self, request: Request, ns: str, q: str, token: Token) -> Response:
        size = await self.engine.ops.size(ns, q, State.READY)
        return http.json(200, {"namespace": ns, "queue": q, "size": size})

    async def destroy(self, request: Request, ns: str, q: str, token: Token) -> Response:
        await self.engine.ops.clear(ns, q)
        return NO_CONTENT

    # -- dead letters ------------------------------------------------------------

    async def dead_peek(self, request: Request, ns: str, q: str, token: Token) -> Response:
        size = await self.engine.ops.size(ns, q, State.DEAD)
        head = await self.engine.ops.dead_oldest(ns, q, 1)
        return http.json(200, {"namespace": ns, "queue": q, "deadletter_size": size,
                               "deadletter_head": str(head[0]) if head else ""})  # fmt: skip

    async def dead_respawn(self, request: Request, ns: str, q: str, token: Token) -> Response:
        limit = _dead_limit(request)
        if limit is None:
            return error(400, "invalid limit")
        ttl = parse_uint(http.query(request, "ttl"), DEFAULT_TTL, 32)
        if ttl is None:
            return error(400, "invalid ttl")
        ops = self.engine.ops

        async def respawn(ids: list[int]) -> int:
            return len(await ops.respawn(ids, ttl or None, max_tries=1))

        count = await self._oldest_dead(ns, q, limit, respawn)
        return http.json(200, {"msg": "respawned", "count": count})

    async def dead_delete(self, request: Request, ns: str, q: str, token: Token) -> Response:
        limit = _dead_limit(request)
        if limit is None:
            return error(400, "invalid limit")
        await self._oldest_dead(ns, q, limit, self.engine.ops.purge)
        return NO_CONTENT

    async def _oldest_dead(
        self, ns: str, q: str, limit: int, act: Callable[[list[int]], Awaitable[int]]
    ) -> int:
        """``act`` on the ``limit`` oldest dead jobs of the queue, DEAD_BATCH at a time
        (each a statement of bounded size); how many it acted on."""
        done = seen = 0
        while seen < limit:
            want = min(limit - seen, DEAD_BATCH)
            ids = await self.engine.ops.dead_oldest(ns, q, want)
            acted = await act(ids) if ids else 0
            done += acted
            seen += len(ids)
            if len(ids) < want or not acted:  # no more, or none of them could move
                break
        return done

    async def dead_size(self, request: Request, ns: str, q: str, token: Token) -> Response:
        size = await self.engine.ops.size(ns, q, State.DEAD)
        return http.json(200, {"namespace": ns, "queue": q, "size": size})


#: States in which lmstfy would no longer have the job: acked, destroyed or dropped.
_GONE = frozenset({State.SUCCEEDED, State.CANCELLED, State.EXPIRED})
_NO_TOKEN = Token("", "", "", "", 0.0)
_ESCAPED_BYTE = re.compile("[\udc80-\udcff]")


async def _until_disconnected(request: Request, gone: asyncio.Event) -> None:
    """Set ``gone`` when the client closes the connection (ASGI's ``http.disconnect``).
    A consume has no use for a body: its ``http.request`` messages are passed over."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    gone.set()


def job_object(job: Job, now: float, *, new: bool = False) -> dict[str, Any]:
    """A job as lmstfy shows it to consumers (consume, peek)."""
    http_meta = job.meta.get("http", {}) if isinstance(job.meta, dict) else {}
    ttl = 0 if job.expires_at is None else max(round(job.expires_at - now), 1)
    body: dict[str, Any] = {"msg": "new job"} if new else {}
    body.update(
        namespace=job.namespace,
        queue=job.queue,
        job_id=str(job.id),
        data=_body_base64(job.args, http_meta.get("encoding")),
        ttl=ttl,
        elapsed_ms=max(int((now - job.created_at) * 1000), 0),
        remain_tries=max(job.max_tries - job.attempts, 0),
        attributes=http_meta.get("attributes"),
    )
    return body


def _json_array(raw: bytes) -> list[Any] | None:
    """The elements of a body that is a JSON array, or None.

    Read as Go's decoder reads it where Python's is lenient: UTF-8 only (no byte order
    mark, no UTF-16 or UTF-32, which ``json.loads`` guesses from bytes), and no ``NaN``
    or ``Infinity``. A body nested deeper than the parser goes is refused too.
    """
    try:
        parsed = jsonlib.loads(raw.decode("utf-8"), parse_constant=_not_json)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None
    return parsed if isinstance(parsed, list) else None


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


def compact_elements(array: bytes) -> list[bytes]:
    """The elements of a valid JSON array as their own text, without the white space
    between tokens (as Go's ``json.Compact`` leaves them): numbers, escapes and key
    order stay exactly as the client wrote them."""
    elements: list[bytes] = []
    current = bytearray()
    depth = 0
    i = 0
    while i < len(array):
        byte = array[i]
        if byte == 0x22:  # a string, copied whole
            end = _string_end(array, i)
            current += array[i:end]
            i = end
            continue
        i += 1
        if byte in b" \t\r\n":
            continue
        if byte in b"[{":
            depth += 1
            if depth == 1:  # the array's own bracket
                continue
        elif byte in b"]}":
            depth -= 1
            if depth == 0:
                break
        elif byte == 0x2C and depth == 1:  # a comma between elements
            elements.append(bytes(current))
            current = bytearray()
            continue
        current.append(byte)
    if current:
        elements.append(bytes(current))
    return elements


def _string_end(text: bytes, start: int) -> int:
    """The index just past the closing quote of the string opening at ``start``."""
    i = start + 1
    while True:
        quote = text.index(b'"', i)
        backslashes = 0
        while text[quote - 1 - backslashes] == 0x5C:
            backslashes += 1
        if backslashes % 2 == 0:
            return quote + 1
        i = quote + 1


def _publish_options(request: Request, ns: str, q: str) -> JobOptions | Response:
    delay = parse_uint(http.query(request, "delay"), 0, 32)
    if delay is None:
        return error(400, "invalid delay")
    ttl = parse_uint(http.query(request, "ttl"), DEFAULT_TTL, 32)
    if ttl is None:
        return error(400, "invalid ttl")
    tries = parse_uint(http.query(request, "tries"), DEFAULT_TRIES, 16)
    if tries is None:
        return error(400, "invalid tries")
    if ttl and expires_before_due(ttl, delay):  # ttl 0 is no expiry
        return error(400, "ttl is shorter than delay")
    if tries == 0:
        return error(400, "tries shouldn't be zero")
    attributes = _attributes(request)
    if isinstance(attributes, Response):
        return attributes
    versioned = request.headers.get("enable-job-version", "").upper() == "YES"
    meta: dict[str, Any] = {"http": {"attributes": attributes, "versioned": versioned}}
    if (trace := tracecontext.from_headers(request.headers)) is not None:
        meta[tracecontext.META_KEY] = trace
    return JobOptions(
        namespace=ns, queue=q, delay=float(delay), ttl=float(ttl) if ttl else None,
        max_tries=tries, ttr=float(DEFAULT_TTR), retry=backoff.fixed(0), meta=meta,
    )  # fmt: skip


def _attributes(request: Request) -> dict[str, str] | Response | None:
    found: dict[str, str] = {}
    for raw_name, raw_value in request.headers.raw:
        name = raw_name.decode("latin-1").lower()
        if name.startswith("job-attr-") and len(name) > len("job-attr-"):
            found[name[len("job-attr-") :][:32]] = _header_text(raw_value)[:128]
    if len(found) > MAX_ATTRIBUTES:
        return error(400, f"too many attributes, cannot exceed {MAX_ATTRIBUTES}")
    return found or None


def _header_text(raw: bytes) -> str:
    """A header value as the UTF-8 text the client sent (Starlette's ``headers`` decode
    it as Latin-1), each byte that is not UTF-8 as U+FFFD, as Go's JSON encoder writes
    it: surrogateescape gives each such byte a surrogate of its own."""
    return _ESCAPED_BYTE.sub("\ufffd", raw.decode("utf-8", "surrogateescape"))


def _with_encoding(options: JobOptions, encoding: str) -> JobOptions:
    meta = {**options.meta, "http": {**options.meta["http"], "encoding": encoding}}
    return options.merged(meta=meta)


def _encode_body(body: bytes) -> tuple[str, str]:
    """A body as a JSON string: its text when it is UTF-8, else base64."""
    try:
        return body.decode(), "text"
    except UnicodeDecodeError:
        return base64.b64encode(body).decode(), "base64"


def _body_base64(args: Any, encoding: str | None) -> str | None:
    if not isinstance(args, str):  # a job enqueued by other means: its args as JSON
        return base64.b64encode(jsonlib.dumps(args).encode()).decode()
    if encoding == "base64":
        try:
            base64.b64decode(args, validate=True)
            return args
        except binascii.Error:
            pass
    return base64.b64encode(args.encode()).decode()


def _job_id(request: Request) -> int | None:
    """The job id of the path; None for what cannot be one of ours: not decimal digits,
    or beyond the int64 ids of the store (lmstfy answers those as unknown ids)."""
    raw = request.path_params.get("job_id", "")
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 19):
        return None
    job_id = int(raw)
    return job_id if job_id <= MAX_JOB_ID else None


def _dead_limit(request: Request) -> int | None:
    limit = http.parse_int(http.query(request, "limit"), 1)
    return limit if limit is not None and limit > 0 else None
