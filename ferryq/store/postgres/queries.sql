-- Named statements of the PostgreSQL backend: the same names as on SQLite.
-- Parameters are named (:now) and become $n when loaded (see queries.py).

-- name: job_insert_batch
-- One statement for a batch of jobs alike but for their args, and its one wake-up
-- NOTIFY (delivered at commit): a single round trip, atomic without BEGIN. unnest
-- keeps the input order, so the identity values rise in that order; they come back
-- as one array. The notifying CTE is volatile, hence evaluated once, by the EXISTS.
WITH inserted AS (
    INSERT INTO ferryq_jobs (namespace, queue, task, args, state, lane, priority, run_at,
        order_time, expires_at, ttr, max_tries, retry, unique_key, stage, context, meta,
        created_at)
    SELECT :namespace, :queue, :task, a.args, :state, :lane, :priority::float8,
        :run_at::float8, :order_time::float8, :expires_at::float8, :ttr::float8,
        :max_tries, :retry, :unique_key, :stage, :context, :meta::jsonb,
        :created_at::float8
    FROM unnest(:args::text[]) WITH ORDINALITY AS a(args, n)
    ORDER BY a.n
    RETURNING id
), woken AS (
    SELECT pg_notify('ferryq_jobs', :queue)
)
SELECT array_agg(id ORDER BY id) FROM inserted WHERE EXISTS (SELECT FROM woken);

-- name: job_lock_unique
-- Serialises enqueues of one key (released at commit), so dedup is atomic.
SELECT pg_advisory_xact_lock(hashtextextended(:namespace || '/' || :unique_key, 7));

-- name: job_find_unique_hot
SELECT id FROM ferryq_jobs WHERE namespace = :namespace AND unique_key = :unique_key;

-- name: job_find_unique_recent
SELECT id FROM ferryq_history
WHERE namespace = :namespace AND unique_key = :unique_key AND created_at >= :since
ORDER BY created_at DESC LIMIT 1;

-- name: job_promote_due
UPDATE ferryq_jobs SET state = 'ready'
WHERE id = ANY(ARRAY(SELECT id FROM ferryq_jobs WHERE state = 'scheduled' AND run_at <= :now
                     ORDER BY run_at LIMIT :limit FOR UPDATE SKIP LOCKED));

-- name: job_claim_queue
-- SKIP LOCKED: concurrent workers take disjoint rows without waiting on each other.
-- = ANY(ARRAY(...)) makes the update a primary-key lookup per picked row; a join
-- with the picked rows could plan as a scan of the whole table.
UPDATE ferryq_jobs j
SET state = 'running', attempts = j.attempts + 1, fence = j.fence + 1, claimed_at = :now,
    started_at = NULL, lease_until = :now + j.ttr, worker = :worker
WHERE j.id = ANY(ARRAY(
    SELECT id FROM ferryq_jobs
    WHERE state = 'ready' AND namespace = :namespace AND queue = :queue
      AND (expires_at IS NULL OR expires_at > :now)
    ORDER BY order_time, id
    LIMIT :limit
    FOR UPDATE SKIP LOCKED))
RETURNING {claim_columns};

-- name: job_claim_queues
UPDATE ferryq_jobs j
SET state = 'running', attempts = j.attempts + 1, fence = j.fence + 1, claimed_at = :now,
    started_at = NULL, lease_until = :now + j.ttr, worker = :worker
WHERE j.id = ANY(ARRAY(
    SELECT id FROM ferryq_jobs
    WHERE state = 'ready' AND namespace = :namespace AND queue = ANY(:queues::text[])
      AND (expires_at IS NULL OR expires_at > :now)
    ORDER BY order_time, id
    LIMIT :limit
    FOR UPDATE SKIP LOCKED))
RETURNING {claim_columns};

-- name: job_next_due
SELECT min(run_at) FROM ferryq_jobs WHERE state = 'scheduled';

-- name: job_finish_batch_to_history
-- Many finishes in one statement. A stale token joins no row, so it moves nothing.
WITH f AS (
    SELECT * FROM unnest(:ids::bigint[], :fences::bigint[], :states::text[],
        :results::text[], :errors::jsonb[], :started::float8[], :finished::float8[])
        AS f(id, fence, state, result, error, started_at, finished_at)
), moved AS (
    DELETE FROM ferryq_jobs j USING f
    WHERE j.id = f.id AND j.fence = f.fence AND j.state = 'running'
    RETURNING j.*, f.state AS f_state, f.result AS f_result, f.error AS f_error,
        f.started_at AS f_started_at, f.finished_at AS f_finished_at
)
INSERT INTO ferryq_history ({job_columns})
SELECT {history_finish_columns} FROM moved j
RETURNING id;

-- name: job_cancel_if_requested
-- An attempt that ends without success on a job whose cancellation was requested
-- ends the job: it is not retried, queued for its next stage, or handed back.
WITH moved AS (
    DELETE FROM ferryq_jobs j
    WHERE j.id = :id AND j.fence = :fence AND j.state = 'running' AND j.cancel_requested
    RETURNING j.*
)
INSERT INTO ferryq_history ({job_columns})
SELECT {history_terminal_columns} FROM moved j
RETURNING id;

-- name: job_requeue
UPDATE ferryq_jobs
SET state = :state, run_at = :run_at, order_time = :order_time, lease_until = NULL,
    started_at = :started_at, finished_at = :finished_at, error = :error::jsonb,
    errors = CASE WHEN :error::jsonb IS NULL THEN errors
                  ELSE errors || jsonb_build_array(:error::jsonb) END
WHERE id = :id AND fence = :fence AND state = 'running'
RETURNING id;

-- name: job_next_stage
UPDATE ferryq_jobs
SET state = :state, run_at = :run_at, order_time = :order_time, lease_until = NULL,
    stages = stages || jsonb_build_array(:stage_record::jsonb),
    stage = :stage, context = :context, attempts = 0, error = NULL,
    started_at = :started_at, finished_at = :finished_at
WHERE id = :id AND fence = :fence AND state = 'running'
RETURNING id;

-- name: job_return
UPDATE ferryq_jobs
SET state = 'ready', attempts = greatest(attempts - 1, 0), lease_until = NULL, worker = NULL
WHERE id = :id AND fence = :fence AND state = 'running'
RETURNING id;

-- name: job_lease_extend
UPDATE ferryq_jobs j SET lease_until = :now + j.ttr
FROM unnest(:ids::bigint[], :fences::bigint[]) AS f(id, fence)
WHERE j.id = f.id AND j.fence = f.fence AND j.state = 'running'
RETURNING j.id;

-- name: job_held
SELECT id, fence, cancel_requested FROM ferryq_jobs
WHERE id = ANY(:ids::bigint[]) AND state = 'running';

-- name: job_expired_leases
SELECT {claim_columns} FROM ferryq_jobs j
WHERE state = 'running' AND lease_until < :now
ORDER BY lease_until LIMIT :limit;

-- name: job_expire
WITH moved AS (
    DELETE FROM ferryq_jobs j
    WHERE j.id = ANY(ARRAY(SELECT id FROM ferryq_jobs
                   WHERE expires_at <= :now AND state IN ('scheduled', 'waiting', 'ready')
                   ORDER BY expires_at LIMIT :limit FOR UPDATE SKIP LOCKED))
    RETURNING j.*
)
INSERT INTO ferryq_history ({job_columns})
SELECT {history_expired_columns} FROM moved j
RETURNING id;

-- name: job_move_terminal
WITH moved AS (
    DELETE FROM ferryq_jobs j
    WHERE j.id = :id AND j.state IN ('scheduled', 'waiting', 'ready')
    RETURNING j.*
)
INSERT INTO ferryq_history ({job_columns})
SELECT {history_terminal_columns} FROM moved j
RETURNING id;

-- name: job_request_cancel
UPDATE ferryq_jobs SET cancel_requested = true WHERE id = :id AND state = 'running';

-- name: job_get_hot
SELECT {job_columns} FROM ferryq_jobs WHERE id = :id;

-- name: job_get_history
SELECT {job_columns} FROM ferryq_history WHERE id = :id;

-- name: job_lock
SELECT state FROM ferryq_jobs WHERE id = :id FOR UPDATE;

-- name: job_respawn
WITH moved AS (
    DELETE FROM ferryq_history j
    WHERE j.id = ANY(:ids::bigint[]) AND j.state IN ('dead', 'cancelled', 'expired')
    RETURNING j.*
)
INSERT INTO ferryq_jobs ({job_columns}) OVERRIDING SYSTEM VALUE
SELECT {respawn_columns} FROM moved j
RETURNING id;

-- name: job_purge
DELETE FROM ferryq_history WHERE id = ANY(:ids::bigint[]) AND state = 'dead';

-- name: job_counts
SELECT namespace, queue, state, count(*) FROM ferryq_jobs GROUP BY namespace, queue, state
UNION ALL
SELECT namespace, queue, state, count(*) FROM ferryq_history GROUP BY namespace, queue, state;

-- name: history_partitions
-- Daily partitions are named ferryq_history_pYYYYMMDD.
SELECT c.relname FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid
JOIN pg_class p ON p.oid = i.inhparent
WHERE p.relname = 'ferryq_history' AND c.relname LIKE 'ferryq\_history\_p%';

-- name: history_prune_default
DELETE FROM ferryq_history_default
WHERE ctid IN (SELECT ctid FROM ferryq_history_default WHERE finished_at < :before
               LIMIT :limit);

-- name: leader_try
SELECT pg_try_advisory_lock(hashtextextended('ferryq:leader:' || :name, 7));

-- name: leader_unlock
SELECT pg_advisory_unlock(hashtextextended('ferryq:leader:' || :name, 7));

-- name: worker_beat
INSERT INTO ferryq_workers (id, namespace, queues, host, pid, concurrency, started_at,
    heartbeat_at, running)
VALUES (:id, :namespace, :queues, :host, :pid, :concurrency, :started_at, :heartbeat_at,
    :running)
ON CONFLICT (id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at,
    running = excluded.running;

-- name: worker_remove
DELETE FROM ferryq_workers WHERE id = :id;

-- name: worker_list
SELECT id, namespace, queues, host, pid, concurrency, started_at, heartbeat_at, running
FROM ferryq_workers WHERE heartbeat_at >= :since ORDER BY started_at;

-- name: worker_prune
DELETE FROM ferryq_workers WHERE heartbeat_at < :before;
