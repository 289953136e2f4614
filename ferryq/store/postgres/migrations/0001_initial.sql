-- Hot jobs: everything not yet terminal. Finished jobs move to ferryq_history, so
-- this table stays as small as the backlog however long the system runs. Times are
-- Unix seconds (double precision), as on SQLite, so both backends share one clock.
CREATE TABLE ferryq_jobs (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    namespace        text             NOT NULL,
    queue            text             NOT NULL,
    task             text             NOT NULL,
    args             text             NOT NULL,
    state            text             NOT NULL,
    lane             text,
    priority         double precision NOT NULL DEFAULT 0,
    run_at           double precision NOT NULL,
    order_time       double precision NOT NULL,
    expires_at       double precision,
    ttr              double precision NOT NULL,
    max_tries        integer          NOT NULL,
    retry            text             NOT NULL DEFAULT '{}',
    unique_key       text,
    stage            text,
    context          text             NOT NULL DEFAULT 'null',
    attempts         integer          NOT NULL DEFAULT 0,
    fence            bigint           NOT NULL DEFAULT 0,
    result           text,
    error            jsonb,
    errors           jsonb            NOT NULL DEFAULT '[]',
    stages           jsonb            NOT NULL DEFAULT '[]',
    meta             jsonb            NOT NULL DEFAULT '{}',
    created_at       double precision NOT NULL,
    claimed_at       double precision,
    started_at       double precision,
    finished_at      double precision,
    lease_until      double precision,
    worker           text,
    cancel_requested boolean          NOT NULL DEFAULT false
);

-- Claims walk one index range per queue, already in claim order; rows leave the
-- index when claimed, so its size is the ready backlog, not the table.
CREATE INDEX ferryq_jobs_ready ON ferryq_jobs (namespace, queue, order_time, id)
    WHERE state = 'ready';
CREATE INDEX ferryq_jobs_scheduled ON ferryq_jobs (run_at) WHERE state = 'scheduled';
CREATE INDEX ferryq_jobs_lease ON ferryq_jobs (lease_until) WHERE state = 'running';
CREATE INDEX ferryq_jobs_expiry ON ferryq_jobs (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX ferryq_jobs_cancel ON ferryq_jobs (id) WHERE cancel_requested;
CREATE UNIQUE INDEX ferryq_jobs_unique ON ferryq_jobs (namespace, unique_key)
    WHERE unique_key IS NOT NULL;

-- Terminal jobs, one partition per UTC day of finished_at. Maintenance creates the
-- partitions ahead of time and drops whole partitions past retention. The default
-- partition only catches rows if maintenance has not run for days.
CREATE TABLE ferryq_history (
    id               bigint           NOT NULL,
    namespace        text             NOT NULL,
    queue            text             NOT NULL,
    task             text             NOT NULL,
    args             text             NOT NULL,
    state            text             NOT NULL,
    lane             text,
    priority         double precision NOT NULL DEFAULT 0,
    run_at           double precision NOT NULL,
    order_time       double precision NOT NULL,
    expires_at       double precision,
    ttr              double precision NOT NULL,
    max_tries        integer          NOT NULL,
    retry            text             NOT NULL DEFAULT '{}',
    unique_key       text,
    stage            text,
    context          text             NOT NULL DEFAULT 'null',
    attempts         integer          NOT NULL DEFAULT 0,
    fence            bigint           NOT NULL DEFAULT 0,
    result           text,
    error            jsonb,
    errors           jsonb            NOT NULL DEFAULT '[]',
    stages           jsonb            NOT NULL DEFAULT '[]',
    meta             jsonb            NOT NULL DEFAULT '{}',
    created_at       double precision NOT NULL,
    claimed_at       double precision,
    started_at       double precision,
    finished_at      double precision NOT NULL,
    lease_until      double precision,
    worker           text,
    cancel_requested boolean          NOT NULL DEFAULT false
) PARTITION BY RANGE (finished_at);

CREATE TABLE ferryq_history_default PARTITION OF ferryq_history DEFAULT;
CREATE INDEX ferryq_history_id ON ferryq_history (id);
CREATE INDEX ferryq_history_dead ON ferryq_history (namespace, queue, id) WHERE state = 'dead';
CREATE INDEX ferryq_history_unique ON ferryq_history (namespace, unique_key, created_at)
    WHERE unique_key IS NOT NULL;

CREATE TABLE ferryq_workers (
    id           text PRIMARY KEY,
    namespace    text             NOT NULL,
    queues       text             NOT NULL,
    host         text             NOT NULL,
    pid          integer          NOT NULL,
    concurrency  integer          NOT NULL,
    started_at   double precision NOT NULL,
    heartbeat_at double precision NOT NULL,
    running      text             NOT NULL DEFAULT '[]'
);

-- Unused on PostgreSQL (leadership is an advisory lock) but kept so both backends
-- have the same schema at the same migration number.
CREATE TABLE ferryq_leaders (
    name       text PRIMARY KEY,
    holder     text             NOT NULL,
    expires_at double precision NOT NULL
);
