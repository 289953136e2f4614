"""Every page renders the real jobs of a real server, in a real browser; and behind a
transaction pooler, answers with them over HTTP."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import pytest
from playwright.sync_api import Page, expect

import ferryq
from ferryq.store import Store, open_store
from ferryq.store.base import Finish, WorkerInfo
from tests.conftest import POOLED
from tests.dashboard.conftest import Dash, signed_in_client
from tests.dashboard.story import (
    OTHER_NAMESPACE,
    PAGED,
    SCRIPT,
    BlockingWorker,
    fresh_namespace,
    tasks,
)

T = TypeVar("T")


def test_overview_counts_charts_and_dead_letters(admin: Page, dash: Dash) -> None:
    admin.goto(dash.url("/ui/?ns=default"))  # other tests add jobs in namespaces of their own
    expect(admin).to_have_title("Overview · ferryq")
    mail = admin.locator('tr[data-queue="mail"]')
    expect(mail.locator("td").nth(6)).to_have_text(str(PAGED))  # succeeded
    expect(admin.locator('tr[data-queue="uploads"]')).to_be_visible()
    expect(admin.locator('[data-count="dead"]')).to_have_text("3")
    expect(admin.locator('[data-count="halted"]')).to_have_text("1")
    # The tile leads to the lanes page of the namespace whose lane is halted.
    tile = admin.locator("a.tile", has=admin.locator('[data-count="halted"]'))
    expect(tile).to_have_attribute("href", "/ui/lanes?ns=default")
    expect(admin.locator('[data-count="scheduled"]')).to_have_text("1")
    # Both charts are drawn, with bars for the minute the story ran.
    expect(admin.locator("svg.chart")).to_have_count(2)
    assert admin.locator("svg.chart rect.c-ok").count() >= 1
    assert admin.locator("svg.chart rect.c-dead").count() >= 1
    expect(admin.locator("svg.chart polyline, svg.chart circle").first).to_be_attached()
    expect(admin.get_by_text("storage refused backups/2026-11.tar.gz")).to_be_visible()
    dash.shot(admin, "overview")


def test_jobs_list_pages_through_history(admin: Page, dash: Dash) -> None:
    story = dash.story
    admin.goto(dash.url("/ui/jobs?ns=default&queue=mail"))
    rows = admin.locator("tr[data-job]")
    expect(rows).to_have_count(50)
    newest_mail = [*story.mail, story.halted_behind, story.delayed]
    newest_mail.sort(reverse=True)
    expect(rows.first).to_have_attribute("data-job", str(newest_mail[0]))
    dash.shot(admin, "jobs")
    admin.click("a[data-page=older]")
    expect(rows.first).to_have_attribute("data-job", str(newest_mail[50]))
    admin.click("a[data-page=older]")
    expect(rows).to_have_count(len(newest_mail) - 100)
    expect(rows.last).to_have_attribute("data-job", str(newest_mail[-1]))
    expect(admin.locator("a[data-page=older]")).to_have_count(0)
    admin.click("a[data-page=newest]")
    expect(rows.first).to_have_attribute("data-job", str(newest_mail[0]))


def test_jobs_list_filters(admin: Page, dash: Dash) -> None:
    story = dash.story
    admin.goto(dash.url("/ui/jobs"))
    admin.fill("#filters input[name=ns]", "default")
    admin.select_option("#filters select[name=state]", "dead")
    admin.click("#filters button[type=submit]")
    rows = admin.locator("tr[data-job]")
    expect(rows).to_have_count(3)
    expect(admin.locator("#filters select[name=state]")).to_have_value("dead")

    admin.goto(dash.url("/ui/jobs"))
    admin.fill("#filters input[name=lane]", "post:7")
    admin.click("#filters button[type=submit]")
    expect(rows).to_have_count(3)
    expect(rows.first).to_have_attribute("data-job", str(story.lane[-1]))

    admin.goto(dash.url("/ui/jobs"))
    admin.fill("#filters input[name=q]", "user42@")
    admin.fill("#filters input[name=task]", "send")
    admin.click("#filters button[type=submit]")
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-job", str(story.mail[42]))

    admin.goto(dash.url(f"/ui/jobs?ns={OTHER_NAMESPACE}&state=succeeded"))
    expect(rows).to_have_count(2)
    expect(admin.locator("tbody")).to_contain_text("secret")


def test_job_page_shows_attempts_traceback_fence_and_explain(admin: Page, dash: Dash) -> None:
    admin.goto(dash.url(f"/ui/jobs/{dash.story.dead}"))
    expect(admin.locator("h1")).to_contain_text(f"Job #{dash.story.dead}")
    expect(admin.locator("#explain")).to_contain_text("dead since")
    expect(admin.locator("#explain")).to_contain_text("after 2 attempt(s)")
    expect(admin.locator("#args")).to_contain_text("backups/2026-11.tar.gz")
    expect(admin.locator("#traceback")).to_contain_text("ConnectionError: storage refused")
    expect(admin.locator("#fence")).to_have_text("2")
    expect(admin.locator("#worker")).not_to_have_text("-")
    timeline = admin.locator("#timeline li")
    expect(timeline.first).to_contain_text("enqueued")
    expect(admin.locator("#timeline")).to_contain_text("attempt 1 failed")
    expect(admin.locator("#timeline")).to_contain_text("attempt 2 failed, no tries left")
    expect(admin.locator("#timeline")).to_contain_text("fencing token 2")
    dash.shot(admin, "job")

    admin.goto(dash.url(f"/ui/jobs/{dash.story.mail[0]}"))
    expect(admin.locator("#result")).to_contain_text('"sent": "user0@example.com"')
    expect(admin.locator("#explain")).to_contain_text("succeeded at")
    expect(admin.locator("dl")).to_contain_text("(claimed to started)")


@pytest.mark.parametrize("dash", ["sqlite"], indirect=True)  # the same on every backend
def test_job_page_updates_live_without_a_reload(admin: Page, dash: Dash) -> None:
    app = ferryq.App(dash.story.url, namespace=fresh_namespace())
    job = tasks(app)["send"].options(delay=600).enqueue("live@example.com")
    try:
        admin.goto(dash.url(f"/ui/jobs/{job.id}"))
        expect(admin.locator("h1 .state")).to_have_text("scheduled")
        admin.evaluate("window.__sameDocument = true")
        app.cancel(job.id)
        expect(admin.locator("h1 .state")).to_have_text("cancelled")
        assert admin.evaluate("window.__sameDocument") is True
        expect(admin.locator("#live-status")).to_contain_text("live")
    finally:
        app.close()


def _in_thread(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on a loop of its own thread: the browser's loop holds this one."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


async def _claim_and_report(url: str, namespace: str, job_id: int, report: dict[str, Any]) -> int:
    """Claim the job as worker w1 and store ``report`` as its progress, as a lease
    renewal does; the fence."""
    store = open_store(url)
    await store.open()
    try:
        (claimed,) = await store.job_claim(namespace, ["default"], 1, "w1", time.time())
        assert claimed.id == job_id
        await _report(store, job_id, claimed.fence, report)
        return claimed.fence
    finally:
        await store.close()


async def _report(store: Store, job_id: int, fence: int, report: dict[str, Any]) -> None:
    leases = await store.job_leases([(job_id, fence)], [job_id], time.time(),
                                    progress={job_id: json.dumps(report)})  # fmt: skip
    assert leases.extended == [job_id]


async def _report_again(url: str, job_id: int, fence: int, report: dict[str, Any]) -> None:
    store = open_store(url)
    await store.open()
    try:
        await _report(store, job_id, fence, report)
    finally:
        await store.close()


async def _time_out(url: str, job_id: int, fence: int) -> None:
    """End the attempt as the worker does when its time limit passed: a retry."""
    store = open_store(url)
    await store.open()
    now = time.time()
    error = {"type": "TimedOut", "message": "timed out: the attempt ran past its time limit "
             "of 30 s and was stopped", "traceback": None, "attempt": 1, "stage": None,
             "worker": "w1", "at": now}  # fmt: skip
    try:
        await store.job_finish_many([Finish("retry", job_id, fence, now, now - 30, error=error,
                                            run_at=now + 3600, order_time=now + 3600)])  # fmt: skip
    finally:
        await store.close()


@pytest.mark.parametrize("dash", ["sqlite"], indirect=True)  # the same on every backend
def test_job_page_shows_the_time_limit_and_live_progress_with_its_note_as_text(
    admin: Page, dash: Dash
) -> None:
    namespace, url = fresh_namespace(), dash.story.url
    app = ferryq.App(url, namespace=namespace)
    try:
        job_id = app.enqueue("resize", ["a.png"], timeout=30).id
    finally:
        app.close()
    report = {"done": 4000, "total": 10000, "note": SCRIPT, "at": time.time()}
    fence = _in_thread(_claim_and_report(url, namespace, job_id, report))
    admin.goto(dash.url(f"/ui/jobs/{job_id}"))
    expect(admin.locator("h1 .state")).to_have_text("running")
    expect(admin.locator("#timeout")).to_have_text("30.0 s per attempt")
    expect(admin.locator("#progress progress")).to_have_attribute("value", "0.4")
    expect(admin.locator("#progress .count")).to_have_text("4,000 / 10,000 (40%)")
    expect(admin.locator("#progress-note")).to_have_text(SCRIPT)
    expect(admin.locator("#explain")).to_contain_text("time limit 30 s: stopped at")
    expect(admin.locator("#timeline")).to_contain_text("time limit passes")
    assert admin.locator("#live script, #live img").count() == 0
    dash.shot(admin, "job-progress")

    admin.evaluate("window.__sameDocument = true")
    _in_thread(_report_again(url, job_id, fence, {**report, "done": 9000, "note": "almost"}))
    expect(admin.locator("#progress .count")).to_have_text("9,000 / 10,000 (90%)")
    expect(admin.locator("#progress progress")).to_have_attribute("value", "0.9")
    expect(admin.locator("#progress-note")).to_have_text("almost")

    _in_thread(_time_out(url, job_id, fence))
    expect(admin.locator("h1 .state")).to_have_text("scheduled")
    expect(admin.locator("#timeline li.t-timeout")).to_contain_text(
        "attempt 1 timed out after 30 s"
    )
    expect(admin.locator("#error")).to_have_text("timed out after 30 s")
    expect(admin.locator("#explain")).to_contain_text("after it timed out (limit 30 s)")
    expect(admin.locator("#progress")).to_contain_text("9,000 / 10,000 (90%) — almost")
    expect(admin.locator("#progress progress")).to_have_count(0)  # a bar for a running job only
    assert admin.evaluate("window.__sameDocument") is True
    assert admin.evaluate("window.__injected") is None


def test_job_page_shows_what_a_job_waits_for_and_what_waits_for_it(admin: Page, dash: Dash) -> None:
    app = ferryq.App(dash.story.url, namespace=fresh_namespace())
    try:
        members = app.enqueue_many("resize", [["a.png"], ["b.png"]], delay=3600)
        callback = app.enqueue("resize", ["album"], after=members)
    finally:
        app.close()
    admin.goto(dash.url(f"/ui/jobs/{callback.id}"))
    expect(admin.locator("h1 .state")).to_have_text("scheduled")
    expect(admin.locator("#explain")).to_contain_text("waiting for 2 of its 2 dependencies")
    expect(admin.locator("#after li")).to_have_text([f"#{m.id} not ended" for m in members])
    expect(admin.locator("#dependents")).to_have_count(0)
    expect(admin.get_by_text("once its dependencies end", exact=True)).to_be_visible()
    expect(admin.locator("#timeline")).to_contain_text("due once its dependencies end")
    dash.shot(admin, "job-dependencies")
    admin.locator("#after a").first.click()
    expect(admin).to_have_url(dash.url(f"/ui/jobs/{members[0].id}"))
    expect(admin.locator("#dependents li")).to_have_text([f"#{callback.id} waiting"])


def test_workers_page_shows_live_workers_and_their_jobs(admin: Page, dash: Dash) -> None:
    worker = BlockingWorker(dash.story.url)
    worker.start()
    try:
        held = worker.hold.enqueue()
        assert worker.started.wait(30), "the worker never started the job"
        admin.goto(dash.url("/ui/workers"))
        row = admin.locator(f'tr[data-worker="{worker.worker.id}"]')
        expect(row).to_contain_text("hold")
        expect(row.locator(f'a[href$="/jobs/{held.id}"]')).to_be_visible()
        dash.shot(admin, "workers")
    finally:
        worker.release_and_stop()


def test_lanes_page_lists_halted_and_busy_lanes_and_rules(admin: Page, dash: Dash) -> None:
    admin.goto(dash.url("/ui/lanes"))
    halted = admin.locator('tr[data-lane="orders:1"]').first
    expect(halted).to_contain_text(f"#{dash.story.halted_by}")
    expect(admin.locator('tr[data-rule="orders:*"]')).to_be_visible()
    expect(admin.locator('tr[data-rule="orders:*"] select[name=on_dead]')).to_have_value("halt")
    dash.shot(admin, "lanes")


@pytest.mark.parametrize("dash", ["sqlite"], indirect=True)  # the actions' tests cover both
def test_dead_letters_page_lists_dead_jobs(admin: Page, dash: Dash) -> None:
    admin.goto(dash.url("/ui/dead"))
    rows = admin.locator("tr[data-job]")
    expect(admin.locator(f'tr[data-job="{dash.story.dead}"]')).to_contain_text("storage refused")
    assert rows.count() >= 1
    dash.shot(admin, "dead")


@pytest.mark.parametrize("dash", [POOLED], indirect=True)  # the browser's tests: the others
def test_behind_a_transaction_pooler_every_page_answers_with_the_story(dash: Dash) -> None:
    """The server on ``?pooler=transaction`` through a real PgBouncer, no direct URL: its
    database migrated and the story told through it, every page answers with the
    story's jobs (how they look is the browser's tests' to check)."""
    story = dash.story
    worker = f"worker-{time.monotonic_ns()}"
    _in_thread(_beat(story.url, worker))
    newest_mail = sorted([*story.mail, story.halted_behind, story.delayed])
    shown = {
        "/ui/?ns=default": ['data-count="dead">3<', 'data-count="halted">1<',
                            "storage refused backups/2026-11.tar.gz"],
        "/ui/jobs?ns=default&queue=mail": [f'data-job="{job}"' for job in newest_mail[-50:]],
        f"/ui/jobs/{story.dead}": [f"Job #{story.dead} ", "ConnectionError: storage refused"],
        "/ui/dead": [f'data-job="{story.dead}"', f'data-job="{story.injected}"'],
        "/ui/lanes": ['data-lane="orders:1"', f"#{story.halted_by}", 'data-rule="orders:*"'],
        "/ui/workers": [f'data-worker="{worker}"'],
    }  # fmt: skip
    with signed_in_client(dash) as client:
        for path, texts in shown.items():
            answer = client.get(path)
            assert answer.status_code == 200, f"{path}: {answer.status_code} {answer.text}"
            missing = [text for text in texts if text not in answer.text]
            assert not missing, f"{path} lacks {missing}"


async def _beat(url: str, worker: str) -> None:
    """A live worker's heartbeat, as its process sends it."""
    store = open_store(url)
    await store.open()
    try:
        now = time.time()
        await store.worker_beat(WorkerInfo(worker, "default", ["mail"], "host", 1, 4, now, now))
    finally:
        await store.close()
