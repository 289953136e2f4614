"""The dead letter: peek, size, respawn and delete, each with its limits.

Jobs get there the lmstfy way: published with one try, consumed with a 1 s lease, and
let go (``Lmstfy.make_dead``), so each test here spends about a second on the clock.
"""

from __future__ import annotations

from tests.server.harness import Lmstfy, assert_error, assert_no_job, b64, each


def test_an_empty_dead_letter(lm: Lmstfy) -> None:
    dead = lm.deadletter("q")
    assert (dead.status_code, dead.json()) == (
        200,
        {"namespace": lm.namespace, "queue": "q", "deadletter_size": 0, "deadletter_head": ""},
    )
    assert lm.dead_size("q") == 0
    respawned = lm.respawn("q", limit=10)
    assert (respawned.status_code, respawned.json()) == (200, {"msg": "respawned", "count": 0})
    assert lm.delete_dead("q", limit=10).status_code == 204


def test_respawn_brings_back_the_oldest_dead_jobs_with_one_try(lm: Lmstfy) -> None:
    first, second, third = lm.make_dead("q", 3)
    dead = lm.deadletter("q").json()
    assert (dead["deadletter_size"], dead["deadletter_head"]) == (3, first)
    answer = lm.request("GET", lm.path("q", "deadletter", "size"), token=None)
    assert answer.json() == {"namespace": lm.namespace, "queue": "q", "size": 3}

    respawned = lm.respawn("q", limit=2, ttl=30)
    assert (respawned.status_code, respawned.json()) == (200, {"msg": "respawned", "count": 2})
    assert lm.dead_size("q") == 1
    assert lm.deadletter("q").json()["deadletter_head"] == third
    assert lm.size("q") == 2
    jobs = [lm.consume_ok("q", ttr=60) for _ in range(2)]
    assert [job["job_id"] for job in jobs] == [first, second]
    assert [job["remain_tries"] for job in jobs] == [0, 0]  # tries=1 after respawn, now used
    assert [job["data"] for job in jobs] == [b64(b"dead 0"), b64(b"dead 1")]
    assert all(job["ttl"] in (29, 30) for job in jobs), jobs

    respawned = lm.respawn("q", limit=5, ttl=0)
    assert respawned.json() == {"msg": "respawned", "count": 1}
    job = lm.consume_ok("q")
    assert (job["job_id"], job["ttl"], job["remain_tries"]) == (third, 0, 0)
    assert lm.deadletter("q").json() == {
        "namespace": lm.namespace,
        "queue": "q",
        "deadletter_size": 0,
        "deadletter_head": "",
    }
    assert lm.respawn("q").json() == {"msg": "respawned", "count": 0}


def test_respawn_and_delete_take_one_job_by_default(lm: Lmstfy) -> None:
    first, _, third = lm.make_dead("q", 3)
    assert lm.respawn("q").json() == {"msg": "respawned", "count": 1}
    job = lm.consume_ok("q")
    assert (job["job_id"], job["ttl"]) == (first, 86400)  # the default ttl, as for publish
    assert lm.delete_dead("q").status_code == 204
    assert lm.dead_size("q") == 1
    assert lm.deadletter("q").json()["deadletter_head"] == third
    assert_no_job(lm.consume("q"))


def test_delete_removes_up_to_limit_dead_jobs(lm: Lmstfy) -> None:
    lm.make_dead("q", 3)
    # Dead letters belong to their queue; destroying the queue leaves them.
    assert lm.dead_size("other") == 0
    assert lm.respawn("other", limit=10).json()["count"] == 0
    assert lm.delete_dead("other", limit=10).status_code == 204
    assert lm.destroy("q").status_code == 204
    assert lm.dead_size("q") == 3
    deleted = lm.delete_dead("q", limit=2)
    assert (deleted.status_code, deleted.content) == (204, b"")
    assert lm.dead_size("q") == 1
    assert lm.delete_dead("q", limit=100).status_code == 204
    assert lm.dead_size("q") == 0
    assert lm.respawn("q", limit=100).json()["count"] == 0
    assert lm.size("q") == 0


# Go's strconv.ParseInt(s, 10, 64) refuses all but an optional sign and ASCII digits
# within int64; lmstfy also refuses a limit under 1.
BAD_LIMITS = ["0", "-1", "abc", "", "1.5", " 1_0", "1_0", " 1", "1 ", "0x10", "1e3", "+", "-",
              "\uff11", "\u0661", str(1 << 63), str(-(1 << 63) - 1), "9" * 40]  # fmt: skip
BAD_TTLS = ["-1", "abc", "", "1.5"]


def test_invalid_limits_and_ttls_are_refused_and_change_nothing(lm: Lmstfy) -> None:
    (only,) = lm.make_dead("q", 1)
    for limit in BAD_LIMITS:
        assert_error(lm.respawn("q", limit=limit), 400, "invalid limit")
        assert_error(lm.delete_dead("q", limit=limit), 400, "invalid limit")
    for ttl in BAD_TTLS:
        assert_error(lm.respawn("q", limit=1, ttl=ttl), 400, "invalid ttl")
    assert lm.deadletter("q").json()["deadletter_head"] == only
    assert lm.dead_size("q") == 1
    assert lm.size("q") == 0


def test_an_invalid_limit_on_an_empty_dead_letter_is_still_refused(lm: Lmstfy) -> None:
    def check(limit: str) -> None:
        assert_error(lm.respawn("q", limit=limit), 400, "invalid limit")
        assert_error(lm.delete_dead("q", limit=limit), 400, "invalid limit")

    each(BAD_LIMITS, check)


def test_a_limit_is_read_as_gos_parseint_reads_it(lm: Lmstfy) -> None:
    first, second, third = lm.make_dead("q", 3)
    assert lm.respawn("q", limit="+1").json() == {"msg": "respawned", "count": 1}
    assert lm.delete_dead("q", limit="+01").status_code == 204
    assert lm.deadletter("q").json()["deadletter_head"] == third
    largest = str((1 << 63) - 1)
    assert lm.respawn("q", limit=largest).json() == {"msg": "respawned", "count": 1}
    assert lm.dead_size("q") == 0
    assert lm.delete_dead("q", limit=largest).status_code == 204
    assert [lm.consume_ok("q")["job_id"] for _ in range(2)] == [first, third]
    assert_error(lm.peek_job("q", second), 404, "job not found")  # deleted
