"""Property-based fuzzing of the native API from the server's own /openapi.json.

Schemathesis generates requests for every /v1 operation, both fitting the schema and
not, and sends them with a valid token to a real server (on each backend); the routes
of one job are also tried on jobs of the namespace in every state. Every answer must be
no 5xx and exactly what the schema documents: status code, content type, headers and
body.

Requests that do not fit the schema must be refused too, but schemathesis's own check
of that (``negative_data_rejection``) is left out: it counts a query value such as
``text=false`` as a boolean where a query string has no types, so it fails on requests
that are valid. tests/server/test_native_api.py checks the refusals one by one.

Headers that frame the HTTP message (Content-Length, Transfer-Encoding, Host,
Connection) are taken out of the generated requests: a malformed one is refused by the
HTTP server before any route sees it, with a plain-text 400 that no operation's schema
can describe. tests/server/test_protocol.py checks those refusals on a raw socket.

The operations are driven through schemathesis's Python API rather than its pytest
plugin, whose fixture-based loader does not work with the pytest this project uses.
"""

from __future__ import annotations

from typing import Any

import httpx
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import Case, GenerationMode
from schemathesis.checks import negative_data_rejection
from schemathesis.core.result import Ok

import ferryq
from ferryq import testing
from tests.conftest import examples
from tests.server.harness import ServerProcess, new_namespace

#: Examples per operation and mode: 19 operations, 2 modes, this many requests each (12
#: took 25 s a backend with a core busy; the thorough profile runs 60).
EXAMPLES = examples(6)
#: Examples per route of one job, for each job of the namespace.
JOB_EXAMPLES = 3
#: Schema-valid requests may still be refused with 400 (documented so: values ferryq
#: refuses beyond what a schema can say, such as delay and run_at together).
CONFIG = {"checks": {"positive_data_acceptance": {
    "expected-statuses": ["2xx", "400", "401", "404", "409", "429"]}}}  # fmt: skip
SKIP = [negative_data_rejection]
#: A result never waits longer than this here (the schema allows up to a minute).
WAIT = 0.05
#: Headers of the HTTP message's framing, the HTTP server's to answer (see above).
FRAMING = frozenset({"content-length", "transfer-encoding", "host", "connection"})


def test_native_api_answers_as_documented(server: ServerProcess) -> None:
    config = schemathesis.Config.from_dict(CONFIG)
    loaded = schemathesis.openapi.from_url(f"{server.api}/openapi.json", config=config)
    schema = loaded.include(path_regex="^/v1/")
    namespace = new_namespace()
    token = server.create_token(namespace)
    jobs = _jobs_in_every_state(server, namespace, token)
    operations = []
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result
        operations.append(result.ok())
    assert len(operations) == 19
    runs = [
        (f"{operation.label} ({mode})", operation.as_strategy(generation_mode=mode), EXAMPLES)
        for operation in operations
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    ]
    # Random ids seldom name a job of the namespace: each route of one job gets real ones.
    runs += [
        (f"{operation.label} (job {job_id}, {state})",
         operation.as_strategy(path_parameters={"job_id": job_id}), JOB_EXAMPLES)
        for operation in operations if "{job_id}" in operation.path
        for state, job_id in jobs.items()
    ]  # fmt: skip
    failures: list[str] = []
    for label, strategy, count in runs:

        @given(case=strategy)
        @settings(
            max_examples=count, deadline=None, database=None,
            phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck),
        )  # fmt: skip
        def answers_as_documented(case: Case[Any]) -> None:
            _prepare(case)
            case.call_and_validate(headers={"X-Token": token}, timeout=30, excluded_checks=SKIP)

        try:
            answers_as_documented()
        except (Exception, BaseExceptionGroup) as exc:  # every operation is tried
            failures.append(f"{label}: {exc}")
    assert not failures, "\n\n".join(failures)


def _jobs_in_every_state(server: ServerProcess, namespace: str, token: str) -> dict[str, int]:
    """A job of the namespace in each state a route can meet, by state."""
    with httpx.Client(base_url=f"{server.api}/v1", headers={"X-Token": token}) as client:

        def enqueue(task: str, **options: Any) -> int:
            answer = client.post("/jobs", json={"task": task, **options})
            assert answer.status_code == 201, answer.text
            return int(answer.json()["id"])

        jobs = {
            "succeeded": enqueue("fine", queue="run"),
            "dead": enqueue("fails", queue="run", max_tries=1),
            "cancelled": enqueue("idle", queue="idle"),
            "ready": enqueue("idle", queue="idle", lane="L"),
            "waiting": enqueue("idle", queue="idle", lane="L"),
            "scheduled": enqueue("idle", delay=3600),
        }
        assert client.post(f"/jobs/{jobs['cancelled']}/cancel").status_code == 200
    app = ferryq.App(server.url, namespace=namespace)
    app.task(name="fine")(_succeed)
    app.task(name="fails")(_fail)
    try:
        testing.drain(app, ["run"])
    finally:
        app.close()
    return jobs


def _succeed() -> dict[str, bool]:
    return {"ok": True}


def _fail() -> None:
    raise RuntimeError("fails on purpose")


def _prepare(case: Case[Any]) -> None:
    """Takes the framing headers out of ``case`` and bounds its wait for a result
    (fuzzed jobs run nowhere: waiting for them would only wait out the timeout)."""
    for name in [name for name in case.headers or () if name.lower() in FRAMING]:
        del case.headers[name]
    if not case.path.endswith("/result"):
        return
    query = case.query if isinstance(case.query, dict) else {}
    timeout = query.get("timeout", 0)
    if isinstance(timeout, int | float) and 0 <= timeout <= 60:
        case.query = {**query, "timeout": WAIT}
