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
