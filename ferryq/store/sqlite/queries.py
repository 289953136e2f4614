"""The SQLite statements, loaded once with their column lists filled in."""

from __future__ import annotations

from ferryq.store.sql import (
    CLAIM_COLUMNS,
    JOB_COLUMNS,
    PERIODIC_COLUMNS,
    TOKEN_COLUMNS,
    claim_set,
    load_migrations,
    load_statements,
    select_list,
)

_ADD_ERROR = (
    "CASE WHEN :error IS NULL THEN j.errors ELSE json_insert(j.errors, '$[#]', json(:error)) END"
)


def _add_stage(outcome: str, started: str, finished: str) -> str:
    """``stages`` with the record of the stage that ends as ``outcome``, for a job
    that has stages (a plain job keeps its empty list)."""
    record = (f"json_object('stage', j.stage, 'outcome', {outcome}, 'attempts', j.attempts, "
              f"'started_at', {started}, 'finished_at', {finished})")  # fmt: skip
    return (f"CASE WHEN j.stage IS NULL AND json_array_length(j.stages) = 0 THEN j.stages "
            f"ELSE json_insert(j.stages, '$[#]', {record}) END")  # fmt: skip


# Column expressions that differ from a plain copy of ferryq_jobs into ferryq_history.
_FINISH = {
    "state": ":state", "result": ":result", "error": ":error", "errors": _ADD_ERROR,
    "stages": _add_stage(":state", ":started_at", ":finished_at"),
    "started_at": ":started_at", "finished_at": ":finished_at", "lease_until": "NULL",
}  # fmt: skip
_BATCH = {
    "state": "f.value ->> 2", "result": "f.value ->> 3", "error": "f.value ->> 4",
    "errors": "CASE WHEN f.value ->> 4 IS NULL THEN j.errors "
              "ELSE json_insert(j.errors, '$[#]', json(f.value ->> 4)) END",
    "stages": _add_stage("f.value ->> 2", "f.value ->> 5", "f.value ->> 6"),
    "started_at": "f.value ->> 5", "finished_at": "f.value ->> 6", "lease_until": "NULL",
}  # fmt: skip
_TERMINAL = {
    "state": ":state", "stages": _add_stage(":state", "j.started_at", ":now"),
    "finished_at": ":now", "lease_until": "NULL",
}  # fmt: skip
_RESPAWN = {
    # A job in a lane comes back waiting: its lane admits it again, ahead of later jobs.
    # claimed_at stays: a respawned job is a re-run, which keeps its place like a retry.
    "state": "CASE WHEN j.lane IS NULL THEN 'ready' ELSE 'waiting' END",
    "run_at": ":now", "order_time": ":now - j.priority",
    "expires_at": ":expires_at", "max_tries": "coalesce(:max_tries, j.max_tries)",
    "attempts": "0", "result": "NULL", "error": "NULL",
    "unique_key": "NULL", "started_at": "NULL", "finished_at": "NULL",
    "lease_until": "NULL", "worker": "NULL", "cancel_requested": "0",
}  # fmt: skip


_FILL = {
    "job_columns": ", ".join(JOB_COLUMNS),
    "claim_columns": ", ".join(CLAIM_COLUMNS),
    "claim_set": claim_set(),
    "take_set": claim_set(ttr=":ttr"),
    "history_finish_columns": select_list(_FINISH),
    "history_batch_columns": select_list(_BATCH),
    "history_terminal_columns": select_list(_TERMINAL),
    "respawn_columns": select_list(_RESPAWN),
    "token_columns": ", ".join(TOKEN_COLUMNS),
    "periodic_columns": ", ".join(f"p.{c}" for c in PERIODIC_COLUMNS),
}

Q = load_statements("ferryq.store.sqlite", _FILL)
MIGRATIONS = load_migrations("ferryq.store.sqlite")
