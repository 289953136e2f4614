"""Every route of both ports, asked odd things without a session or a token: never a 5xx.

The routes are read from the apps the server builds (``build_api`` and
``build_admin``), so a route added later is asked too. Each is sent, over HTTP to a
real server on each backend, every method it takes and a few it does not, with:

* each path parameter in turn set to an odd value (the others plain): digits that are
  not ASCII (``²``), numbers past any integer type and past Python's 4300-digit limit
  of ``int()``, signs, ``NaN``, NUL, bytes that are not UTF-8, escapes that are not
  escapes, very long text;
* query strings: every parameter name any route reads set to one odd value at once,
  each name alone odd among plain values (one refusal must not hide the parsing of
  the next), repeated names, names without values;
* odd headers: malformed cookies and tokens, non-UTF-8 header bytes, odd ranges;
* odd bodies on the methods that take one: forms and JSON with odd values, JSON
  nested past the parser's depth, bytes that are not UTF-8.

The admin port has no credential here (loopback), so its routes really run; its
``{token}`` routes get a real token so that the limit routes read their bodies.
Everything is a fixed list: the same requests on every run, a few thousand of them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import httpx
from starlette.convertors import PathConvertor
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp

import ferryq
from ferryq.dashboard.auth import COOKIE, LOGIN_COOKIE
from ferryq.server.app import build_admin, build_api
from ferryq.server.engine import Engine
from tests.server.harness import Lmstfy, ServerProcess, assert_error, b64, each

#: Requests in flight at once, each on a connection of its own.
CLIENTS = 3
#: Namespace of the plain path values, and of the token the admin routes are given.
PLAIN = "1"
ODD_METHODS = ("HEAD", "OPTIONS", "PATCH", "TRACE", "PROPFIND", "get")
BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})

# Values as they go on the wire (already percent-encoded where they need it).
_TEXTS = ["²", "\u0661\u0662", "\uff11", "-1", "+1", "0", "1.5", "1e3", "0x10", "NaN", "inf",
          "-inf", " 1", "9" * 19, "9" * 20, "9" * 5000, "x" * 8000, "..", "<b>x</b>", "a,a", "_x",
          "ns:1", "\x00", "a\x00b", "/"]  # fmt: skip
_RAW = ["%FF", "%FF%FE", "%ED%A0%80", "%C0%AF", "%", "%G1", "%2", "", "%E2%80%AE"]
ODD_VALUES = [quote(text, safe="") for text in _TEXTS] + _RAW
#: The values each query name is given alone, among plain ones.
ALONE_VALUES = [quote("²"), "9" * 5000]

#: Query names the Starlette routes read (the native API's are read from its routes),
#: with a plain value that each accepts; every other name gets "1".
QUERY_PLAIN = {"done": "respawn", "n": "1", "state": "ready", "ns": PLAIN, "token": "1",
               "pool": "default", "description": "fuzz", "ttr": "1", "timeout": "0",
               "count": "1", "delay": "0", "ttl": "1", "tries": "1", "limit": "1",
               "after": "1", "next": "/ui/", "rule_error": "x", "queue": "q", "task": "t",
               "lane": "l", "q": "x", "text": "x", "pattern": "p"}  # fmt: skip

_B64_BAD = b64(b"\xff\xfe:\x00")
_FORGED = b64(b'{"r":"admin","ns":null,"n":"x","c":"x","d":null,"e":1e999}')
ODD_HEADERS: list[dict[str, str | bytes]] = [
    {"Cookie": f"{COOKIE}=x.y; {LOGIN_COOKIE}=z"},
    {"Cookie": f"{COOKIE}=a.b.c"},
    {"Cookie": f"{COOKIE}={'A' * 6000}.{'B' * 43}"},
    {"Cookie": f"{COOKIE}={_FORGED}.x"},
    {"Cookie": b"\xff\xfe=\xff; ;;=;; ferryq_session"},
    {"Cookie": f'{COOKIE}="%FF\\"'},
    {"X-Token": "²"},
    {"X-Token": b"default:\xff\xfe"},
    {"X-Token": ":" * 300},
    {"Authorization": "Bearer ²"},
    {"Authorization": f"Basic {_B64_BAD}"},
    {"Authorization": "Basic %%%"},
    {"X-Ferryq-Fragment": "²", "Origin": "null"},
    {"Origin": b"http://\xff", "Host": "²"},
    {"Range": "bytes=²-", "If-Range": "x"},
    {"Range": "bytes=" + ",".join(["0-0"] * 200)},
    {"Range": "bytes=-99999999999999999999999"},
    {"Enable-Job-Version": "²", "Job-Attr-x": b"\xff", "Content-Type": "²"},
]

_FORM = "&".join(f"{name}={quote('²')}" for name in
                 ("csrf", "ids", "limit", "ns", "pattern", "on_dead", "op", "description",
                  "token", "next", "user", "password"))  # fmt: skip
ODD_BODIES: list[tuple[str | None, bytes]] = [
    ("application/x-www-form-urlencoded", _FORM.encode()),
    ("application/x-www-form-urlencoded", b"ids=%FF&ids=" + b"9" * 5000 + b"&action=purge"),
    ("application/x-www-form-urlencoded", b"\xff\xfe\x00=\x00&&=&%"),
    ("application/json", b"[" * 3000),
    ("application/json", b'{"read": 1e999, "write": NaN, "interval": -0.0}'),
    ("application/json", b'{"read": ' + b"9" * 5000 + b', "write": 1, "interval": 1}'),
    ("application/json", b"\xff\xfe\x00\x00"),
    (None, b"\x00" * 64),
]


@dataclass(frozen=True, slots=True)
class Template:
    """A route's path with a value for each parameter, and the methods it takes."""

    path: str  # "/api/{ns}/{q}/job/{job_id}"
    params: tuple[str, ...]
    methods: frozenset[str]
    plain: Mapping[str, str]  # a value of each parameter that the route matches
    queries: frozenset[str]  # query names of its own (the native API declares them)

    def url(self, **values: str) -> str:
        return self.path.format_map({**self.plain, **values})


@dataclass(frozen=True, slots=True)
class Probe:
    method: str
    target: str  # path and query, as sent
    headers: Mapping[str, str | bytes]
    body: bytes = b""


def test_no_route_answers_an_odd_request_with_a_5xx(server: ServerProcess, tmp_path: Path) -> None:
    token = server.create_token(PLAIN)
    api_routes, admin_routes = _routes(tmp_path)
    plans = [
        (server.api, list(_probes(_templates(api_routes), {}))),
        (server.admin, list(_probes(_templates(admin_routes), {"token": token}))),
    ]
    failures = [failure for base, probes in plans for failure in _ask_all(base, probes)]
    assert server.process.poll() is None, "the server exited"
    with server.api_client() as client:
        assert client.get("/healthz").status_code == 200
    assert not failures, f"{len(failures)} request(s) failed:\n" + "\n".join(failures[:40])
    assert "Traceback" not in server.stderr(), server.stderr()[-4000:]


def test_lmstfy_numbers_that_int_would_refuse_are_invalid(lm: Lmstfy) -> None:
    """With a token, past the checks the fuzz stops at: each number lmstfy reads, as a
    digit that is not ASCII or as more digits than ``int()`` converts, is a 400."""
    ask: dict[str, Callable[..., httpx.Response]] = {
        "ttr": lm.consume, "timeout": lm.consume, "count": lm.consume, "delay": lm.publish,
        "ttl": lm.publish, "tries": lm.publish, "limit": lm.respawn,
    }  # fmt: skip
    cases = [(name, value) for name in ask for value in ("²", "9" * 5000, "0" * 5000 + "²")]

    def refused(case: tuple[str, str]) -> None:
        name, value = case
        assert_error(ask[name]("q", **{name: value}), 400, f"invalid {name}")

    each(cases, refused)
    assert_error(lm.delete_dead("q", limit="9" * 5000), 400, "invalid limit")


def test_the_fuzz_finds_every_kind_of_route(tmp_path: Path) -> None:
    """The route walk reaches into mounts and included routers (else the fuzz would
    pass by asking nothing)."""
    api_routes, admin_routes = _routes(tmp_path)
    api = {t.path: t for t in _templates(api_routes)}
    admin = {t.path for t in _templates(admin_routes)}
    for path in ("/api/{ns}/{q}", "/api/{ns}/{q}/job/{job_id}", "/v1/jobs/{job_id}",
                 "/v1/lanes/limits", "/healthz", "/metrics", "/ui/jobs/{job_id}", "/ui/login",
                 "/ui/static/{path}"):  # fmt: skip
        assert path in api, sorted(api)
    assert {"/token/{ns}/{token}/limit", "/metrics", "/info"} <= admin
    assert api["/v1/jobs/{job_id}/result"].queries == {"timeout"}
    assert api["/api/{ns}/{q}"].methods == {"GET", "PUT", "DELETE"}


# -- the routes --------------------------------------------------------------------------


def _routes(tmp_path: Path) -> tuple[Sequence[BaseRoute], Sequence[BaseRoute]]:
    """The routes of the API and admin apps, as the server builds them (never served:
    the app opens no database until it is used)."""
    app = ferryq.App(f"sqlite:///{tmp_path}/unused.db")
    try:
        engine = Engine(app)
        return _inner_routes(build_api(engine)), _inner_routes(build_admin(engine, None))
    finally:
        app.close()


def _inner_routes(app: ASGIApp) -> Sequence[BaseRoute]:
    """The routes under the middleware (each middleware holds the next as ``app``)."""
    while not hasattr(app, "routes"):
        app = app.app  # type: ignore[attr-defined]
    routes: Sequence[BaseRoute] = app.routes
    return routes


def _templates(routes: Sequence[BaseRoute], prefix: str = "") -> list[Template]:
    """One template per path; methods of routes sharing a path are merged."""
    found: dict[str, Template] = {}
    for template in _walk(routes, prefix):
        seen = found.get(template.path)
        if seen is not None:
            template = Template(template.path, template.params, seen.methods | template.methods,
                                template.plain, seen.queries | template.queries)  # fmt: skip
        found[template.path] = template
    return list(found.values())


def _walk(routes: Sequence[BaseRoute], prefix: str) -> Iterator[Template]:
    for route in routes:
        included = getattr(route, "original_router", None)
        if included is not None:  # FastAPI's include_router: a router as one route
            context = getattr(route, "include_context", None)
            yield from _walk(included.routes, prefix + getattr(context, "prefix", ""))
        elif isinstance(route, Mount) and route.routes:
            yield from _walk(route.routes, prefix + route.path)
        elif isinstance(route, Mount):
            yield Template(f"{prefix}{route.path}/{{path}}", ("path",),
                           frozenset({"GET", "HEAD"}), {"path": _mounted_file(route.app)},
                           frozenset())  # fmt: skip
        elif isinstance(route, Route):
            params = tuple(route.param_convertors)
            plain = {name: _plain_path_value(convertor) for name, convertor in
                     route.param_convertors.items()}  # fmt: skip
            methods = frozenset(route.methods or {"GET"})
            yield Template(prefix + route.path_format, params, methods, plain,
                           _declared_queries(route))  # fmt: skip
        else:
            raise AssertionError(f"a route the fuzz does not know how to ask: {route!r}")


def _plain_path_value(convertor: object) -> str:
    return "a/b" if isinstance(convertor, PathConvertor) else PLAIN


def _mounted_file(app: ASGIApp) -> str:
    """A file a static mount serves (so that ranges reach a file), else any path."""
    if isinstance(app, StaticFiles):
        for directory in app.all_directories:
            files = sorted(p for p in Path(directory).iterdir() if p.is_file())
            if files:
                return files[0].name
    return "a"


def _declared_queries(route: Route) -> frozenset[str]:
    """The query names a FastAPI route declares, its dependencies' included."""
    names: set[str] = set()
    pending = [getattr(route, "dependant", None)]
    while pending:
        dependant = pending.pop()
        if dependant is not None:
            names.update(param.alias for param in dependant.query_params)
            pending.extend(dependant.dependencies)
    return frozenset(names)


# -- the requests ------------------------------------------------------------------------


def _probes(templates: Sequence[Template], plain: Mapping[str, str]) -> Iterator[Probe]:
    for template in templates:
        template = Template(template.path, template.params, template.methods,
                            {**template.plain, **{k: v for k, v in plain.items()
                                                  if k in template.params}},
                            template.queries)  # fmt: skip
        methods = sorted(template.methods - {"HEAD"}) or ["GET"]
        yield from _path_probes(template, methods)
        yield from _query_probes(template, methods)
        for headers in ODD_HEADERS:
            for method in methods:
                yield Probe(method, template.url(), headers)
        for method in ODD_METHODS:
            yield Probe(method, template.url(), {})
        for method in BODY_METHODS & template.methods:
            for content_type, body in ODD_BODIES:
                headers = {} if content_type is None else {"Content-Type": content_type}
                yield Probe(method, template.url(), headers, body)


def _path_probes(template: Template, methods: list[str]) -> Iterator[Probe]:
    for name in template.params:
        for value in ODD_VALUES:
            for method in methods:
                yield Probe(method, template.url(**{name: value}), {})


def _query_probes(template: Template, methods: list[str]) -> Iterator[Probe]:
    plain = {**QUERY_PLAIN, **{name: "1" for name in template.queries - QUERY_PLAIN.keys()}}
    # A route that declares its query names (FastAPI's) reads no other.
    alone = [name for name in plain if not template.queries or name in template.queries]
    url = template.url()

    def query(pairs: Sequence[tuple[str, str]]) -> str:
        return url + "?" + "&".join(f"{name}={value}" for name, value in pairs)

    # Long values cut, all names together (else past the server's limit on a request
    # line, refused before any route sees them), and whole for one name at a time.
    targets = [query([(name, value[:400]) for name in plain]) for value in ODD_VALUES]
    # Repeated: gin reads the first value, Starlette the last, the native API neither.
    odd = ALONE_VALUES[0]
    targets += [query([pair for n, v in plain.items() for pair in ((n, v), (n, odd))]),
                query([pair for n, v in plain.items() for pair in ((n, odd), (n, v))])]  # fmt: skip
    targets += [query([(n, value if n == name else v) for n, v in plain.items()])
                for name in alone for value in ALONE_VALUES]  # fmt: skip
    targets += [url + "?" + "&".join(plain), url + "?=&&=x&%FF=%FF&" + "a=1&" * 500,
                query([(name, v) for name, v in plain.items() for _ in range(2)])]  # fmt: skip
    for target in targets:
        for method in methods:
            yield Probe(method, target, {})


def _ask_all(base: str, probes: Sequence[Probe]) -> list[str]:
    """Each probe once, CLIENTS at a time; the DELETEs after everything else (deleting
    the admin routes' token first would leave the routes that read a body answering
    "token not found" before they read it)."""
    failures: list[str] = []
    for phase in ([p for p in probes if p.method != "DELETE"],
                  [p for p in probes if p.method == "DELETE"]):  # fmt: skip
        shares = [phase[i::CLIENTS] for i in range(CLIENTS)]
        with ThreadPoolExecutor(CLIENTS) as pool:
            for found in pool.map(lambda share: _ask_each(base, share), shares):
                failures += found
    return failures


def _ask_each(base: str, probes: Sequence[Probe]) -> list[str]:
    with httpx.Client(base_url=base, timeout=10) as client:
        failures = [failure for probe in probes for failure in _ask(client, probe)]
        if client.get("/metrics").status_code != 200:
            failures.append("the connection the fuzz used answers no more")
    return failures


def _ask(client: httpx.Client, probe: Probe) -> list[str]:
    target = (
        probe.target if len(probe.target) < 200 else f"{probe.target[:90]}…{probe.target[-90:]}"
    )
    shown = f"{probe.method} {target} {dict(probe.headers)!r:.160}"
    try:
        headers = {name.encode(): value if isinstance(value, bytes) else value.encode()
                   for name, value in probe.headers.items()}  # fmt: skip
        answer = client.request(probe.method, probe.target, headers=headers,
                                content=probe.body or None)  # fmt: skip
    except httpx.HTTPError as exc:
        return [f"{shown}: no answer ({exc!r})"]
    if answer.status_code >= 500:
        return [f"{shown}: {answer.status_code} {answer.text[:200]!r}"]
    return []
