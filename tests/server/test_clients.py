"""Requests shaped exactly as lmstfy's existing clients send them.

The protocol document is the contract; these tests pin the corners of it that the Go
and PHP clients lean on (query parameters the document does not name, a multi-queue
consume without a timeout, a query string that is not key=value, form-encoded bodies).
"""

from __future__ import annotations

from tests.server.harness import Lmstfy, assert_no_job, b64


def get(lm: Lmstfy, path_and_query: str) -> dict[str, object] | list[dict[str, object]] | None:
    """A GET as the clients write it: the query string typed out, the token in X-Token."""
    answer = lm.http.get(f"/api/{lm.namespace}/{path_and_query}", headers={"X-Token": lm.token})
    if answer.status_code == 404:
        assert answer.json() == {"msg": "no job available"}
        return None
    assert answer.status_code == 200, answer.text
    body: dict[str, object] | list[dict[str, object]] = answer.json()
    return body


def test_go_client_publish_consume_ack_and_republish(lm: Lmstfy) -> None:
    # Publish always sends ttl, tries and delay; consume always sends freeze_tries.
    published = lm.http.put(
        f"/api/{lm.namespace}/q?delay=0&tries=2&ttl=0",
        content=b"go body",
        headers={"X-Token": lm.token},
    )
    assert published.status_code == 201, published.text
    job_id = published.json()["job_id"]
    job = get(lm, "q?freeze_tries=false&timeout=0&ttr=30")
    assert isinstance(job, dict)
    assert (job["job_id"], job["data"], job["ttl"]) == (job_id, b64(b"go body"), 0)
    # RePublish sends the consumed data back to /job/:id with the same three parameters.
    again = lm.http.put(
        f"/api/{lm.namespace}/q/job/{job_id}?delay=0&tries=1&ttl=0",
        content=b"go body",
        headers={"X-Token": lm.token},
    )
    assert again.status_code == 201, again.text
    new_id = again.json()["job_id"]
    job = get(lm, "q?freeze_tries=false&timeout=0&ttr=30")
    assert isinstance(job, dict) and job["job_id"] == new_id
    acked = lm.http.delete(f"/api/{lm.namespace}/q/job/{new_id}", headers={"X-Token": lm.token})
    assert acked.status_code == 204
    assert get(lm, "q?freeze_tries=false&timeout=0&ttr=30") is None


def test_go_client_batch_consume_over_several_queues_without_a_timeout(lm: Lmstfy) -> None:
    urgent = lm.publish_ok("urgent", b"u")
    normal = [lm.publish_ok("normal", f"{n}".encode()) for n in range(2)]
    jobs = get(lm, "urgent,normal?count=10&freeze_tries=false&timeout=0&ttr=30")
    assert isinstance(jobs, list)
    assert [job["job_id"] for job in jobs] == [urgent, *normal]
    assert get(lm, "urgent,normal?count=10&freeze_tries=false&timeout=0&ttr=30") is None


def test_a_multi_queue_consume_without_a_timeout_takes_the_first_ready_queue(lm: Lmstfy) -> None:
    low = lm.publish_ok("low", b"low")
    job = get(lm, "high,low?ttr=30&timeout=0")
    assert isinstance(job, dict) and (job["queue"], job["job_id"]) == ("low", low)
    assert get(lm, "high,low?ttr=30&timeout=0") is None


def test_php_client_multi_queue_consume_with_a_bare_query_string(lm: Lmstfy) -> None:
    # The PHP client appends its query array as the literal text "Array".
    job_id = lm.publish_ok("second", b"php")
    job = get(lm, "first,second?Array")
    assert isinstance(job, dict) and (job["job_id"], job["data"]) == (job_id, b64(b"php"))
    assert job["remain_tries"] == 0


def test_php_client_publish_is_form_encoded_and_kept_raw(lm: Lmstfy) -> None:
    body = b"user=42&action=welcome+mail"
    published = lm.http.put(
        f"/api/{lm.namespace}/q?ttl=0&tries=1&delay=0",
        content=body,
        headers={"X-Token": lm.token, "Content-Type": "application/x-www-form-urlencoded"},
    )
    assert published.status_code == 201, published.text
    job = get(lm, "q?ttr=120&timeout=0")
    assert isinstance(job, dict) and job["data"] == b64(body)
    assert_no_job(lm.consume("q"))
