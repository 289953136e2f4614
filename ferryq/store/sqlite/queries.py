"""Loads the named statements of queries.sql once, with the column lists filled in."""

from __future__ import annotations

import re
from importlib import resources

JOB_COLUMNS = (
    "id", "namespace", "queue", "task", "args", "state", "lane", "priority", "run_at",
    "order_time", "expires_at", "ttr", "max_tries", "retry", "unique_key", "stage", "context",
    "attempts", "fence", "result", "error", "errors", "stages", "meta", "created_at",
    "claimed_at", "started_at", "finished_at", "lease_until", "worker", "cancel_requested",
)  # fmt: skip

CLAIM_COLUMNS = (
    "id", "namespace", "queue", "task", "args", "attempts", "max_tries", "fence", "ttr",
    "retry", "priority", "run_at", "order_time", "lease_until", "stage", "context",
    "created_at", "expires_at", "lane",
)  # fmt: skip

_ADD_ERROR = (
    "CASE WHEN :error IS NULL THEN j.errors ELSE json_insert(j.errors, '$[#]', json(:error)) END"
)

# Column expressions that differ from a plain copy of ferryq_jobs into ferryq_history.
_FINISH = {
    "state": ":state", "result": ":result", "error": ":error", "errors": _ADD_ERROR,
    "started_at": ":started_at", "finished_at": ":finished_at", "lease_until": "NULL",
}  # fmt: skip
_BATCH = {
    "state": "f.value ->> 2", "result": "f.value ->> 3", "error": "f.value ->> 4",
    "errors": "CASE WHEN f.value ->> 4 IS NULL THEN j.errors "
              "ELSE json_insert(j.errors, '$[#]', json(f.value ->> 4)) END",
    "started_at": "f.value ->> 5", "finished_at": "f.value ->> 6", "lease_until": "NULL",
}  # fmt: skip
_TERMINAL = {"state": ":state", "finished_at": ":now", "lease_until": "NULL"}
_RESPAWN = {
    "state": "'ready'", "run_at": ":now", "order_time": ":now - j.priority",
    "expires_at": ":expires_at", "attempts": "0", "result": "NULL", "error": "NULL",
    "unique_key": "NULL", "claimed_at": "NULL", "started_at": "NULL", "finished_at": "NULL",
    "lease_until": "NULL", "worker": "NULL", "cancel_requested": "0",
}  # fmt: skip


def _select_list(overrides: dict[str, str]) -> str:
    return ", ".join(overrides.get(c, f"j.{c}") for c in JOB_COLUMNS)


_FILL = {
    "job_columns": ", ".join(JOB_COLUMNS),
    "claim_columns": ", ".join(CLAIM_COLUMNS),
    "history_finish_columns": _select_list(_FINISH),
    "history_batch_columns": _select_list(_BATCH),
    "history_terminal_columns": _select_list(_TERMINAL),
    "respawn_columns": _select_list(_RESPAWN),
}


def load(package: str) -> dict[str, str]:
    """Statements by name from ``queries.sql`` of ``package``."""
    text = resources.files(package).joinpath("queries.sql").read_text()
    statements: dict[str, str] = {}
    for block in re.split(r"^-- name: ", text, flags=re.M)[1:]:
        name, _, body = block.partition("\n")
        sql = "\n".join(line for line in body.splitlines() if not line.startswith("--"))
        statements[name.strip()] = sql.strip().format(**_FILL)
    return statements


def migrations(package: str) -> list[tuple[int, str, str]]:
    """(version, name, sql) of every file in ``package``/migrations, in order."""
    found = []
    for entry in resources.files(package).joinpath("migrations").iterdir():
        match = re.fullmatch(r"(\d{4})_(\w+)\.sql", entry.name)
        if match:
            found.append((int(match[1]), match[2], entry.read_text()))
    return sorted(found)
