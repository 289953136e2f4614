"""What holds across the protocol: request ids, unknown routes, malformed input, the
server's own start-up contract, and HTTP jobs being ordinary ferryq jobs."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

import httpx

import ferryq
from tests.server.harness import (
    HTTP_TIMEOUT,
    LISTENING,
    Lmstfy,
    ServerProcess,
    assert_error,
    assert_no_job,
    b64,
    body_of,
    each,
)

API_NOT_FOUND = {"error": "api not found"}


def test_healthz_answers_as_soon_as_the_server_has_announced_itself(server: ServerProcess) -> None:
    with server.api_client() as api:
        assert api.get("/healthz").status_code == 200


def test_the_listening_line_is_all_the_server_writes_to_stdout(server: ServerProcess) -> None:
    assert LISTENING.match(f"ferryq server listening api={server.api} admin={server.admin}")
    assert server.api.startswith("http://127.0.0.1:")
    assert server.admin.startswith("http://127.0.0.1:")
    assert server.api != server.admin
    assert server.stdout_lines == []


# -- X-Request-ID -------------------------------------------------------------------


def test_every_response_carries_a_unique_request_id(lm: Lmstfy) -> None:
    job_id = lm.publish_ok("q", b"x")
    responses = [
        lm.publish("q", b"x"),
        lm.publish("q", b"x"),  # the same request twice: two ids
        lm.publish("q", b"x", delay="bad"),
        lm.consume("q"),
        lm.consume("empty"),
        lm.peek_job("q", job_id),
        lm.peek_job("q", "no-such-job"),
        lm.ack("q", job_id),
        lm.request("GET", lm.path("q", "size"), token=None),
        lm.request("PUT", lm.path("q"), content=b"x", token=None),
        lm.request("PUT", lm.path("q"), content=b"x", token="wrong-token-000000000"),
        lm.request("GET", "/no/such/route"),
        lm.http.get("/healthz"),
    ]
    with lm.server.admin_client() as admin:
        responses += [
            admin.get("/pools"),
            admin.get(f"/token/{lm.namespace}"),
            admin.post(f"/token/{lm.namespace}"),  # 400: no description
            admin.get("/no/such/route"),
        ]
    ids = []
    for response in responses:
        request_id = response.headers.get("X-Request-ID")
        where = f"{response.request.method} {response.request.url} -> {response.status_code}"
        assert request_id, f"no X-Request-ID on {where}"
        ids.append(request_id)
        if response.status_code != 204 and response.request.url.path != "/healthz":
            content_type = response.headers.get("content-type", "")
            assert content_type.startswith("application/json"), f"{content_type!r} on {where}"
    assert len(set(ids)) == len(ids), ids


# -- unknown routes and wrong methods -----------------------------------------------


API_MISSES = [
    ("GET", "/no/such/route"),
    ("GET", "/api"),
    ("GET", "/api/NS"),
    ("GET", "/api/NS/q/job"),
    ("GET", "/api/NS/q/no-such-thing"),
    ("GET", "/api/NS/q/job/1/more"),
    ("GET", "/api/NS/q/deadletter/size/more"),
    ("POST", "/api/NS/q"),
    ("PATCH", "/api/NS/q"),
    ("POST", "/api/NS/q/job/1"),
    ("PATCH", "/api/NS/q/job/1"),
    ("PUT", "/api/NS/q/peek"),
    ("DELETE", "/api/NS/q/peek"),
    ("PUT", "/api/NS/q/size"),
    ("DELETE", "/api/NS/q/size"),
    ("GET", "/api/NS/q/bulk"),
    ("POST", "/api/NS/q/bulk"),
    ("POST", "/api/NS/q/deadletter"),
    ("PUT", "/api/NS/q/deadletter/size"),
]


def test_an_unknown_route_or_wrong_method_on_the_api_port_is_404(lm: Lmstfy) -> None:
    job_id = lm.publish_ok("q", b"kept")

    def check(miss: tuple[str, str]) -> None:
        method, path = miss
        answer = lm.request(method, path.replace("NS", lm.namespace), content=b"x")
        assert (answer.status_code, body_of(answer)) == (404, API_NOT_FOUND), answer.text

    each(API_MISSES, check)
    assert lm.size("q") == 1
    assert lm.peek_job("q", job_id).json()["remain_tries"] == 1


ADMIN_MISSES = [
    ("GET", "/no/such/route"),
    ("GET", "/token"),
    ("PUT", "/token/NS"),
    ("PATCH", "/token/NS"),
    ("DELETE", "/token/NS"),
    ("POST", "/pools"),
    ("DELETE", "/version"),
    ("PATCH", "/token/NS/TOKEN/limit"),
]


def test_an_unknown_route_or_wrong_method_on_the_admin_port_is_404(lm: Lmstfy) -> None:
    with lm.server.admin_client() as admin:

        def check(miss: tuple[str, str]) -> None:
            method, path = miss
            answer = admin.request(
                method, path.replace("NS", lm.namespace).replace("TOKEN", lm.token)
            )
            assert (answer.status_code, body_of(answer)) == (404, API_NOT_FOUND), answer.text

        each(ADMIN_MISSES, check)
        assert len(admin.get(f"/token/{lm.namespace}").json()["tokens"]) == 1
    lm.publish_ok("q", b"the token still works")


HEAD_PATHS = [
    "/api/NS/q",
    "/api/NS/q,other",
    "/api/NS/q/peek",
    "/api/NS/q/job/ID",
    "/api/NS/q/size",
    "/api/NS/q/deadletter",
    "/api/NS/q/deadletter/size",
]
ADMIN_HEAD_PATHS = ["/token/NS", "/token/NS/TOKEN/limit", "/info", "/version", "/pools", "/metrics"]


def test_head_is_404_on_every_route_and_takes_no_job(lm: Lmstfy) -> None:
    # lmstfy's router (gin) has no HEAD routes; a HEAD that ran a consume would lease
    # a job and answer without it.
    job_id = lm.publish_ok("q", b"kept", tries=2)

    def check(path: str) -> None:
        answer = lm.request("HEAD", path.replace("NS", lm.namespace).replace("ID", job_id))
        assert answer.status_code == 404, answer.status_code

    each(HEAD_PATHS, check)
    with lm.server.admin_client() as admin:

        def check_admin(path: str) -> None:
            path = path.replace("NS", lm.namespace).replace("TOKEN", lm.token)
            assert admin.head(path).status_code == 404

        each(ADMIN_HEAD_PATHS, check_admin)
    assert lm.size("q") == 1
    assert lm.peek_job("q", job_id).json()["remain_tries"] == 2
    assert lm.consume_ok("q")["job_id"] == job_id


# -- malformed input ----------------------------------------------------------------


MALFORMED_PUBLISHES: list[dict[str, str]] = [
    {"delay": "%"},
    {"delay": "1e3"},
    {"delay": "99999999999999999999999"},
    {"ttl": "NaN"},
    {"ttl": "inf"},
    {"tries": "1_000"},
    {"tries": "0x1"},
    {"delay": "\x00"},
]


def test_malformed_publish_parameters_are_400_and_publish_nothing(lm: Lmstfy) -> None:
    def check(params: dict[str, str]) -> None:
        answer = lm.request("PUT", lm.path("q"), params=params, content=b"x")
        assert answer.status_code == 400, answer.text
        assert set(answer.json()) == {"error"}

    each(MALFORMED_PUBLISHES, check)
    assert lm.size("q") == 0
    assert_no_job(lm.consume("q"))
    assert_error(lm.peek("q"), 404, "the queue is empty")


#: Publishes whose HTTP framing is broken: (framing headers, body).
MALFORMED_FRAMES = [
    ("Content-Length: 2\"(o'*FV}$|", "xx"),
    ("Content-Length: -1", "x"),
    ("Content-Length: 1\r\nContent-Length: 2", "xx"),
    ("Transfer-Encoding: chunked", "zz\r\nxx\r\n0\r\n\r\n"),
]


def test_a_publish_with_broken_http_framing_is_400_and_publishes_nothing(lm: Lmstfy) -> None:
    # Refused by the HTTP server before any route sees it; the server goes on serving.
    url = urlsplit(lm.server.api)
    assert url.hostname is not None and url.port is not None

    def check(frame: tuple[str, str]) -> None:
        framing, body = frame
        head = f"PUT {lm.path('q')} HTTP/1.1\r\nHost: {url.netloc}\r\nX-Token: {lm.token}\r\n"
        with socket.create_connection((url.hostname, url.port), timeout=HTTP_TIMEOUT) as conn:
            conn.sendall(f"{head}{framing}\r\n\r\n{body}".encode())
            answer = b""
            while chunk := conn.recv(4096):  # the server closes the connection
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 400"), answer

    each(MALFORMED_FRAMES, check)
    assert lm.size("q") == 0
    assert_no_job(lm.consume("q"))


def test_malformed_query_strings_are_4xx_and_change_nothing(lm: Lmstfy) -> None:
    job_id = lm.publish_ok("q", b"x", tries=3)
    for query in ("ttr=%ff", "timeout=%", "count=%00", "timeout=1_0", "count=%EF%BC%92"):
        answer = lm.http.get(f"{lm.path('q')}?{query}", headers={"X-Token": lm.token})
        assert 400 <= answer.status_code < 500, (query, answer.status_code, answer.text)
    assert lm.size("q") == 1
    assert lm.peek_job("q", job_id).json()["remain_tries"] == 3


def test_a_repeated_query_parameter_counts_with_its_first_value(lm: Lmstfy) -> None:
    # gin's Query gives the first value of a repeated parameter.
    cases = [
        ("PUT", "q", f"token=wrong-token-000000000&token={lm.token}", 401, "invalid token"),
        ("PUT", "q", "delay=x&delay=1", 400, "invalid delay"),
        ("PUT", "q", "ttl=x&ttl=10", 400, "invalid ttl"),
        ("PUT", "q", "tries=0&tries=1", 400, "tries shouldn't be zero"),
        ("PUT", "q/bulk", "tries=x&tries=1", 400, "invalid tries"),
        ("PUT", "q/job/1", "delay=10&ttl=5&delay=1", 400, "ttl is shorter than delay"),
        ("GET", "q", "ttr=x&ttr=1", 400, "invalid ttr"),
        ("GET", "q", "timeout=x&timeout=0", 400, "invalid timeout"),
        ("GET", "q", "count=0&count=1", 400, "invalid count"),
        ("PUT", "q/deadletter", "limit=x&limit=1", 400, "invalid limit"),
        ("PUT", "q/deadletter", "ttl=x&ttl=1", 400, "invalid ttl"),
        ("DELETE", "q/deadletter", "limit=0&limit=1", 400, "invalid limit"),
    ]

    def check(case: tuple[str, str, str, int, str]) -> None:
        method, where, query, status, message = case
        token = {} if "token=" in query else {"X-Token": lm.token}
        url = f"/api/{lm.namespace}/{where}?{query}"
        answer = lm.http.request(method, url, content=b'[{"a":1}]', headers=token)
        assert_error(answer, status, message)

    each(cases, check)
    assert lm.size("q") == 0
    first = lm.http.put(f"{lm.path('q')}?token={lm.token}&token=wrong&delay=0&delay=x")
    assert first.status_code == 201, first.text


def test_a_repeated_admin_parameter_counts_with_its_first_value(lm: Lmstfy) -> None:
    chosen = f"a-chosen-token-{lm.namespace}"
    with lm.server.admin_client() as admin:
        path = f"/token/{lm.namespace}"
        assert_error(admin.post(f"{path}?description=&description=d"), 400, "invalid description")
        assert_error(admin.post(path, content=b"description=&description=d",
                                headers={"Content-Type": "application/x-www-form-urlencoded"}),
                     400, "invalid description")  # fmt: skip
        assert_error(admin.post(f"{path}?description=d&token=short&token={chosen}"),
                     400, "the user token was too short")  # fmt: skip
        assert_error(admin.post(f"{path}?description=d&pool=other&pool=default"),
                     404, "pool not found")  # fmt: skip
        assert len(admin.get(path).json()["tokens"]) == 1


def test_a_job_id_of_any_shape_is_handled_as_unknown(lm: Lmstfy) -> None:
    job_id = lm.publish_ok("q", b"x")
    for odd in ("%20", "1.5", "1e3", "0x1", "' OR 1=1 --", "\u00e9", "9" * 400):
        assert_error(lm.peek_job("q", odd), 404, "job not found")
        assert lm.ack("q", odd).status_code == 204
    assert lm.size("q") == 1
    assert lm.consume_ok("q")["job_id"] == job_id


def test_a_job_id_beyond_int64_is_handled_as_unknown(lm: Lmstfy) -> None:
    job_id = lm.publish_ok("q", b"x")

    def check(odd: str) -> None:
        assert_error(lm.peek_job("q", odd), 404, "job not found")
        assert lm.ack("q", odd).status_code == 204
        republished = lm.republish("other", odd, b"new")
        assert republished.status_code == 201, republished.text

    each([str(1 << 63), "9999999999999999999", "18446744073709551616"], check)
    assert lm.size("q") == 1
    assert lm.size("other") == 3
    assert lm.consume_ok("q")["job_id"] == job_id


def test_job_ids_are_scoped_to_their_namespace(lm: Lmstfy) -> None:
    job_id = lm.publish_ok("q", b"mine")
    namespace = f"{lm.namespace}-other"
    other = Lmstfy(lm.server, namespace, lm.server.create_token(namespace))
    try:
        assert_error(other.peek_job("q", job_id), 404, "job not found")
        assert other.ack("q", job_id).status_code == 204
        assert other.republish("q", job_id, b"theirs").status_code == 201
    finally:
        other.close()
    assert lm.peek_job("q", job_id).json()["data"] == b64(b"mine")
    assert lm.consume_ok("q")["job_id"] == job_id


# -- jobs published over HTTP are ordinary ferryq jobs ------------------------------


def test_a_job_published_over_http_is_an_ordinary_ferryq_job(lm: Lmstfy) -> None:
    job_id = lm.publish_ok("mail", b"\x00raw bytes\xff", tries=2)
    delayed_id = lm.publish_ok("mail", b"later", delay=600)
    app = ferryq.App(lm.server.url, namespace=lm.namespace)
    try:
        job = app.get_job(int(job_id))
        assert (job.id, job.state, job.queue, job.namespace) == (
            int(job_id), "ready", "mail", lm.namespace,
        )  # fmt: skip
        assert job.max_tries == 2
        assert app.explain(int(job_id)).state == "ready"
        assert app.get_job(int(delayed_id)).state == "scheduled"
        assert app.explain(int(delayed_id)).state == "scheduled"

        assert lm.consume_ok("mail", ttr=60)["job_id"] == job_id
        leased = app.get_job(int(job_id))
        assert (leased.state, leased.attempts) == ("running", 1)
        assert app.explain(int(job_id)).state == "running"

        assert lm.ack("mail", job_id).status_code == 204
        assert app.get_job(int(job_id)).state == "succeeded"
        assert app.explain(int(job_id)).state == "succeeded"
    finally:
        app.close()


def test_http_ids_are_decimal_ferryq_ids_in_publish_order(lm: Lmstfy) -> None:
    ids = [lm.publish_ok("q", b"x") for _ in range(3)]
    bulk = lm.bulk("q", b'[{"n":1},{"n":2}]').json()["job_ids"]
    numbers = [int(job_id) for job_id in ids + bulk]
    assert [str(n) for n in numbers] == ids + bulk
    assert numbers == sorted(numbers) and len(set(numbers)) == 5


def test_an_httpx_client_without_keep_alive_works_too(lm: Lmstfy) -> None:
    # Some lmstfy clients open a connection per request.
    with httpx.Client(
        base_url=lm.server.api, limits=httpx.Limits(max_keepalive_connections=0)
    ) as fresh:
        for _ in range(3):
            published = fresh.put(lm.path("q"), content=b"x", headers={"X-Token": lm.token})
            assert published.status_code == 201
    assert lm.size("q") == 3
