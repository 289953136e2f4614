-- Named statements of the SQLite backend. The PostgreSQL backend uses the same names.
-- Parameters are named (:now); job columns are listed in store.py once (JOB_COLUMNS).

-- name: job_insert
-- One statement for a batch: :args is a JSON array of each job's args as JSON text.
-- Inside the write lock the AUTOINCREMENT ids come out consecutive, in array order.
INSERT INTO ferryq_jobs (namespace, queue, task, args, state, lane, priority, run_at,
    order_time, expires_at, ttr, max_tries, retry, unique_key, stage, context, meta,
    created_at)
SELECT :namespace, :queue, :task, a.value, :state, :lane, :priority, :run_at,
    :order_time, :expires_at, :ttr, :max_tries, :retry, :unique_key, :stage, :context, :meta,
    :created_at
FROM json_each(:args) AS a
ORDER BY a.key;

-- name: job_find_unique_hot
SELECT id FROM ferryq_jobs WHERE namespace = :namespace AND unique_key = :unique_key;

-- name: job_find_unique_recent
-- With a window, a finished job created within it still counts as a duplicate.
SELECT id FROM ferryq_history
WHERE namespace = :namespace AND unique_key = :unique_key AND created_at >= :since
ORDER BY created_at DESC LIMIT 1;

-- name: job_claim_ids
-- Walks ferryq_jobs_ready in order; the expiry check only skips rows that the
-- maintenance leader has not expired yet.
SELECT id, order_time FROM ferryq_jobs
WHERE state = 'ready' AND namespace = :namespace AND queue = :queue
  AND (expires_at IS NULL OR expires_at > :now)
ORDER BY order_time, id
LIMIT :limit;

-- name: job_claim_queue
-- The common case, one queue: pick and lease in a single pass over the ready index.
UPDATE ferryq_jobs
SET state = 'running', attempts = attempts + 1, fence = fence + 1, claimed_at = :now,
    started_at = NULL, lease_until = :now + ttr, worker = :worker
WHERE id IN (
    SELECT id FROM ferryq_jobs
    WHERE state = 'ready' AND namespace = :namespace AND queue = :queue
      AND (expires_at IS NULL OR expires_at > :now)
    ORDER BY order_time, id
    LIMIT :limit)
RETURNING {claim_columns};

-- name: job_claim
UPDATE ferryq_jobs
SET state = 'running', attempts = attempts + 1, fence = fence + 1, claimed_at = :now,
    started_at = NULL, lease_until = :now + ttr, worker = :worker
WHERE id IN (SELECT value FROM json_each(:ids)) AND state = 'ready'
RETURNING {claim_columns};

-- name: job_promote_due
UPDATE ferryq_jobs SET state = 'ready'
WHERE id IN (SELECT id FROM ferryq_jobs WHERE state = 'scheduled' AND run_at <= :now
             ORDER BY run_at LIMIT :limit);

-- name: job_next_due
SELECT min(run_at) FROM ferryq_jobs WHERE state = 'scheduled';

-- name: job_finish_to_history
-- The fence and state checks make a late worker's write a no-op.
INSERT INTO ferryq_history ({job_columns})
SELECT {history_finish_columns}
FROM ferryq_jobs j
WHERE j.id = :id AND j.fence = :fence AND j.state = 'running';

-- name: job_finish_batch_to_history
-- Many finishes in one statement; :batch is [[id, fence, state, result, error,
-- started_at, finished_at], ...]. A stale token simply joins no row.
INSERT INTO ferryq_history ({job_columns})
SELECT {history_batch_columns}
FROM json_each(:batch) AS f
JOIN ferryq_jobs AS j ON j.id = f.value ->> 0
WHERE j.fence = f.value ->> 1 AND j.state = 'running';

-- name: job_delete_batch
DELETE FROM ferryq_jobs WHERE id IN (SELECT value ->> 0 FROM json_each(:batch));

-- name: job_delete
DELETE FROM ferryq_jobs WHERE id = :id;

-- name: job_cancel_if_requested
-- An attempt that ends without success on a job whose cancellation was requested
-- ends the job: it is not retried, queued for its next stage, or handed back.
INSERT INTO ferryq_history ({job_columns})
SELECT {history_terminal_columns}
FROM ferryq_jobs j
WHERE j.id = :id AND j.fence = :fence AND j.state = 'running' AND j.cancel_requested = 1;

-- name: job_requeue
UPDATE ferryq_jobs
SET state = :state, run_at = :run_at, order_time = :order_time, lease_until = NULL,
    started_at = :started_at, finished_at = :finished_at,
    error = :error,
    errors = CASE WHEN :error IS NULL THEN errors ELSE json_insert(errors, '$[#]', json(:error)) END
WHERE id = :id AND fence = :fence AND state = 'running';

-- name: job_next_stage
UPDATE ferryq_jobs
SET state = :state, run_at = :run_at, order_time = :order_time, lease_until = NULL,
    stages = json_insert(stages, '$[#]', json(:stage_record)),
    stage = :stage, context = :context, attempts = 0, error = NULL,
    started_at = :started_at, finished_at = :finished_at
WHERE id = :id AND fence = :fence AND state = 'running';

-- name: job_return
-- Graceful shutdown: back to ready, and the try it was charged is given back.
UPDATE ferryq_jobs
SET state = 'ready', attempts = max(attempts - 1, 0), lease_until = NULL, worker = NULL
WHERE id = :id AND fence = :fence AND state = 'running';

-- name: job_lease_extend
-- :pairs is [[id, fence], ...]: only the attempt that holds the lease renews it.
UPDATE ferryq_jobs SET lease_until = :now + ttr
WHERE (id, fence) IN (SELECT value ->> 0, value ->> 1 FROM json_each(:pairs))
  AND state = 'running'
RETURNING id;

-- name: job_held
SELECT id, fence, cancel_requested FROM ferryq_jobs
WHERE id IN (SELECT value FROM json_each(:ids)) AND state = 'running';

-- name: job_expired_leases
SELECT {claim_columns} FROM ferryq_jobs
WHERE state = 'running' AND lease_until < :now
ORDER BY lease_until LIMIT :limit;

-- name: job_expire_ids
SELECT id FROM ferryq_jobs
WHERE expires_at <= :now AND state IN ('scheduled', 'waiting', 'ready')
ORDER BY expires_at LIMIT :limit;

-- name: job_move_terminal
-- Operator or maintenance ends a job that is not running (cancel, expire).
INSERT INTO ferryq_history ({job_columns})
SELECT {history_terminal_columns}
FROM ferryq_jobs j
WHERE j.id = :id AND j.state IN ('scheduled', 'waiting', 'ready');

-- name: job_request_cancel
UPDATE ferryq_jobs SET cancel_requested = 1 WHERE id = :id AND state = 'running';

-- name: job_get_hot
SELECT {job_columns} FROM ferryq_jobs WHERE id = :id;

-- name: job_get_history
SELECT {job_columns} FROM ferryq_history WHERE id = :id;

-- name: job_respawn
INSERT INTO ferryq_jobs ({job_columns})
SELECT {respawn_columns}
FROM ferryq_history j
WHERE j.id = :id AND j.state IN ('dead', 'cancelled', 'expired');

-- name: history_delete
DELETE FROM ferryq_history WHERE id = :id;

-- name: job_purge
DELETE FROM ferryq_history WHERE id = :id AND state = 'dead';

-- name: job_counts
SELECT namespace, queue, state, count(*) FROM ferryq_jobs GROUP BY namespace, queue, state
UNION ALL
SELECT namespace, queue, state, count(*) FROM ferryq_history GROUP BY namespace, queue, state;

-- name: history_prune
DELETE FROM ferryq_history
WHERE id IN (SELECT id FROM ferryq_history WHERE finished_at < :before LIMIT :limit);

-- name: leader_acquire
INSERT INTO ferryq_leaders (name, holder, expires_at) VALUES (:name, :holder, :expires_at)
ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at
WHERE ferryq_leaders.holder = excluded.holder OR ferryq_leaders.expires_at < :now;

-- name: leader_release
DELETE FROM ferryq_leaders WHERE name = :name AND holder = :holder;

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
