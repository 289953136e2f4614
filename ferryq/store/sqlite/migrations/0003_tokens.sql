-- API tokens of the HTTP server, one row per token: only its SHA-256 digest is kept,
-- with its first characters (hint) so that people can tell tokens apart.
CREATE TABLE ferryq_tokens (
    digest         TEXT PRIMARY KEY,
    namespace      TEXT NOT NULL,
    description    TEXT NOT NULL,
    hint           TEXT NOT NULL,
    created_at     REAL NOT NULL,
    limit_read     INTEGER,  -- rate limit: consumes per limit_interval seconds
    limit_write    INTEGER,  -- publishes per limit_interval seconds
    limit_interval REAL
);
CREATE INDEX ferryq_tokens_namespace ON ferryq_tokens (namespace, created_at);

-- The dead letters of a queue, the longest dead first (lmstfy respawns and deletes
-- from the head); the range also counts them.
CREATE INDEX ferryq_history_dead_since ON ferryq_history (namespace, queue, finished_at, id)
    WHERE state = 'dead';

-- Sizes of a queue by state (queue_size), each a range of an index: ready jobs have
-- ferryq_jobs_ready, dead ones the index above, running ones are few (the lease
-- index). Succeeded jobs are counted from the history table itself: an index on them
-- would cost every finish, for a count no hot path needs.
CREATE INDEX ferryq_jobs_queue_scheduled ON ferryq_jobs (namespace, queue)
    WHERE state = 'scheduled';
CREATE INDEX ferryq_jobs_queue_waiting ON ferryq_jobs (namespace, queue)
    WHERE state = 'waiting';
CREATE INDEX ferryq_history_queue_cancelled ON ferryq_history (namespace, queue)
    WHERE state = 'cancelled';
CREATE INDEX ferryq_history_queue_expired ON ferryq_history (namespace, queue)
    WHERE state = 'expired';
