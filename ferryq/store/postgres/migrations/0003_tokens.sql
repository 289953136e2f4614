-- API tokens of the HTTP server, one row per token: only its SHA-256 digest is kept,
-- with its first characters (hint) so that people can tell tokens apart.
CREATE TABLE ferryq_tokens (
    digest         text PRIMARY KEY,
    namespace      text             NOT NULL,
    description    text             NOT NULL,
    hint           text             NOT NULL,
    created_at     double precision NOT NULL,
    limit_read     integer,  -- rate limit: consumes per limit_interval seconds
    limit_write    integer,  -- publishes per limit_interval seconds
    limit_interval double precision
);
CREATE INDEX ferryq_tokens_namespace ON ferryq_tokens (namespace, created_at);
