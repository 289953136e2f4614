"""Links anyone can craft: numbers the dashboard reads from a URL that ``int()`` would
refuse are shown as nothing, never a 500 (tests/server/test_route_fuzz.py asks every
route such things; these check what the pages show)."""

from __future__ import annotations

import httpx
import pytest

from tests.dashboard.conftest import Dash, signed_in_client

SQLITE_ONLY = pytest.mark.parametrize("dash", ["sqlite"], indirect=True)
#: '²' is a digit to str.isdigit(), not to int(); Arabic-Indic digits are digits to
#: int() but no ASCII; 5000 digits are past int()'s limit; the rest are no whole numbers.
NOT_COUNTS = ["%C2%B2", "%D9%A1", "9" * 5000, "-1", "%2B1", "1_0", "%FF", "1%00"]


@SQLITE_ONLY
def test_a_notice_whose_count_is_not_digits_says_zero(dash: Dash) -> None:
    with httpx.Client(base_url=dash.base, timeout=30) as client:
        for n in NOT_COUNTS:
            answer = client.get(f"/ui/login?done=respawn&n={n}")
            assert answer.status_code == 200, n
            refused = client.post(f"/ui/actions?done=purge&n={n}")
            assert refused.status_code == 401, n
    with signed_in_client(dash) as client:
        shown = client.get("/ui/dead?done=respawn&n=3")
        assert shown.status_code == 200 and "Respawned 3 job(s)." in shown.text
        for n in NOT_COUNTS:
            shown = client.get(f"/ui/dead?done=respawn&n={n}")
            assert shown.status_code == 200, n
            assert "Respawned 0 job(s)." in shown.text, n


@SQLITE_ONLY
def test_a_job_id_that_is_not_digits_is_no_job(dash: Dash) -> None:
    with signed_in_client(dash) as client:
        assert client.get(f"/ui/jobs/{dash.story.dead}").status_code == 200
        for raw in ("9" * 5000, "%C2%B2", "%D9%A1", "-1", "%2B1", "0", "1.0"):
            answer = client.get(f"/ui/jobs/{raw}")
            assert answer.status_code == 404, raw
            assert "content-security-policy" in answer.headers
