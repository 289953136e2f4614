"""Operator actions from the browser change the jobs in the database.

Each test makes its own jobs in a namespace of its own, so the shared server's story
stays as the other tests expect it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Page, expect

import ferryq
from ferryq.errors import JobNotFound
from ferryq.lanes import LaneRule, Rate
from tests.dashboard.conftest import Dash
from tests.dashboard.story import fresh_namespace, run_all, tasks

# The page's part is the same on every backend, and the store's part is proven on each
# by the conformance suite: these run on SQLite only, to keep the suite quick.
SQLITE_ONLY = pytest.mark.parametrize("dash", ["sqlite"], indirect=True)


@pytest.fixture
def app(dash: Dash) -> Iterator[ferryq.App]:
    application = ferryq.App(dash.story.url, namespace=fresh_namespace())
    tasks(application)
    yield application
    application.close()


def dead_jobs(app: ferryq.App, count: int, lane: str | None = None) -> list[int]:
    upload = app.tasks["upload"].options(lane=lane) if lane else app.tasks["upload"]
    ids = [upload.enqueue(f"files/{n}.bin").id for n in range(count)]
    run_all(app)
    assert all(app.get_job(i).state == "dead" for i in ids)
    return ids


def test_respawn_one_job_from_its_page(admin: Page, dash: Dash, app: ferryq.App) -> None:
    [job] = dead_jobs(app, 1)
    admin.goto(dash.url(f"/ui/jobs/{job}"))
    admin.get_by_role("button", name="Respawn…").click()
    expect(admin.locator("h1")).to_have_text("Respawn 1 job?")
    dash.shot(admin, "confirm")
    admin.click("#confirm")
    expect(admin.locator(".notice")).to_have_text("Respawned 1 job(s).")
    assert app.get_job(job).state == "ready"
    assert app.get_job(job).attempts == 0
    expect(admin.locator("h1 .state")).to_have_text("ready")


@SQLITE_ONLY
def test_respawn_many_from_the_dead_letters(admin: Page, dash: Dash, app: ferryq.App) -> None:
    jobs = dead_jobs(app, 3)
    admin.goto(dash.url(f"/ui/dead?ns={app.namespace}"))
    expect(admin.locator("tr[data-job]")).to_have_count(3)
    admin.check("input[data-select-all]")
    admin.get_by_role("button", name="Respawn selected…").click()
    expect(admin.locator("h1")).to_have_text("Respawn 3 jobs?")
    admin.click("#confirm")
    expect(admin.locator(".notice")).to_have_text("Respawned 3 job(s).")
    expect(admin.locator(".empty")).to_have_text("No dead letters.")
    assert [app.get_job(i).state for i in jobs] == ["ready"] * 3


@SQLITE_ONLY
def test_purge_asks_first_and_keeps_jobs_when_told_to(
    admin: Page, dash: Dash, app: ferryq.App
) -> None:
    kept, purged = dead_jobs(app, 2)
    admin.goto(dash.url(f"/ui/dead?ns={app.namespace}"))
    admin.check(f'input[name=ids][value="{purged}"]')
    admin.get_by_role("button", name="Purge selected…").click()
    expect(admin.locator(".warn")).to_contain_text("deleted for good")
    admin.get_by_role("link", name="Keep them").click()
    assert app.get_job(purged).state == "dead"

    admin.check(f'input[name=ids][value="{purged}"]')
    admin.get_by_role("button", name="Purge selected…").click()
    admin.click("#confirm")
    expect(admin.locator(".notice")).to_have_text("Purged 1 job(s).")
    with pytest.raises(JobNotFound):
        app.get_job(purged)
    assert app.get_job(kept).state == "dead"
    expect(admin.locator("tr[data-job]")).to_have_count(1)


@SQLITE_ONLY
def test_lane_rules_are_added_edited_and_removed(admin: Page, dash: Dash, app: ferryq.App) -> None:
    admin.goto(dash.url(f"/ui/lanes?ns={app.namespace}"))
    form = admin.locator("#add-rule")
    form.locator("input[name=pattern]").fill("tenant:*")
    form.locator("input[name=limit]").fill("3")
    form.locator("select[name=on_dead]").select_option("halt")
    form.get_by_role("button", name="Add").click()
    expect(admin.locator(".notice")).to_have_text("Lane rule saved.")
    assert [(r.pattern, r.limit, r.on_dead) for r in app.lane_limits()] == [("tenant:*", 3, "halt")]

    row = admin.locator('tr[data-rule="tenant:*"]')
    row.locator("input[name=limit]").fill("5")
    row.get_by_role("button", name="Save").click()
    expect(admin.locator(".notice")).to_have_text("Lane rule saved.")
    assert [r.limit for r in app.lane_limits()] == [5]

    form.locator("input[name=pattern]").fill("bad*pattern")
    form.get_by_role("button", name="Add").click()
    expect(admin.locator(".error")).to_contain_text("'*' may only end a pattern")
    assert [r.pattern for r in app.lane_limits()] == ["tenant:*"]

    admin.locator('tr[data-rule="tenant:*"]').get_by_role("button", name="Remove").click()
    expect(admin.locator(".notice")).to_have_text("Lane rule removed.")
    assert app.lane_limits() == []


@SQLITE_ONLY
def test_a_lane_rate_is_set_shown_and_cleared(admin: Page, dash: Dash, app: ferryq.App) -> None:
    admin.goto(dash.url(f"/ui/lanes?ns={app.namespace}"))
    form = admin.locator("#add-rule")
    form.locator("input[name=pattern]").fill("api:*")
    form.locator("input[name=limit]").fill("2")
    form.locator("input[name=rate_n]").fill("10")
    form.locator("input[name=rate_per]").fill("2.5")
    form.get_by_role("button", name="Add").click()
    expect(admin.locator(".notice")).to_have_text("Lane rule saved.")
    assert app.lane_limits() == [LaneRule("api:*", 2, "continue", Rate(10, 2.5))]
    # The busiest lanes show each lane's rate; the rule's row keeps it when saved.
    app.tasks["send"].options(lane="api:1").enqueue("a@example.com")
    admin.reload()
    expect(admin.locator('tr[data-lane="api:1"]')).to_contain_text("10 per 2.5 s")
    row = admin.locator('tr[data-rule="api:*"]')
    expect(row.locator("input[name=rate_n]")).to_have_value("10")
    row.locator("input[name=limit]").fill("3")
    row.get_by_role("button", name="Save").click()
    expect(admin.locator(".notice")).to_have_text("Lane rule saved.")
    assert app.lane_limits() == [LaneRule("api:*", 3, "continue", Rate(10, 2.5))]

    row = admin.locator('tr[data-rule="api:*"]')
    row.locator("input[name=rate_per]").fill("100000")  # over a day
    row.get_by_role("button", name="Save").click()
    expect(admin.locator(".error")).to_contain_text("rate's per")
    assert app.lane_limits() == [LaneRule("api:*", 3, "continue", Rate(10, 2.5))]

    row = admin.locator('tr[data-rule="api:*"]')
    row.locator("input[name=rate_n]").fill("")
    row.get_by_role("button", name="Save").click()
    expect(admin.locator(".notice")).to_have_text("Lane rule saved.")
    assert app.lane_limits() == [LaneRule("api:*", 3, "continue")]


def test_a_halted_lane_is_released_by_respawning_its_dead_job(
    admin: Page, dash: Dash, app: ferryq.App
) -> None:
    app.set_lane_limit("jobs:*", 1, on_dead="halt")
    [dead] = dead_jobs(app, 1, lane="jobs:9")
    behind = app.tasks["send"].options(lane="jobs:9").enqueue("behind@example.com").id
    assert app.get_job(behind).state == "waiting"
    admin.goto(dash.url(f"/ui/lanes?ns={app.namespace}"))
    halted = admin.locator('tr[data-lane="jobs:9"]').first
    expect(halted).to_contain_text(f"#{dead}")
    halted.get_by_role("button", name="Respawn the dead job…").click()
    admin.click("#confirm")
    expect(admin.locator(".notice")).to_have_text("Respawned 1 job(s).")
    expect(admin.get_by_text("No lane is halted.")).to_be_visible()
    assert app.get_job(dead).state in ("ready", "waiting")
    assert not [lane for lane in app.lanes() if lane.halted_by is not None]


@SQLITE_ONLY
def test_cancel_a_job_that_has_not_run(admin: Page, dash: Dash, app: ferryq.App) -> None:
    job = app.tasks["send"].options(delay=600).enqueue("later@example.com").id
    admin.goto(dash.url(f"/ui/jobs/{job}"))
    admin.get_by_role("button", name="Cancel…").click()
    admin.click("#confirm")
    expect(admin.locator(".notice")).to_have_text("Cancelled 1 job(s).")
    assert app.get_job(job).state == "cancelled"


def test_cancel_a_running_job_says_it_is_requested(
    admin: Page, dash: Dash, app: ferryq.App
) -> None:
    job = app.tasks["send"].options(queue="held").enqueue("busy@example.com").id

    async def claim() -> None:  # a worker has it now, as far as the database knows
        store = await app.store()
        (claimed,) = await store.job_claim(app.namespace, ["held"], 1, "w1", app.clock())
        assert claimed.id == job

    app.portal_call(claim())
    admin.goto(dash.url(f"/ui/jobs/{job}"))
    admin.get_by_role("button", name="Cancel…").click()
    admin.click("#confirm")
    expect(admin.locator(".notice")).to_contain_text("Cancel requested for 1 running job(s)")
    assert app.get_job(job).state == "running"
