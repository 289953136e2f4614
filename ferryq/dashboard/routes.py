"""The dashboard's pages and actions, as one Starlette app mounted by the server.

Pages are rendered on the server with Jinja (autoescape on), so job data reaches the
browser only as escaped text. A page's changing part is also served alone, as a
fragment, when asked with the ``X-Ferryq-Fragment`` header: ``static/dashboard.js``
fetches it every few seconds and swaps it in.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode

import jinja2
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from ferryq import insights, lanes
from ferryq.dashboard import charts, views
from ferryq.dashboard.auth import (
    COOKIE,
    LOGIN_COOKIE,
    SESSION_SECONDS,
    Sessions,
    Viewer,
    csrf_ok,
    new_csrf,
)
from ferryq.dashboard.overviews import Overviews
from ferryq.dashboard.security import SecurityHeaders
from ferryq.errors import FerryqError, JobNotFound
from ferryq.job import MAX_JOB_ID, TERMINAL_STATES, Job, State
from ferryq.ops import RESPAWNABLE, JobFilter
from ferryq.ops.views import STATES
from ferryq.policy import NAME_RE
from ferryq.server import http, tokens
from ferryq.server.engine import Engine

PAGE_SIZE = 50
MAX_IDS = 500  # jobs one action may name
MAX_FORM_BYTES = 64 * 1024
MAX_TEXT = 200
MAX_NOTICE_COUNT = 999_999_999  # a count a notice shows; a link may say anything
#: How long a page waits for a first overview before it says it is still counting.
OVERVIEW_WAIT_SECONDS = 1.0
FAILED_LOGIN_PAUSE = 0.5
FRAGMENT_HEADER = "x-ferryq-fragment"
NAV = (("overview", "Overview", "/"), ("jobs", "Jobs", "/jobs"), ("dead", "Dead letters", "/dead"),
       ("lanes", "Lanes", "/lanes"), ("workers", "Workers", "/workers"))  # fmt: skip
ACTIONS = {  # action -> (states it applies to, verb shown)
    "respawn": (RESPAWNABLE, "Respawn"),
    "purge": (frozenset({State.DEAD}), "Purge"),
    "cancel": (frozenset(State) - TERMINAL_STATES, "Cancel"),
}
NOTICES = {"respawn": "Respawned {n} job(s).", "purge": "Purged {n} job(s).",
           "cancel": "Cancelled {n} job(s).",
           "cancel-requested": "Cancel requested for {n} running job(s): each ends when its "
                               "handler stops.",
           "rule": "Lane rule saved.", "rule-deleted": "Lane rule removed."}  # fmt: skip
log = logging.getLogger("ferryq.dashboard")

Endpoint = Callable[[Request], Awaitable[Response]]
Page = Callable[[Request, Viewer], Awaitable[Response]]


class BadInput(Exception):
    """A parameter or form field that the dashboard refuses (400, nothing changed)."""


@dataclass(slots=True)
class Form:
    fields: dict[str, list[str]]

    def get(self, name: str, default: str = "") -> str:
        values = self.fields.get(name)
        return values[0] if values else default

    def all(self, name: str) -> list[str]:
        return self.fields.get(name, [])


class Dashboard:
    def __init__(
        self, engine: Engine, credential: str | None, base: str, session_secret: str | None = None
    ) -> None:
        self.engine = engine
        self.base = base
        self.sessions = Sessions(lambda: engine.ops, credential, secret=session_secret,
                                 clock=engine.now)  # fmt: skip
        self.env = jinja2.Environment(
            loader=jinja2.PackageLoader("ferryq.dashboard", "templates"),
            autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True,
            lstrip_blocks=True,
        )  # fmt: skip
        self.env.globals.update(when=insights.when, ago=views.ago, pretty=views.pretty,
                                brief=views.brief, seconds=views.seconds, base=base,
                                states=STATES, nav=NAV, error_line=insights.error_line,
                                progress=views.progress)  # fmt: skip
        self.overviews = Overviews(engine.app.url, engine.now)
        self._failures = asyncio.Lock()

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/", self._page(self.overview)),
            Route("/jobs", self._page(self.jobs)),
            # Not {job_id:int}: Starlette's int() of a path of 5000 digits raises.
            Route("/jobs/{job_id}", self._page(self.job)),
            Route("/dead", self._page(self.dead)),
            Route("/lanes", self._page(self.lanes)),
            Route("/workers", self._page(self.workers)),
            Route("/actions", self._page(self.action), methods=["POST"]),
            Route("/lanes/rules", self._page(self.lane_rule), methods=["POST"]),
            Route("/login", self.login_form, methods=["GET"]),
            Route("/login", self.login, methods=["POST"]),
            Route("/logout", self._page(self.logout), methods=["POST"]),
            Mount("/static", StaticFiles(packages=[("ferryq.dashboard", "static")]), name="static"),
        ]

    # -- plumbing ----------------------------------------------------------------

    def _page(self, handler: Page) -> Endpoint:
        async def endpoint(request: Request) -> Response:
            viewer = await self.sessions.read(request.cookies.get(COOKIE))
            if viewer is None:
                if request.method != "GET" or request.headers.get(FRAGMENT_HEADER):
                    return self.render_error(request, 401, "Sign in first.")
                target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                return RedirectResponse(f"{self.base}/login?{urlencode({'next': target})}", 303)
            if request.method == "POST":
                form = await self._posted_form(request)
                if isinstance(form, Response):
                    return form
                if not csrf_ok(viewer.csrf, form.get("csrf") or None):
                    return self.render_error(request, 403, "The form expired; reload the page.")
                request.state.form = form
            try:
                return await handler(request, viewer)
            except BadInput as exc:
                return self.render_error(request, 400, str(exc), viewer)
            except Exception:
                # Answered here, not by Starlette's last resort: a page with the
                # dashboard's headers, on a connection that stays usable.
                log.exception("dashboard page %s failed", request.url.path)
                return self.render_error(request, 500, "Something went wrong; it is logged.")

        return endpoint

    async def _posted_form(self, request: Request) -> Form | Response:
        """A form POSTed from this server's own pages, or the answer refusing it."""
        if not _same_origin(request):
            return self.render_error(request, 403, "Cross-site request refused.")
        try:
            return await _form(request)
        except BadInput as exc:
            return self.render_error(request, 400, str(exc))

    def render(
        self, request: Request, viewer: Viewer | None, page: str, status: int = 200, **context: Any
    ) -> HTMLResponse:
        """The page, or only its live fragment when the script asks for it."""
        if "notice" not in context:
            context["notice"] = _notice(request)
        context.setdefault("error", None)
        context.update(viewer=viewer, now=self.engine.now())
        fragment = context.get("fragment")
        if fragment and request.headers.get(FRAGMENT_HEADER):
            return HTMLResponse(self.env.get_template(fragment).render(context), status)
        return HTMLResponse(self.env.get_template(page).render(context), status)

    def render_error(
        self, request: Request, status: int, message: str, viewer: Viewer | None = None
    ) -> HTMLResponse:
        return self.render(request, viewer, "error.html", status, title=str(status),
                           message=message, active="", notice=None)  # fmt: skip

    async def not_found(self, request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        return self.render_error(request, status, "Nothing here." if status == 404 else "Error.")

    def scope(self, request: Request, viewer: Viewer) -> str | None:
        """The namespace a page shows: the token's, or the one the admin picked (or all)."""
        if viewer.namespace is not None:
            return viewer.namespace
        return _namespace(request.query_params.get("ns", "")) or None

    # -- pages -------------------------------------------------------------------

    async def overview(self, request: Request, viewer: Viewer) -> Response:
        namespace = self.scope(request, viewer)
        data = await self.overviews.get(namespace, wait=OVERVIEW_WAIT_SECONDS)
        if data is None:  # still counting: the page's script fetches it again shortly
            return self.render(request, viewer, "overview.html", title="Overview",
                               active="overview", fragment="fragments/counting.html",
                               ns=namespace or "")  # fmt: skip
        return self.render(request, viewer, "overview.html", title="Overview", active="overview",
                           fragment="fragments/overview.html", o=data, ns=namespace or "",
                           throughput=charts.throughput(data.activity),
                           lag=charts.lag(data.activity))  # fmt: skip

    async def jobs(self, request: Request, viewer: Viewer) -> Response:
        query = request.query_params
        state = query.get("state", "")
        if state and state not in STATES:
            raise BadInput(f"unknown state {state!r}")
        filters = {
            "ns": self.scope(request, viewer) or "",
            "state": state,
            "queue": _name(query.get("queue", "")),
            "task": _name(query.get("task", "")),
            "lane": _name(query.get("lane", "")),
            "q": _text(query.get("q", "")),
        }
        where = JobFilter(namespace=filters["ns"] or None, state=State(state) if state else None,
                          queue=filters["queue"] or None, task=filters["task"] or None,
                          lane=filters["lane"] or None, text=filters["q"] or None,
                          after_id=_int(query.get("after")), limit=PAGE_SIZE + 1)  # fmt: skip
        page, _, older, newest = await self._list_page(where, filters)
        return self.render(request, viewer, "jobs.html", title="Jobs", active="jobs",
                           fragment="fragments/jobs.html", jobs=page, f=filters,
                           older=older, newest=newest)  # fmt: skip

    async def _list_page(
        self, where: JobFilter, filters: dict[str, str]
    ) -> tuple[list[Job], dict[str, str], str | None, str | None]:
        """A page of jobs (``where.limit`` is one more than a page), the filters in use,
        and the links to the older page and back to the newest."""
        found = await self.engine.ops.jobs(where)
        page, more = found[:PAGE_SIZE], len(found) > PAGE_SIZE
        kept = {k: v for k, v in filters.items() if v}
        older = f"?{urlencode({**kept, 'after': page[-1].id})}" if more else None
        newest = f"?{urlencode(kept)}" if where.after_id is not None else None
        return page, kept, older, newest

    async def job(self, request: Request, viewer: Viewer) -> Response:
        raw: str = request.path_params["job_id"]
        wanted = _count(raw, MAX_JOB_ID)
        job = None if wanted is None else await self._visible(viewer, wanted)
        if job is None:
            return self.render_error(request, 404, f"No job {raw[:40]} here.", viewer)
        job_id = job.id
        try:
            explained = (await self.engine.ops.explain(job_id)).message
            graph = await self.engine.ops.dependencies(job_id)
        except JobNotFound:
            explained, graph = f"job {job_id} is gone", None
        return self.render(request, viewer, "job.html", title=f"Job {job_id}", active="jobs",
                           fragment="fragments/job.html", job=job, explained=explained,
                           graph=graph,
                           events=views.timeline(job), back=f"{self.base}/jobs/{job_id}",
                           actions=_actions_for(job))  # fmt: skip

    async def dead(self, request: Request, viewer: Viewer) -> Response:
        query = request.query_params
        filters = {"ns": self.scope(request, viewer) or "", "queue": _name(query.get("queue", "")),
                   "task": _name(query.get("task", ""))}  # fmt: skip
        where = JobFilter(namespace=filters["ns"] or None, state=State.DEAD,
                          queue=filters["queue"] or None, task=filters["task"] or None,
                          after_id=_int(query.get("after")), limit=PAGE_SIZE + 1)  # fmt: skip
        page, kept, older, newest = await self._list_page(where, filters)
        back = f"{self.base}/dead" + (f"?{urlencode(kept)}" if kept else "")
        return self.render(request, viewer, "dead.html", title="Dead letters", active="dead",
                           fragment="fragments/dead.html", jobs=page, f=filters, older=older,
                           newest=newest, back=back)  # fmt: skip

    async def lanes(self, request: Request, viewer: Viewer) -> Response:
        namespace = self.scope(request, viewer) or "default"
        data = await self.engine.ops.lanes_page(namespace)
        # A refused lane rule comes back here by redirect, with the reason.
        error = request.query_params.get("rule_error", "")[:300] or None
        return self.render(request, viewer, "lanes.html", title="Lanes",
                           active="lanes", fragment="fragments/lanes.html", l=data,
                           ns=namespace, error=error,
                           back=f"{self.base}/lanes?{urlencode({'ns': namespace})}")  # fmt: skip

    async def workers(self, request: Request, viewer: Viewer) -> Response:
        namespace = self.scope(request, viewer)
        found = await self.engine.ops.workers(namespace, alive=True)
        return self.render(request, viewer, "workers.html", title="Workers", active="workers",
                           fragment="fragments/workers.html", workers=found,
                           ns=namespace or "", alive=insights.WORKER_ALIVE_SECONDS)  # fmt: skip

    # -- actions -----------------------------------------------------------------

    async def action(self, request: Request, viewer: Viewer) -> Response:
        """Respawn, purge or cancel jobs: first a page to confirm, then the deed."""
        form: Form = request.state.form
        name = form.get("action")
        if name not in ACTIONS:
            raise BadInput("unknown action")
        ids = sorted({_job_id(raw) for raw in form.all("ids")})
        if not ids:
            raise BadInput("no job selected")
        if len(ids) > MAX_IDS:
            raise BadInput(f"at most {MAX_IDS} jobs at once")
        back = _back(form.get("back"), self.base)
        states, verb = ACTIONS[name]
        found = [job for job in [await self._visible(viewer, i) for i in ids] if job is not None]
        eligible = [job for job in found if job.state in states]
        if form.get("confirm") != "yes":
            return self.render(request, viewer, "confirm.html", title=f"{verb}?", active="",
                               action=name, verb=verb, jobs=eligible,
                               skipped=len(ids) - len(eligible), back=back)  # fmt: skip
        done, notice = await self._act(name, [job.id for job in eligible])
        joiner = "&" if "?" in back else "?"
        return RedirectResponse(f"{back}{joiner}{urlencode({'done': notice, 'n': done})}", 303)

    async def _act(self, name: str, ids: list[int]) -> tuple[int, str]:
        """Do it; how many jobs it changed, and the notice that says so."""
        app = self.engine.app
        if not ids:
            return 0, name
        if name == "respawn":
            return len(await app.respawn_async(ids)), name
        if name == "purge":
            return await app.purge_async(ids), name
        cancelled, requested = 0, 0
        for job_id in ids:
            try:
                job = await app.cancel_async(job_id)
            except FerryqError:
                continue  # finished meanwhile
            if job.state == State.CANCELLED:
                cancelled += 1
            else:  # running: its handler is asked to stop
                requested += 1
        return (requested, "cancel-requested") if requested else (cancelled, name)

    async def lane_rule(self, request: Request, viewer: Viewer) -> Response:
        form: Form = request.state.form
        namespace = viewer.namespace or _namespace(form.get("ns")) or "default"
        pattern = _text(form.get("pattern").strip())
        ops = self.engine.ops
        back = f"{self.base}/lanes?{urlencode({'ns': namespace})}"
        op = form.get("op") or "set"
        if op not in ("set", "delete"):
            raise BadInput(f"unknown operation {op[:40]!r}")
        try:
            if op == "delete":
                if not await ops.clear_lane_limit(namespace, pattern):
                    raise ValueError(f"no lane rule {pattern[:80]!r} in {namespace}")
                return RedirectResponse(f"{back}&done=rule-deleted", 303)
            limit = _int(form.get("limit")) or 0
            rate_n = _int((form.get("rate_n") or "").strip())
            rate = (
                None if rate_n is None else lanes.check_rate(rate_n, _seconds(form.get("rate_per")))
            )
            await ops.set_lane_rule(namespace, pattern, limit, form.get("on_dead"), rate)
        except ValueError as exc:
            # Back to the lanes page, which shows why (and which a reload does not post).
            return RedirectResponse(f"{back}&{urlencode({'rule_error': str(exc)[:300]})}", 303)
        return RedirectResponse(f"{back}&done=rule", 303)

    async def _visible(self, viewer: Viewer, job_id: int) -> Job | None:
        job = await self.engine.ops.find(job_id)
        return job if job is not None and viewer.may_see(job.namespace) else None

    # -- signing in and out ------------------------------------------------------

    async def login_form(self, request: Request) -> Response:
        return self._login_page(request, None, 200)

    def _login_page(
        self, request: Request, error: str | None, status: int, after: str | None = None
    ) -> Response:
        csrf = new_csrf()
        response = self.render(request, None, "login.html", status, title="Sign in", active="",
                               csrf=csrf, error=error, admin=self.sessions.admin_enabled,
                               next=_next(after or request.query_params.get("next"), self.base),
                               notice=None)  # fmt: skip
        self._cookie(request, response, LOGIN_COOKIE, csrf, 3600)
        return response

    async def login(self, request: Request) -> Response:
        form = await self._posted_form(request)
        if isinstance(form, Response):
            return form
        expected = request.cookies.get(LOGIN_COOKIE)
        if expected is None or not csrf_ok(expected, form.get("csrf") or None):
            message = "The sign-in form expired; try again."
            return self._login_page(request, message, 403, form.get("next"))
        viewer = await self._sign_in(form)
        if viewer is None:
            # Failures wait their turn, one pause each: guessing goes at two tries a
            # second at most, however many are sent at once.
            async with self._failures:
                await asyncio.sleep(FAILED_LOGIN_PAUSE)
            return self._login_page(request, "Wrong credential or token.", 401, form.get("next"))
        response = RedirectResponse(_next(form.get("next"), self.base), 303)
        self._cookie(request, response, COOKIE, self.sessions.sign(viewer), SESSION_SECONDS)
        response.delete_cookie(LOGIN_COOKIE, path=self.base)
        return response

    async def _sign_in(self, form: Form) -> Viewer | None:
        secret = form.get("token").strip()
        if secret:
            token = await self.engine.tokens.lookup(tokens.split_pool(secret)[1])
            return None if token is None else self.sessions.token(token)
        return self.sessions.admin(form.get("user"), form.get("password"))

    async def logout(self, request: Request, viewer: Viewer) -> Response:
        response = RedirectResponse(f"{self.base}/login", 303)
        response.delete_cookie(COOKIE, path=self.base)
        return response

    def _cookie(
        self, request: Request, response: Response, name: str, value: str, age: int
    ) -> None:
        response.set_cookie(name, value, max_age=age, path=self.base, httponly=True,
                            samesite="strict", secure=request.url.scheme == "https")  # fmt: skip


def build_dashboard(
    engine: Engine, credential: str | None, base: str = "/ui", session_secret: str | None = None
) -> Starlette:
    """The dashboard app, to be mounted at ``base`` on the API port."""
    dashboard = Dashboard(engine, credential, base, session_secret)
    app = Starlette(routes=dashboard.routes(),
                    exception_handlers={HTTPException: dashboard.not_found})  # fmt: skip
    app.add_middleware(SecurityHeaders)
    return app


# -- input ---------------------------------------------------------------------


async def _form(request: Request) -> Form:
    if not request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
        raise BadInput("expected a form")
    try:
        body = await http.read_body(request, MAX_FORM_BYTES)
    except http.RequestTooLarge:
        raise BadInput("form too large") from None
    fields: dict[str, list[str]] = {}
    for key, value in parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True):
        fields.setdefault(key, []).append(value)
    return Form(fields)


def _name(raw: str) -> str:
    value = raw.strip()
    if len(value) > http.MAX_NAME_LENGTH:
        raise BadInput(f"at most {http.MAX_NAME_LENGTH} characters in a name")
    return _text(value)


def _namespace(raw: str) -> str:
    value = _name(raw)
    if value and not NAME_RE.fullmatch(value):
        raise BadInput("a namespace is letters, digits and -_.: only")
    return value


def _text(raw: str) -> str:
    if len(raw) > MAX_TEXT:
        raise BadInput(f"at most {MAX_TEXT} characters to search for")
    if "\x00" in raw:
        raise BadInput("NUL characters cannot be searched for or stored")
    return raw


def _seconds(raw: str | None) -> float:
    """A rate's window from a form: 1 s when left empty."""
    if raw is None or raw.strip() == "":
        return 1.0
    try:
        return float(raw)
    except ValueError:
        raise BadInput(f"not a number of seconds: {raw[:40]!r}") from None


def _int(raw: str | None) -> int | None:
    if raw is None or raw == "":
        return None
    value = _count(raw, MAX_JOB_ID)
    if value is None:
        raise BadInput(f"not a whole number: {raw[:40]!r}")
    return value


def _count(raw: str, largest: int) -> int | None:
    """ASCII digits up to ``largest``, else None. Not ``str.isdigit`` alone: '²'
    passes it and ``int()`` raises on it; nor ``int()`` alone: it takes signs, spaces,
    underscores and other scripts' digits, and raises past 4300 digits."""
    if not (raw.isascii() and raw.isdigit()) or len(raw) > len(str(largest)):
        return None
    value = int(raw)
    return value if value <= largest else None


def _job_id(raw: str) -> int:
    value = _int(raw)
    if value is None:
        raise BadInput("not a job id")
    return value


def _back(raw: str, base: str) -> str:
    """Where to go after an action: a dashboard path, never another site."""
    return raw if _in_dashboard(raw, base) else f"{base}/dead"


def _next(raw: str | None, base: str) -> str:
    return raw if raw and (raw == base or _in_dashboard(raw, base)) else f"{base}/"


def _in_dashboard(raw: str, base: str) -> bool:
    """A path below ``base`` that cannot leave it (no ``..``, no other host)."""
    path = raw.split("?", 1)[0]
    return (
        raw.startswith(f"{base}/")
        and "//" not in raw
        and "\\" not in raw
        and ".." not in path.split("/")
    )


def _same_origin(request: Request) -> bool:
    """A browser names the page a POST comes from; it must be this server's."""
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        return origin is None
    host = request.headers.get("host", "")
    return origin.split("://", 1)[-1] == host


def _notice(request: Request) -> str | None:
    done = request.query_params.get("done")
    if done not in NOTICES:
        return None
    count = _count(request.query_params.get("n", "0"), MAX_NOTICE_COUNT)
    return NOTICES[done].format(n=0 if count is None else count)


def _actions_for(job: Job) -> list[tuple[str, str]]:
    return [(name, verb) for name, (states, verb) in ACTIONS.items() if job.state in states]
