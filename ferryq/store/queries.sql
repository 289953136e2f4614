-- Named statements whose text is the same on both backends, loaded by each before its
-- own queries.sql (ferryq/store/sql.py, load_statements), which may not name them again
-- (tests/unit/test_store_queries.py checks that, and that no statement is written out
-- twice, byte for byte, in the two backends' files). The same text may still be planned
-- differently by each database: a comment says so where it matters.
-- Parameters are named (:now); column lists are filled in from ferryq/store/sql.py.

-- name: job_find_unique_hot
SELECT id FROM ferryq_jobs WHERE namespace = :namespace AND unique_key = :unique_key;

-- name: job_find_unique_recent
-- With a window, a finished job created within it still counts as a duplicate.
SELECT id FROM ferryq_history
WHERE namespace = :namespace AND unique_key = :unique_key AND created_at >= :since
ORDER BY created_at DESC LIMIT 1;

-- name: job_dependencies
-- A job's dependencies in its order, and the jobs that depend on it.
SELECT 'after' AS side, after_id AS id, ended FROM ferryq_deps WHERE job_id = :id
UNION ALL
SELECT 'dependent', job_id, ended FROM ferryq_deps WHERE after_id = :id
ORDER BY 1, 2;

-- name: job_dependency_results
-- The results of a job's dependencies, in its order (null for one not succeeded).
SELECT d.after_id, h.state, h.result FROM ferryq_deps d
LEFT JOIN ferryq_history h ON h.id = d.after_id
WHERE d.job_id = :id ORDER BY d.pos;

-- name: job_delete
DELETE FROM ferryq_jobs WHERE id = :id;

-- name: job_get_hot
SELECT {job_columns} FROM ferryq_jobs WHERE id = :id;

-- name: job_get_history
SELECT {job_columns} FROM ferryq_history WHERE id = :id;

-- name: deps_prune
-- The edges of dependents that are gone, with the history pruned: the jobs older than
-- every job still kept (ids only grow), a range of the primary key.
DELETE FROM ferryq_deps WHERE job_id < (
    SELECT coalesce(min(id), 9223372036854775807) FROM (
        SELECT min(id) AS id FROM ferryq_jobs
        UNION ALL SELECT min(id) FROM ferryq_history) AS kept);

-- name: worker_beat
INSERT INTO ferryq_workers (id, namespace, queues, host, pid, concurrency, started_at,
    heartbeat_at, running, stats)
VALUES (:id, :namespace, :queues, :host, :pid, :concurrency, :started_at, :heartbeat_at,
    :running, :stats)
ON CONFLICT (id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at,
    running = excluded.running, stats = excluded.stats;

-- name: worker_remove
DELETE FROM ferryq_workers WHERE id = :id;

-- name: worker_list
SELECT id, namespace, queues, host, pid, concurrency, started_at, heartbeat_at, running, stats
FROM ferryq_workers WHERE heartbeat_at >= :since ORDER BY started_at;

-- name: worker_prune
DELETE FROM ferryq_workers WHERE heartbeat_at < :before;

-- name: lane_of_job
SELECT namespace, lane FROM ferryq_jobs WHERE id = :id AND lane IS NOT NULL;

-- name: lane_window
-- A lane's window, for explain.
SELECT starts, deferred_until FROM ferryq_lane_windows
WHERE namespace = :namespace AND lane = :lane;

-- name: lane_windows_prune
DELETE FROM ferryq_lane_windows WHERE until < :before;

-- name: lane_rule_delete
DELETE FROM ferryq_lane_rules WHERE namespace = :namespace AND pattern = :pattern;

-- name: lane_halts
SELECT lane, job_id, halted_at FROM ferryq_lane_halts WHERE namespace = :namespace
ORDER BY halted_at;

-- name: queue_peek
-- What job_take would take next (without the promotion of due jobs it does first).
SELECT {job_columns} FROM ferryq_jobs
WHERE state = 'ready' AND namespace = :namespace AND queue = :queue
  AND (expires_at IS NULL OR expires_at > :now)
ORDER BY order_time, id
LIMIT 1;

-- name: queue_size_hot
-- The bound state picks the state's partial index: SQLite plans again for the value,
-- and PostgreSQL plans every statement for its parameters (force_custom_plan).
SELECT count(*) FROM ferryq_jobs
WHERE namespace = :namespace AND queue = :queue AND state = :state;

-- name: queue_size_history
SELECT count(*) FROM ferryq_history
WHERE namespace = :namespace AND queue = :queue AND state = :state;

-- name: dead_oldest
SELECT id FROM ferryq_history
WHERE state = 'dead' AND namespace = :namespace AND queue = :queue
ORDER BY finished_at, id
LIMIT :limit;

-- name: token_create
INSERT INTO ferryq_tokens (namespace, digest, description, hint, created_at, limit_read,
    limit_write, limit_interval)
VALUES (:namespace, :digest, :description, :hint, :created_at, :limit_read, :limit_write,
    :limit_interval)
ON CONFLICT (digest) DO NOTHING
RETURNING digest;

-- name: token_get
SELECT {token_columns} FROM ferryq_tokens WHERE digest = :digest;

-- name: token_list
SELECT {token_columns} FROM ferryq_tokens WHERE namespace = :namespace
ORDER BY created_at, digest;

-- name: token_list_all
SELECT {token_columns} FROM ferryq_tokens ORDER BY created_at, digest;

-- name: token_delete
DELETE FROM ferryq_tokens WHERE namespace = :namespace AND digest = :digest RETURNING digest;

-- name: token_limit_set
UPDATE ferryq_tokens
SET limit_read = :limit_read, limit_write = :limit_write, limit_interval = :limit_interval
WHERE digest = :digest
RETURNING digest;

-- name: periodic_list
SELECT {periodic_columns},
    coalesce((SELECT j.state FROM ferryq_jobs j WHERE j.id = p.last_job),
             (SELECT h.state FROM ferryq_history h WHERE h.id = p.last_job))
FROM ferryq_periodic p WHERE p.namespace = :namespace ORDER BY p.task;

-- name: migration_versions
SELECT version FROM ferryq_migrations;

-- name: migration_record
INSERT INTO ferryq_migrations (version, name, applied_at) VALUES (:version, :name, :applied_at);

-- name: schema_version
SELECT max(version) FROM ferryq_migrations;
