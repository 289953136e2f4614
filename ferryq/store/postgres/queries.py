"""The PostgreSQL statements, loaded once: column lists filled in, :name → $n (and
→ %(name)s for psycopg)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

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
    "CASE WHEN j.f_error IS NULL THEN j.errors ELSE j.errors || jsonb_build_array(j.f_error) END"
)


def _add_stage(outcome: str, started: str, finished: str) -> str:
    """``stages`` with the record of the stage that ends as ``outcome``, for a job
    that has stages (a plain job keeps its empty list)."""
    record = (f"jsonb_build_object('stage', j.stage, 'outcome', {outcome}, 'attempts', "
              f"j.attempts, 'started_at', {started}, 'finished_at', {finished})")  # fmt: skip
    return (f"CASE WHEN j.stage IS NULL AND j.stages = '[]'::jsonb THEN j.stages "
            f"ELSE j.stages || jsonb_build_array({record}) END")  # fmt: skip


_FINISH = {
    "state": "j.f_state", "result": "j.f_result", "error": "j.f_error", "errors": _ADD_ERROR,
    "stages": _add_stage("j.f_state", "j.f_started_at", "j.f_finished_at"),
    "started_at": "j.f_started_at", "finished_at": "j.f_finished_at", "lease_until": "NULL",
}  # fmt: skip
_TERMINAL = {
    "state": ":state", "stages": _add_stage(":state::text", "j.started_at", ":now::float8"),
    "finished_at": ":now", "lease_until": "NULL",
}  # fmt: skip
_EXPIRED = {
    "state": "'expired'", "stages": _add_stage("'expired'", "j.started_at", ":now::float8"),
    "finished_at": ":now", "lease_until": "NULL",
}  # fmt: skip
_RESPAWN = {
    # A job in a lane comes back waiting: its lane admits it again, ahead of later jobs.
    # claimed_at stays: a respawned job is a re-run, which keeps its place like a retry.
    "state": "CASE WHEN j.lane IS NULL THEN 'ready' ELSE 'waiting' END",
    "run_at": ":now", "order_time": ":now - j.priority",
    "expires_at": ":expires_at", "max_tries": "coalesce(:max_tries::integer, j.max_tries)",
    "attempts": "0", "result": "NULL", "error": "NULL",
    "unique_key": "NULL", "started_at": "NULL", "finished_at": "NULL",
    "lease_until": "NULL", "worker": "NULL", "cancel_requested": "false",
}  # fmt: skip

_CLAIM_TYPES = {
    "id": "bigint", "attempts": "integer", "max_tries": "integer", "fence": "bigint",
    "ttr": "float8", "priority": "float8", "run_at": "float8", "order_time": "float8",
    "lease_until": "float8", "created_at": "float8", "expires_at": "float8",
    "timeout": "float8", "meta": "jsonb",
}  # fmt: skip
# A claim row whose only values are the namespace (n) and lane (l) of a lane.
_CLAIM_NULLS_BUT_LANE = ", ".join(
    {"namespace": "n", "lane": "l"}.get(c, f"NULL::{_CLAIM_TYPES.get(c, 'text')}")
    for c in CLAIM_COLUMNS
)

_FILL = {
    "job_columns": ", ".join(JOB_COLUMNS),
    "claim_columns": ", ".join(f"j.{c}" for c in CLAIM_COLUMNS),
    "claim_set": claim_set("j."),
    "take_set": claim_set("j.", ttr=":ttr::float8"),
    "claim_set_if_taken": claim_set("j.", when="p.take"),
    "claim_of_a": ", ".join(f"a.{c}" for c in CLAIM_COLUMNS),
    "claim_nulls_but_lane": _CLAIM_NULLS_BUT_LANE,
    "history_finish_columns": select_list(_FINISH),
    "history_terminal_columns": select_list(_TERMINAL),
    "history_expired_columns": select_list(_EXPIRED),
    "respawn_columns": select_list(_RESPAWN),
    "token_columns": ", ".join(TOKEN_COLUMNS),
    "periodic_columns": ", ".join(f"p.{c}" for c in PERIODIC_COLUMNS),
}

# A named parameter: a colon not part of a "::" cast, then a name.
_PARAM = re.compile(r"(?<![:\w]):([a-z_][a-z0-9_]*)")


@dataclass(frozen=True, slots=True)
class Statement:
    """A statement in asyncpg's positional form, with its parameter names in order."""

    sql: str
    names: tuple[str, ...]
    pyformat: str  # the same statement with %(name)s parameters, for psycopg

    def args(self, params: Mapping[str, Any]) -> list[Any]:
        return [params[name] for name in self.names]


def positional(sql: str) -> Statement:
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match[1] not in names:
            names.append(match[1])
        return f"${names.index(match[1]) + 1}"

    pyformat = _PARAM.sub(r"%(\1)s", sql.replace("%", "%%"))
    return Statement(_PARAM.sub(number, sql), tuple(names), pyformat)


Q = {name: positional(sql) for name, sql in load_statements("ferryq.store.postgres", _FILL).items()}
MIGRATIONS = load_migrations("ferryq.store.postgres")
