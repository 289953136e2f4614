"""The dashboard's pure parts: the hour's tally, a job's timeline, the charts, sessions."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar, cast

import pytest

from ferryq import insights
from ferryq.dashboard import charts, views
from ferryq.dashboard.auth import Sessions, Viewer
from ferryq.dashboard.overviews import Overviews
from ferryq.dashboard.routes import Dashboard
from ferryq.errors import ConfigurationError
from ferryq.job import Job, State
from ferryq.ops import Operations, Token
from ferryq.ops import views as read_models
from ferryq.server.engine import Engine
from ferryq.store.base import Store

NOW = 1_800_000_000.0
T = TypeVar("T")
SINCE = NOW - 3600


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on a loop of its own thread: the browser's loop may hold this one."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def job(job_id: int, state: State, **fields: Any) -> Job:
    return Job(job_id, "default", "q", "t", [], state, **fields)


def failure(at: float, attempt: int, kind: str = "RuntimeError") -> dict[str, Any]:
    return {"type": kind, "message": "boom", "traceback": "Traceback…", "attempt": attempt,
            "stage": None, "worker": "w1", "at": at}  # fmt: skip


def test_the_tally_counts_finishes_failures_lag_and_lease_recoveries() -> None:
    jobs = [
        job(1, State.SUCCEEDED, run_at=NOW - 100, claimed_at=NOW - 99.5, finished_at=NOW - 99),
        job(
            2, State.DEAD, finished_at=NOW - 30, errors=[failure(NOW - 40, 1), failure(NOW - 30, 2)]
        ),
        job(3, State.READY, errors=[failure(NOW - 20, 1, "LeaseExpired")]),
        job(4, State.SUCCEEDED, finished_at=NOW - 7200),  # before the hour
        job(5, State.CANCELLED, finished_at=NOW - 10),
    ]
    tally = read_models.tally(jobs, SINCE, NOW, SINCE)
    # The dead job's last failure is its death, not a retried attempt.
    assert (tally.finished, tally.dead, tally.failed) == (3, 1, 2)
    assert tally.lease_recoveries == 1
    assert tally.complete
    last = tally.buckets[-1]
    assert (last.succeeded, last.dead, last.other) == (0, 1, 1)
    waits = [w for b in tally.buckets for w in b.waits]
    assert waits == [0.5]


def test_a_sample_cut_short_says_from_when_it_covers() -> None:
    tally = read_models.tally([], SINCE, NOW, NOW - 600)
    assert not tally.complete
    svg = charts.throughput(tally)
    assert 'class="cut"' in svg


def test_the_timeline_puts_attempts_and_stages_in_order() -> None:
    dead = job(
        9, State.DEAD, created_at=NOW - 50, run_at=NOW - 50, attempts=2, fence=2, worker="w1",
        claimed_at=NOW - 10, started_at=NOW - 9.9, finished_at=NOW - 9,
        errors=[failure(NOW - 20, 1), failure(NOW - 9, 2)],
        stages=[{"stage": None, "outcome": "next", "started_at": NOW - 45,
                 "finished_at": NOW - 44}],
    )  # fmt: skip
    events = views.timeline(dead)
    assert [e.what for e in events] == [
        "enqueued", "stage first stage done", "attempt 1 failed", "attempt 2 claimed",
        "attempt 2 started", "attempt 2 failed, no tries left: dead",
    ]  # fmt: skip
    assert "fencing token 2" in events[3].detail
    assert events[2].traceback == "Traceback…"


def test_timed_out_attempts_and_the_time_limit_in_the_timeline() -> None:
    timed_out = {**failure(NOW - 30, 1, "TimedOut"), "traceback": None}
    dead = job(9, State.DEAD, created_at=NOW - 100, run_at=NOW - 100, attempts=2, timeout=30.0,
               errors=[timed_out, {**timed_out, "attempt": 2, "at": NOW - 5}],
               finished_at=NOW - 5)  # fmt: skip
    events = [(e.what, e.kind) for e in views.timeline(dead)]
    assert events == [
        ("enqueued", "info"), ("attempt 1 timed out after 30 s", "timeout"),
        ("attempt 2 timed out after 30 s, no tries left: dead", "dead"),
    ]  # fmt: skip
    assert views.timeline(dead)[1].detail == "TimedOut: stopped at its time limit — worker w1"
    running = job(10, State.RUNNING, created_at=NOW - 10, run_at=NOW - 10, attempts=1,
                  claimed_at=NOW - 9, started_at=NOW - 8, lease_until=NOW + 50, timeout=30.0,
                  progress={"done": 3, "total": None, "note": None, "at": NOW - 1})  # fmt: skip
    assert ("time limit passes", NOW + 22) in [(e.what, e.at) for e in views.timeline(running)]
    shown = views.progress(running)
    assert shown is not None and shown.text == "3" and shown.fraction is None
    assert not shown.last and shown.at == NOW - 1
    over = views.progress(job(11, State.SUCCEEDED, progress={"done": 12, "total": 10}))
    assert over is not None and over.text == "12 / 10 (120%)" and over.fraction == 1.0
    assert over.last
    assert views.progress(job(12, State.RUNNING)) is None


def test_charts_escape_their_text_and_hold_only_numbers() -> None:
    jobs = [job(1, State.SUCCEEDED, finished_at=NOW - 5, claimed_at=NOW - 6, run_at=NOW - 8)]
    tally = read_models.tally(jobs, SINCE, NOW, SINCE)
    for svg in (charts.throughput(tally), charts.lag(tally)):
        assert svg.startswith("<svg") and svg.endswith("</svg>")
        assert "<script" not in svg


class _Tokens:
    """Just enough of the operations for sessions: one token, which can be revoked."""

    def __init__(self, token: Token) -> None:
        self.token: Token | None = token

    async def token_get(self, digest: str) -> Token | None:
        return self.token if self.token and self.token.digest == digest else None


def test_sessions_are_signed_and_end_with_their_token() -> None:
    token = Token("tenant", "ab" * 32, "ci", "ABCDEF…", NOW)
    tokens = _Tokens(token)
    store: Operations = tokens  # type: ignore[assignment]
    sessions = Sessions(lambda: store, "admin:pw", clock=lambda: NOW)
    admin = sessions.admin("admin", "pw")
    assert admin is not None and admin.namespace is None
    assert sessions.admin("admin", "wrong") is None
    assert sessions.admin("root", "pw") is None

    cookie = sessions.sign(sessions.token(token))
    viewer = run(sessions.read(cookie))
    assert viewer is not None and viewer.namespace == "tenant"
    body, mac = cookie.split(".")
    assert run(sessions.read(f"{body}x.{mac}")) is None
    other = Sessions(lambda: store, "admin:pw", clock=lambda: NOW)  # another server's key
    assert run(other.read(cookie)) is None
    later = Sessions(lambda: store, "admin:pw", clock=lambda: NOW + 13 * 3600)
    assert run(later.read(later.sign(viewer))) is None  # expired

    without_admin = Sessions(lambda: store, None, clock=lambda: NOW)
    assert without_admin.admin("", "") is None
    assert run(without_admin.read(without_admin.sign(admin))) is None


def test_servers_sharing_a_session_secret_read_each_others_sessions() -> None:
    store: Operations = _Tokens(Token("tenant", "ab" * 32, "ci", "ABCDEF…", NOW))  # type: ignore[assignment]
    secret = "s" * 32

    def server(secret: str | None = secret, credential: str = "admin:pw") -> Sessions:
        return Sessions(lambda: store, credential, secret=secret, clock=lambda: NOW)

    admin = server().admin("admin", "pw")
    assert admin is not None
    cookie = server().sign(admin)
    assert run(server().read(cookie)) == admin  # another server, or the same restarted
    assert run(server(secret="t" * 32).read(cookie)) is None
    assert run(server(secret=None).read(cookie)) is None
    assert run(server(credential="admin:new-pw").read(cookie)) is None  # password changed
    with pytest.raises(ConfigurationError, match="at least 32 characters"):
        server(secret="short")


def test_a_first_overview_is_waited_for_briefly_then_counted_in_the_background(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario() -> None:
        go = asyncio.Event()
        counted: list[str | None] = []

        made = read_models.tally([], SINCE, NOW, SINCE)

        async def slow_overview(store: object, namespace: str | None, now: float) -> Any:
            counted.append(namespace)
            await go.wait()
            return read_models.Overview([], {}, made, [], [], [], now)

        monkeypatch.setattr(read_models, "overview", slow_overview)
        overviews = Overviews(f"sqlite:///{tmp_path}/ferryq.db", lambda: NOW)
        assert await overviews.get("a", wait=0.01) is None  # still counting
        assert await overviews.get("a", wait=0.01) is None  # the same count, not a second
        go.set()
        first = await overviews.get("a", wait=1.0)
        assert first is not None and first.activity is made
        assert await overviews.get("a", wait=0.01) is first  # kept
        assert counted == ["a"]
        await overviews.close()

    run(scenario())


def test_the_overview_page_says_it_is_counting_until_its_first_count() -> None:
    engine = SimpleNamespace(app=SimpleNamespace(url="sqlite:///unused.db"), now=lambda: NOW)
    dashboard = Dashboard(cast(Engine, engine), "admin:pw", "/ui")
    viewer = Viewer("admin", None, "admin", "csrf-value")
    page = dashboard.env.get_template("overview.html").render(
        viewer=viewer, now=NOW, title="Overview", active="overview", notice=None, error=None,
        fragment="fragments/counting.html", ns="",
    )  # fmt: skip
    assert 'id="counting"' in page and 'id="live"' in page


def test_a_job_page_shows_times_beyond_any_calendar() -> None:
    far = job(7, State.SCHEDULED, created_at=NOW, run_at=1e300, expires_at=math.inf,
              errors=[failure(-1e300, 1)])  # fmt: skip

    class OneJob:
        async def job_get(self, job_id: int) -> Job:
            return far

    explained = run(insights.explain(cast(Store, OneJob()), far.id, NOW)).message
    assert explained == "job 7: scheduled until Unix time 1e+300"
    engine = SimpleNamespace(app=SimpleNamespace(url="sqlite:///unused.db"), now=lambda: NOW)
    dashboard = Dashboard(cast(Engine, engine), "admin:pw", "/ui")
    page = dashboard.env.get_template("job.html").render(
        viewer=Viewer("admin", None, "admin", "csrf-value"), now=NOW, title="Job 7",
        active="jobs", notice=None, error=None, fragment="fragments/job.html", job=far,
        explained=explained, events=views.timeline(far), back="/ui/jobs/7", actions=[],
    )  # fmt: skip
    assert "due Unix time 1e+300" in page
    assert "Unix time inf" in page and "Unix time -1e+300" in page
    assert views.ago(1e300, NOW) == "in 2.78e+296 h"
