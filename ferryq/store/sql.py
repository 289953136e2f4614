"""What both SQL backends share: column lists, the rule of a claim, the statement and
migration loaders, the job-list query, and decoding a row into a Job.

Statements live under ``-- name: x`` headers: those whose text is the same on both
backends in ferryq/store/queries.sql, the others in each backend's ``queries.sql``. A
name both backends have means the same on both; the flows written once
(``ferryq.store.flows``) run only such names, and each backend has names of its own
besides (see the files' headers). ``{job_columns}``-style placeholders are filled in
once at load time; parameters are named (``:now``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from importlib import resources
from typing import Any

from ferryq.job import Job, State
from ferryq.lanes import LaneRule, OnDead, Rate
from ferryq.store.base import (
    Dependencies,
    Dependency,
    Finish,
    JobFilter,
    LaneWindow,
    Leases,
    WorkerInfo,
)

JOB_COLUMNS = (
    "id", "namespace", "queue", "task", "args", "state", "lane", "priority", "run_at",
    "order_time", "expires_at", "ttr", "max_tries", "retry", "unique_key", "stage", "context",
    "attempts", "fence", "result", "error", "errors", "stages", "meta", "created_at",
    "claimed_at", "started_at", "finished_at", "lease_until", "worker", "cancel_requested",
    "timeout", "progress",
)  # fmt: skip

CLAIM_COLUMNS = (
    "id", "namespace", "queue", "task", "args", "attempts", "max_tries", "fence", "ttr",
    "retry", "priority", "run_at", "order_time", "lease_until", "stage", "context",
    "created_at", "expires_at", "lane", "timeout", "meta", "dep_failed",
)  # fmt: skip

# In the order of the fields of base.Token, so a row is Token(*row).
TOKEN_COLUMNS = (
    "namespace", "digest", "description", "hint", "created_at", "limit_read", "limit_write",
    "limit_interval",
)  # fmt: skip

# In the order of the fields of base.PeriodicState, so a row is PeriodicState(*row).
PERIODIC_COLUMNS = (
    "namespace", "task", "schedule", "queue", "catch_up", "checked_until", "last_tick",
    "last_job", "next_tick", "updated_at",
)  # fmt: skip

_JSON_COLUMNS = (
    "args", "retry", "context", "result", "error", "errors", "stages", "meta", "progress",
)  # fmt: skip


def select_list(overrides: Mapping[str, str], prefix: str = "j.") -> str:
    """Every job column, copied from ``prefix`` unless ``overrides`` says otherwise."""
    return ", ".join(overrides.get(c, f"{prefix}{c}") for c in JOB_COLUMNS)


def claim_set(row: str = "", *, ttr: str | None = None, when: str | None = None) -> str:
    """The SET list of a claim, the one rule every claiming statement writes: the job
    runs, with one more attempt, a new fencing token (``fence + 1``), a lease of its
    ``ttr`` from ``:now`` for ``:worker``, and no end or progress of an attempt yet.
    ``row``: how the statement names the row's own columns (``j.``). ``ttr``: the
    claimer's lease instead (an HTTP consumer's ``:ttr``), which becomes the job's.
    ``when``: a condition under which the row is claimed, else left as it is; the
    state is then the statement's own to set (it has more than two outcomes)."""
    values = {
        "state": "'running'",
        "attempts": f"{row}attempts + 1",
        "fence": f"{row}fence + 1",
        "claimed_at": ":now",
        "started_at": ":now",
        "finished_at": "NULL",
        "progress": "NULL",
        "lease_until": f":now + {row}ttr",
        "worker": ":worker",
    }
    if ttr is not None:
        values["ttr"] = ttr
        values["lease_until"] = f":now + {ttr}"
    if when is None:
        return ", ".join(f"{column} = {value}" for column, value in values.items())
    return ", ".join(
        f"{column} = CASE WHEN {when} THEN {value} ELSE {row}{column} END"
        for column, value in values.items()
        if column != "state"
    )


#: Where the statements that read the same on both backends are.
SHARED_STATEMENTS = "ferryq.store"


def load_statements(package: str, fill: Mapping[str, str]) -> dict[str, str]:
    """Statements by name: the shared ones (ferryq/store/queries.sql), then those of
    ``package``'s own ``queries.sql``, placeholders filled. A backend's file may not
    name a shared statement again."""
    statements = _statements_of(SHARED_STATEMENTS, fill)
    own = _statements_of(package, fill)
    if twice := sorted(set(statements) & set(own)):
        raise RuntimeError(f"{package}'s queries.sql repeats shared statements: {twice}")
    return {**statements, **own}


def _statements_of(package: str, fill: Mapping[str, str]) -> dict[str, str]:
    text = resources.files(package).joinpath("queries.sql").read_text()
    statements: dict[str, str] = {}
    for block in re.split(r"^-- name: ", text, flags=re.M)[1:]:
        name, _, body = block.partition("\n")
        sql = "\n".join(line for line in body.splitlines() if not line.startswith("--"))
        statements[name.strip()] = sql.strip().format_map(fill)
    return statements


def load_migrations(package: str) -> list[tuple[int, str, str]]:
    """(version, name, sql) of every file in ``package``/migrations, in order."""
    found = []
    for entry in resources.files(package).joinpath("migrations").iterdir():
        match = re.fullmatch(r"(\d{4})_(\w+)\.sql", entry.name)
        if match:
            found.append((int(match[1]), match[2], entry.read_text()))
    return sorted(found)


def split_script(script: str) -> list[str]:
    """The statements of a migration, split at semicolons, except those inside a
    dollar-quoted body (PostgreSQL functions) or a trigger's BEGIN ... END."""
    lines = [line for line in script.splitlines() if not line.strip().startswith("--")]
    statements: list[str] = []
    pending = ""
    for piece in "\n".join(lines).split(";"):
        pending += piece
        if _is_whole(pending):
            if pending.strip():
                statements.append(pending.strip())
            pending = ""
        else:
            pending += ";"
    if pending.strip():
        raise ValueError(f"unterminated statement in migration: {pending.strip()[:60]!r}")
    return statements


def _is_whole(statement: str) -> bool:
    if statement.count("$$") % 2:
        return False
    trigger = re.match(r"\s*CREATE\s+TRIGGER\b.*\bBEGIN\b", statement, re.I | re.S)
    return trigger is None or re.search(r"\bEND\s*$", statement, re.I) is not None


def list_query(where: JobFilter) -> tuple[str, dict[str, Any]]:
    """Newest first across hot and historical jobs, keyset-paged by id."""
    clauses: list[str] = []
    params: dict[str, Any] = {"limit": where.limit}
    for column in ("namespace", "queue", "task", "lane"):
        value = getattr(where, column)
        if value is not None:
            clauses.append(f"{column} = :{column}")
            params[column] = value
    if where.state is not None:
        clauses.append("state = :state")
        params["state"] = str(where.state)
    if where.after_id is not None:
        clauses.append("id < :after_id")
        params["after_id"] = where.after_id
    if where.text:
        clauses.append("args LIKE :text ESCAPE '\\'")
        escaped = where.text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        params["text"] = f"%{escaped}%"
    condition = " AND ".join(clauses) or "TRUE"
    columns = ", ".join(JOB_COLUMNS)
    sql = (
        f"SELECT * FROM (SELECT {columns} FROM ferryq_jobs WHERE {condition} "
        f"ORDER BY id DESC LIMIT :limit) AS hot UNION ALL "
        f"SELECT * FROM (SELECT {columns} FROM ferryq_history WHERE {condition} "
        f"ORDER BY id DESC LIMIT :limit) AS done ORDER BY id DESC LIMIT :limit"
    )
    return sql, params


def dependencies_from_rows(rows: Iterable[Sequence[Any]]) -> Dependencies:
    """Dependencies from ``job_dependencies`` rows: (side, other job's id, ended)."""
    after: list[Dependency] = []
    dependents: list[Dependency] = []
    for side, other, ended in rows:
        (after if side == "after" else dependents).append(Dependency(int(other), ended))
    return Dependencies(after, dependents)


def held_leases(
    fences: Mapping[int, int], extended: list[int], rows: Sequence[Sequence[Any]]
) -> Leases:
    """Leases from the (id, fence, cancel_requested) rows of the running jobs asked for."""
    current = {row[0]: (row[1], bool(row[2])) for row in rows}
    ours = {job_id for job_id, fence in fences.items() if current.get(job_id, (None,))[0] == fence}
    lost = sorted(set(fences) - ours)
    cancel = sorted(job_id for job_id in ours if current[job_id][1])
    return Leases(extended, lost, cancel)


def requeue_statement(finish: Finish) -> tuple[str, dict[str, Any]]:
    """The statement and parameters that queue a job again after ``finish``."""
    common = {"id": finish.id, "fence": finish.fence}
    if finish.kind == "returned":
        return "job_return", common
    run_at = finish.run_at if finish.run_at is not None else finish.finished_at
    state = State.SCHEDULED if run_at > finish.finished_at else State.READY
    timing = {
        "state": state.value, "run_at": run_at,
        "order_time": finish.order_time if finish.order_time is not None else run_at,
        "started_at": finish.started_at, "finished_at": finish.finished_at,
    }  # fmt: skip
    if finish.kind == "next":
        return "job_next_stage", {
            **common, **timing, "stage": finish.stage, "context": finish.context or "null",
        }  # fmt: skip
    error = None if finish.error is None else json.dumps(finish.error)
    return "job_requeue", {**common, **timing, "error": error}


def job_from_row(row: Iterable[Any]) -> Job:
    """A job from its JOB_COLUMNS, in order."""
    values = dict(zip(JOB_COLUMNS, row, strict=True))
    for column in _JSON_COLUMNS:
        raw = values[column]
        values[column] = None if raw is None else json.loads(raw)
    values["state"] = State(values["state"])
    values["cancel_requested"] = bool(values["cancel_requested"])
    values["retry"] = values["retry"] or {}
    values["errors"] = values["errors"] or []
    values["stages"] = values["stages"] or []
    values["meta"] = values["meta"] or {}
    return Job(**values)


def worker_from_row(row: Sequence[Any]) -> WorkerInfo:
    """A ``worker_list`` row as a WorkerInfo."""
    return WorkerInfo(
        id=row[0],
        namespace=row[1],
        queues=json.loads(row[2]),
        host=row[3],
        pid=row[4],
        concurrency=row[5],
        started_at=row[6],
        heartbeat_at=row[7],
        running=json.loads(row[8]),
        stats=json.loads(row[9]),
    )


def lane_rule(
    pattern: str, limit: int, on_dead: OnDead, rate_n: int | None, rate_per: float | None
) -> LaneRule:
    """A lane rule from its columns, as ``lane_rules`` reads them (no rate: both null)."""
    rate = None if rate_n is None or rate_per is None else Rate(rate_n, rate_per)
    return LaneRule(pattern, limit, on_dead, rate)


def rule_params(rule: LaneRule) -> dict[str, Any]:
    """The columns of a lane rule, as ``lane_rule_set`` takes them."""
    return {
        "pattern": rule.pattern, "lane_limit": rule.limit, "on_dead": rule.on_dead,
        "rate_n": None if rule.rate is None else rule.rate.n,
        "rate_per": None if rule.rate is None else rule.rate.per,
    }  # fmt: skip


def lane_window(row: Sequence[Any] | None) -> LaneWindow:
    """A ``lane_window`` row (starts as JSON text, deferred_until), or none."""
    if row is None:
        return LaneWindow([], None)
    return LaneWindow([float(s) for s in json.loads(row[0])], row[1])
