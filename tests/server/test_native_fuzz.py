"""Property-based fuzzing of the native API from the server's own /openapi.json.

Schemathesis generates requests for every /v1 operation, both fitting the schema and
not, and sends them with a valid token to a real server (on each backend); every
answer must be no 5xx and exactly what the schema documents: status code, content
type, headers and body.

Requests that do not fit the schema must be refused too, but schemathesis's own check
of that (``negative_data_rejection``) is left out: it counts a query value such as
``text=false`` as a boolean where a query string has no types, so it fails on requests
that are valid. tests/server/test_native_api.py checks the refusals one by one.

The operations are driven through schemathesis's Python API rather than its pytest
plugin, whose fixture-based loader does not work with the pytest this project uses.
"""

from __future__ import annotations

from typing import Any

import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import Case, GenerationMode
from schemathesis.checks import negative_data_rejection
from schemathesis.core.result import Ok

from tests.server.harness import ServerProcess, new_namespace

#: Examples per operation and mode: 16 operations, 2 modes, this many requests each.
EXAMPLES = 15
#: Schema-valid requests may still be refused with 400 (documented so: values ferryq
#: refuses beyond what a schema can say, such as delay and run_at together).
CONFIG = {"checks": {"positive_data_acceptance": {
    "expected-statuses": ["2xx", "400", "401", "404", "409", "429"]}}}  # fmt: skip
SKIP = [negative_data_rejection]
#: A result never waits longer than this here (the schema allows up to a minute).
WAIT = 0.05


def test_native_api_answers_as_documented(server: ServerProcess) -> None:
    config = schemathesis.Config.from_dict(CONFIG)
    loaded = schemathesis.openapi.from_url(f"{server.api}/openapi.json", config=config)
    schema = loaded.include(path_regex="^/v1/")
    token = server.create_token(new_namespace())
    failures: list[str] = []
    operations = []
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result
        operations.append(result.ok())
    assert len(operations) == 16
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(
                max_examples=EXAMPLES, deadline=None, database=None,
                phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck),
            )  # fmt: skip
            def answers_as_documented(case: Case[Any]) -> None:
                _bound_waits(case)
                case.call_and_validate(headers={"X-Token": token}, timeout=30, excluded_checks=SKIP)

            try:
                answers_as_documented()
            except (Exception, BaseExceptionGroup) as exc:  # every operation is tried
                failures.append(f"{operation.label} ({mode}): {exc}")
    assert not failures, "\n\n".join(failures)


def _bound_waits(case: Case[Any]) -> None:
    """Fuzzed jobs run nowhere: waiting for them would only wait out the timeout."""
    if not case.path.endswith("/result"):
        return
    query = case.query if isinstance(case.query, dict) else {}
    timeout = query.get("timeout", 0)
    if isinstance(timeout, int | float) and 0 <= timeout <= 60:
        case.query = {**query, "timeout": WAIT}
