"""A real ``ferryq server`` on loopback, and a small lmstfy client for talking to it.

The server is started exactly as an operator would start it, through the suite's one
harness for processes (tests/processes.py)::

    python -m ferryq server --url URL --host 127.0.0.1 --port 0 \
        --admin-host 127.0.0.1 --admin-port 0 [--admin-credential USER:PASSWORD]

and announces itself with one line on stdout once both listeners accept connections::

    ferryq server listening api=http://127.0.0.1:PORT admin=http://127.0.0.1:PORT

Everything here is written from the protocol as documented (docs/http-api.md), never
from the server's code: these tests are the protocol's side of the contract.
"""

from __future__ import annotations

import base64
import functools
import os
import re
import ssl
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import httpx

from tests.processes import Process, ProcessFailed, python, tail, wait_until

LISTENING = re.compile(r"^ferryq server listening api=(http://\S+) admin=(http://\S+)$")
STOP_SECONDS = 15.0  # from SIGTERM to exit
HTTP_TIMEOUT = 15.0  # longer than any blocking consume the tests make (10 s at most)
CREDENTIAL_ENV = "FERRYQ_ADMIN_CREDENTIAL"
SESSION_SECRET_ENV = "FERRYQ_SESSION_SECRET"

JOB_KEYS = frozenset(
    {"namespace", "queue", "job_id", "data", "ttl", "elapsed_ms", "remain_tries", "attributes"}
)
CONSUMED_KEYS = JOB_KEYS | {"msg"}
NO_JOB = {"msg": "no job available"}
LIMIT_MESSAGE = "reach the limit rate, please retry later"
MiB = 1 << 20

Params = Mapping[str, str | int]


@functools.cache
def _tls() -> ssl.SSLContext:
    return ssl.create_default_context()


def http_client(base_url: str, **options: Any) -> httpx.Client:
    """An HTTP client for a server under test. Its TLS context, never used on these
    plain-HTTP URLs, is made once for the run: httpx makes one for every client
    otherwise, loading the system's certificates, a tenth of a second with the machine
    busy, twice a test."""
    return httpx.Client(base_url=base_url, verify=_tls(), **options)


Case = TypeVar("Case")


class ServerStartError(AssertionError):
    """The server did not come up as its command-line contract says."""


def server_command(
    url: str, *, admin_host: str = "127.0.0.1", credential: str | None = None
) -> list[str]:
    argv = python("ferryq", "server", "--url", url, "--host", "127.0.0.1", "--port", "0",
                  "--admin-host", admin_host, "--admin-port", "0")  # fmt: skip
    if credential is not None:
        argv += ["--admin-credential", credential]
    return argv


def server_env(
    credential_env: str | None = None, session_secret_env: str | None = None
) -> dict[str, str]:
    """The environment of the test run, without an admin credential or a session
    secret unless one is given."""
    unset = (CREDENTIAL_ENV, SESSION_SECRET_ENV)
    env = {key: value for key, value in os.environ.items() if key not in unset}
    for name, value in ((CREDENTIAL_ENV, credential_env), (SESSION_SECRET_ENV, session_secret_env)):
        if value is not None:
            env[name] = value
    return env


@dataclass
class ServerProcess:
    """A running ``ferryq server``; ``stop()`` ends it the way an operator would."""

    process: Process
    url: str
    api: str
    admin: str
    admin_auth: tuple[str, str] | None = None

    @property
    def stdout_lines(self) -> list[str]:
        """Every line it wrote to stdout but the first (the listening line)."""
        return self.process.stdout().splitlines()[1:]

    def stderr(self) -> str:
        return self.process.stderr()

    def stop(self) -> int:
        """SIGTERM, then the exit code; a server that does not exit in time is killed
        and the test fails, quoting its log."""
        return self.process.stop(STOP_SECONDS)

    def admin_client(self, auth: tuple[str, str] | None = None) -> httpx.Client:
        return http_client(self.admin, timeout=HTTP_TIMEOUT, auth=auth or self.admin_auth)

    def api_client(self) -> httpx.Client:
        return http_client(self.api, timeout=HTTP_TIMEOUT)

    def create_token(self, namespace: str, description: str = "ferryq tests") -> str:
        """A new token for ``namespace`` through the admin API."""
        with self.admin_client() as admin:
            created = admin.post(f"/token/{namespace}", params={"description": description})
        assert created.status_code == 201, created.text
        token = created.json()["token"]
        assert isinstance(token, str) and token
        return token


def start_server(
    url: str,
    log_dir: Path,
    *,
    credential: str | None = None,
    credential_env: str | None = None,
    session_secret_env: str | None = None,
    options: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> ServerProcess:
    """Start the server (``options`` added to its command line, ``env`` to use instead
    of the run's) and wait (at most START_SECONDS) for its listening line."""
    environ = dict(env) if env is not None else server_env(credential_env, session_secret_env)
    process = Process([*server_command(url, credential=credential), *options], log_dir,
                      f"server-{uuid.uuid4().hex[:8]}", env=environ)  # fmt: skip
    try:
        out = process.wait_for(lambda out: "\n" in out, stream="stdout")
    except ProcessFailed as failed:
        process.kill()
        raise ServerStartError(str(failed)) from None
    first = out.splitlines()[0]
    match = LISTENING.match(first)
    if match is None:
        process.kill()
        raise ServerStartError(
            f"the server's first stdout line is not the listening line: {first!r}\n"
            f"{process.describe()}"
        )
    auth = None
    used = credential if credential is not None else credential_env
    if used is not None:
        user, _, password = used.partition(":")
        auth = (user, password)
    return ServerProcess(process, url, match[1], match[2], auth)


@contextmanager
def running_server(
    url: str,
    log_dir: Path,
    *,
    credential: str | None = None,
    credential_env: str | None = None,
    session_secret_env: str | None = None,
    options: Sequence[str] = (),
) -> Iterator[ServerProcess]:
    """A server for the duration of the block; it must exit 0 on SIGTERM afterwards."""
    server = start_server(url, log_dir, credential=credential, credential_env=credential_env,
                          session_secret_env=session_secret_env, options=options)  # fmt: skip
    try:
        yield server
    finally:
        code = server.stop()
    assert code == 0, f"the server exited with {code} on SIGTERM\n{tail(server.stderr())}"


def new_namespace() -> str:
    return f"ns-{uuid.uuid4().hex[:12]}"


def b64(body: bytes) -> str:
    return base64.b64encode(body).decode()


def each(cases: Iterable[Case], check: Callable[[Case], object]) -> None:
    """Run ``check`` on every case and fail once, naming every case that failed.

    One test per group of cases instead of one per case: a server start is shared
    anyway, and per-test overhead is most of the suite's time.
    """
    failures = []
    for case in cases:
        try:
            check(case)
        except AssertionError as exc:
            failures.append(f"{case!r}: {exc}")
    assert not failures, f"{len(failures)} case(s) failed:\n" + "\n".join(failures)


class Lmstfy:
    """One namespace on the server under test, with its token: lmstfy's API as methods.

    Methods return the raw ``httpx.Response``; the ``*_ok`` variants also check the
    success status and return what a client would use.
    """

    def __init__(self, server: ServerProcess, namespace: str, token: str) -> None:
        self.server = server
        self.namespace = namespace
        self.token = token
        self.http = server.api_client()

    def close(self) -> None:
        self.http.close()

    # -- plumbing -------------------------------------------------------------------

    def path(self, queue: str, *rest: str) -> str:
        parts = [self.namespace, queue, *(quote(part, safe="") for part in rest)]
        return "/api/" + "/".join(parts)

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Params | None = None,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        token: str | None = "",
    ) -> httpx.Response:
        """``token=""`` sends this namespace's token as X-Token; ``None`` sends none."""
        sent = dict(headers or {})
        if token is not None:
            sent.setdefault("X-Token", token or self.token)
        return self.http.request(
            method, path, params=dict(params or {}), content=content, headers=sent
        )

    # -- queue API --------------------------------------------------------------------

    def publish(
        self,
        queue: str,
        body: bytes = b"",
        *,
        headers: Mapping[str, str] | None = None,
        **params: str | int,
    ) -> httpx.Response:
        return self.request("PUT", self.path(queue), params=params, content=body, headers=headers)

    def publish_ok(
        self,
        queue: str,
        body: bytes = b"",
        *,
        headers: Mapping[str, str] | None = None,
        **params: str | int,
    ) -> str:
        published = self.publish(queue, body, headers=headers, **params)
        assert published.status_code == 201, published.text
        answer = published.json()
        assert answer["msg"] == "published"
        assert isinstance(answer["job_id"], str) and answer["job_id"]
        return str(answer["job_id"])

    def bulk(self, queue: str, body: bytes, **params: str | int) -> httpx.Response:
        return self.request("PUT", self.path(queue, "bulk"), params=params, content=body)

    def republish(
        self, queue: str, job_id: str, body: bytes, **params: str | int
    ) -> httpx.Response:
        return self.request("PUT", self.path(queue, "job", job_id), params=params, content=body)

    def consume(self, queues: str, **params: str | int) -> httpx.Response:
        return self.request("GET", self.path(queues), params=params)

    def consume_ok(self, queues: str, **params: str | int) -> dict[str, Any]:
        consumed = self.consume(queues, **params)
        assert consumed.status_code == 200, consumed.text
        job = consumed.json()
        assert isinstance(job, dict), job
        return job

    def ack(self, queue: str, job_id: str) -> httpx.Response:
        return self.request("DELETE", self.path(queue, "job", job_id))

    def peek(self, queue: str) -> httpx.Response:
        return self.request("GET", self.path(queue, "peek"))

    def peek_job(self, queue: str, job_id: str) -> httpx.Response:
        return self.request("GET", self.path(queue, "job", job_id))

    def size(self, queue: str) -> int:
        answer = self.request("GET", self.path(queue, "size"), token=None)
        assert answer.status_code == 200, answer.text
        assert answer.json()["namespace"] == self.namespace and answer.json()["queue"] == queue
        return int(answer.json()["size"])

    def destroy(self, queue: str) -> httpx.Response:
        return self.request("DELETE", self.path(queue))

    def deadletter(self, queue: str) -> httpx.Response:
        return self.request("GET", self.path(queue, "deadletter"))

    def respawn(self, queue: str, **params: str | int) -> httpx.Response:
        return self.request("PUT", self.path(queue, "deadletter"), params=params)

    def delete_dead(self, queue: str, **params: str | int) -> httpx.Response:
        return self.request("DELETE", self.path(queue, "deadletter"), params=params)

    def dead_size(self, queue: str) -> int:
        answer = self.request("GET", self.path(queue, "deadletter", "size"), token=None)
        assert answer.status_code == 200, answer.text
        assert answer.json()["namespace"] == self.namespace and answer.json()["queue"] == queue
        return int(answer.json()["size"])

    # -- composite steps the tests share ---------------------------------------------

    @contextmanager
    def consuming(self, queues: str, **params: str | int) -> Iterator[Future[httpx.Response]]:
        """A consume running in the background on its own connection.

        The block starts once the request has gone out and one more round trip to the
        server has completed, so the server has it in hand; on exit the consume's answer
        is waited for (at most HTTP_TIMEOUT).
        """
        sent = threading.Event()
        with (
            http_client(
                self.server.api,
                timeout=HTTP_TIMEOUT,
                headers={"X-Token": self.token},
                event_hooks={"request": [lambda _request: sent.set()]},
            ) as waiter,
            ThreadPoolExecutor(1) as pool,
        ):
            pending = pool.submit(waiter.get, self.path(queues), params=dict(params))
            assert sent.wait(HTTP_TIMEOUT), "the background consume was never sent"
            assert self.http.get("/healthz").status_code == 200
            yield pending
            pending.result(timeout=HTTP_TIMEOUT)

    def make_dead(self, queue: str, count: int) -> list[str]:
        """``count`` jobs in the dead letter, oldest first: tries=1, leased for 1 s, let go."""
        ids = []
        for n in range(count):
            job_id = self.publish_ok(queue, f"dead {n}".encode(), tries=1)
            consumed = self.consume_ok(queue, ttr=1)
            assert consumed["job_id"] == job_id and consumed["remain_tries"] == 0
            ids.append(job_id)
        wait_until(lambda: self.dead_size(queue) == count, within=30, what="jobs in dead letter")
        return ids


def body_of(response: httpx.Response) -> Any:
    """The JSON body, or the text when it is not JSON (so that a failure shows it)."""
    try:
        return response.json()
    except ValueError:
        return response.text


def assert_error(response: httpx.Response, status: int, message: str) -> None:
    """lmstfy's error shape: ``{"error": message}`` with the given status."""
    got = (response.status_code, body_of(response))
    assert got == (status, {"error": message}), f"{response.request.method} {response.request.url}"


def assert_no_job(response: httpx.Response) -> None:
    """A consume that found nothing: 404 with the message under ``msg``, not ``error``."""
    got = (response.status_code, body_of(response))
    assert got == (404, NO_JOB), f"{response.request.method} {response.request.url}: {got}"
