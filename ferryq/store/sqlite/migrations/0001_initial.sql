-- Hot jobs: everything not yet terminal. Finished jobs move to ferryq_history, so
-- this table stays as small as the backlog however long the system runs.
CREATE TABLE ferryq_jobs (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,  -- AUTOINCREMENT: never reuse an id
    namespace        TEXT    NOT NULL,
    queue            TEXT    NOT NULL,
    task             TEXT    NOT NULL,
    args             TEXT    NOT NULL,
    state            TEXT    NOT NULL,
    lane             TEXT,
    priority         REAL    NOT NULL DEFAULT 0,
    run_at           REAL    NOT NULL,
    order_time       REAL    NOT NULL,
    expires_at       REAL,
    ttr              REAL    NOT NULL,
    max_tries        INTEGER NOT NULL,
    retry            TEXT    NOT NULL DEFAULT '{}',
    unique_key       TEXT,
    stage            TEXT,
    context          TEXT    NOT NULL DEFAULT 'null',
    attempts         INTEGER NOT NULL DEFAULT 0,
    fence            INTEGER NOT NULL DEFAULT 0,
    result           TEXT,
    error            TEXT,
    errors           TEXT    NOT NULL DEFAULT '[]',
    stages           TEXT    NOT NULL DEFAULT '[]',
    meta             TEXT    NOT NULL DEFAULT '{}',
    created_at       REAL    NOT NULL,
    claimed_at       REAL,
    started_at       REAL,
    finished_at      REAL,
    lease_until      REAL,
    worker           TEXT,
    cancel_requested INTEGER NOT NULL DEFAULT 0
);

-- The claim path: one index range per queue, already in claim order.
CREATE INDEX ferryq_jobs_ready ON ferryq_jobs (namespace, queue, order_time, id)
    WHERE state = 'ready';
CREATE INDEX ferryq_jobs_scheduled ON ferryq_jobs (run_at) WHERE state = 'scheduled';
CREATE INDEX ferryq_jobs_lease ON ferryq_jobs (lease_until) WHERE state = 'running';
CREATE INDEX ferryq_jobs_expiry ON ferryq_jobs (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX ferryq_jobs_cancel ON ferryq_jobs (id) WHERE cancel_requested = 1;
-- Deduplication backstop: at most one unfinished job per key.
CREATE UNIQUE INDEX ferryq_jobs_unique ON ferryq_jobs (namespace, unique_key)
    WHERE unique_key IS NOT NULL;

-- Terminal jobs, with every timestamp, error and stage kept.
CREATE TABLE ferryq_history (
    id               INTEGER PRIMARY KEY,
    namespace        TEXT    NOT NULL,
    queue            TEXT    NOT NULL,
    task             TEXT    NOT NULL,
    args             TEXT    NOT NULL,
    state            TEXT    NOT NULL,
    lane             TEXT,
    priority         REAL    NOT NULL DEFAULT 0,
    run_at           REAL    NOT NULL,
    order_time       REAL    NOT NULL,
    expires_at       REAL,
    ttr              REAL    NOT NULL,
    max_tries        INTEGER NOT NULL,
    retry            TEXT    NOT NULL DEFAULT '{}',
    unique_key       TEXT,
    stage            TEXT,
    context          TEXT    NOT NULL DEFAULT 'null',
    attempts         INTEGER NOT NULL DEFAULT 0,
    fence            INTEGER NOT NULL DEFAULT 0,
    result           TEXT,
    error            TEXT,
    errors           TEXT    NOT NULL DEFAULT '[]',
    stages           TEXT    NOT NULL DEFAULT '[]',
    meta             TEXT    NOT NULL DEFAULT '{}',
    created_at       REAL    NOT NULL,
    claimed_at       REAL,
    started_at       REAL,
    finished_at      REAL,
    lease_until      REAL,
    worker           TEXT,
    cancel_requested INTEGER NOT NULL DEFAULT 0
);

CREATE INDEX ferryq_history_finished ON ferryq_history (finished_at);
CREATE INDEX ferryq_history_dead ON ferryq_history (namespace, queue, id) WHERE state = 'dead';
CREATE INDEX ferryq_history_unique ON ferryq_history (namespace, unique_key, created_at)
    WHERE unique_key IS NOT NULL;

CREATE TABLE ferryq_workers (
    id           TEXT PRIMARY KEY,
    namespace    TEXT NOT NULL,
    queues       TEXT NOT NULL,
    host         TEXT NOT NULL,
    pid          INTEGER NOT NULL,
    concurrency  INTEGER NOT NULL,
    started_at   REAL NOT NULL,
    heartbeat_at REAL NOT NULL,
    running      TEXT NOT NULL DEFAULT '[]'
);

-- One row per leadership (maintenance): held by one worker until it expires.
CREATE TABLE ferryq_leaders (
    name       TEXT PRIMARY KEY,
    holder     TEXT NOT NULL,
    expires_at REAL NOT NULL
);
