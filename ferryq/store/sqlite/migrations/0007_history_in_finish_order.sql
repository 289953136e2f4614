-- History keyed by a rowid of its own, in the order jobs finish, with the job id a
-- unique column. Jobs finish out of id order (lanes, long and short tasks side by
-- side); keyed by job id, each finish was an insert in the middle of the table,
-- splitting pages all over it and writing them all at every commit. Now a finish
-- appends, and only the small index on id takes an insert in its middle.
CREATE TABLE ferryq_history_rekeyed (
    hid              INTEGER PRIMARY KEY,  -- the order jobs finished in
    id               INTEGER NOT NULL UNIQUE,
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

INSERT INTO ferryq_history_rekeyed (
    id, namespace, queue, task, args, state, lane, priority, run_at, order_time,
    expires_at, ttr, max_tries, retry, unique_key, stage, context, attempts, fence,
    result, error, errors, stages, meta, created_at, claimed_at, started_at,
    finished_at, lease_until, worker, cancel_requested)
SELECT
    id, namespace, queue, task, args, state, lane, priority, run_at, order_time,
    expires_at, ttr, max_tries, retry, unique_key, stage, context, attempts, fence,
    result, error, errors, stages, meta, created_at, claimed_at, started_at,
    finished_at, lease_until, worker, cancel_requested
FROM ferryq_history ORDER BY finished_at, id;

DROP TABLE ferryq_history;
ALTER TABLE ferryq_history_rekeyed RENAME TO ferryq_history;

CREATE INDEX ferryq_history_finished ON ferryq_history (finished_at);
CREATE INDEX ferryq_history_dead ON ferryq_history (namespace, queue, id) WHERE state = 'dead';
CREATE INDEX ferryq_history_unique ON ferryq_history (namespace, unique_key, created_at)
    WHERE unique_key IS NOT NULL;
CREATE INDEX ferryq_history_dead_since ON ferryq_history (namespace, queue, finished_at, id)
    WHERE state = 'dead';
CREATE INDEX ferryq_history_queue_cancelled ON ferryq_history (namespace, queue)
    WHERE state = 'cancelled';
CREATE INDEX ferryq_history_queue_expired ON ferryq_history (namespace, queue)
    WHERE state = 'expired';
CREATE INDEX ferryq_history_lane ON ferryq_history (lane, id) WHERE lane IS NOT NULL;
