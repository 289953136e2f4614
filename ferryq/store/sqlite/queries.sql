-- Named statements of the SQLite backend. A name that PostgreSQL's queries.sql has too
-- means the same there; the flows written once for both backends (ferryq/store/flows.py,
-- STATEMENTS) run only such names, with the same parameters on both (a lock SQLite
-- need not take has an empty body: every write holds the database's write lock from
-- its BEGIN IMMEDIATE). The other names are this backend's own: the hot paths, the
-- lane steps and the history's fold are written for each database apart.
-- A statement that reads the same on both backends is in ferryq/store/queries.sql, not
-- here. tests/unit/test_store_queries.py checks what this header says.
-- Parameters are named (:now); column lists and the rule of a claim ({claim_set}) are
-- filled in from ferryq/store/sql.py when the statements are loaded (queries.py).

-- name: job_insert
-- One statement for a batch: :args is a JSON array of each job's args as JSON text.
-- Inside the write lock the AUTOINCREMENT ids come out consecutive, in array order.
INSERT INTO ferryq_jobs (namespace, queue, task, args, state, lane, priority, run_at,
    order_time, expires_at, ttr, max_tries, retry, unique_key, stage, context, meta,
    created_at, timeout)
SELECT :namespace, :queue, :task, a.value, :state, :lane, :priority, :run_at,
    :order_time, :expires_at, :ttr, :max_tries, :retry, :unique_key, :stage, :context, :meta,
    :created_at, :timeout
FROM json_each(:args) AS a
ORDER BY a.key;

-- name: job_insert_one
-- One job, whose :args is its args' JSON text (its id is the cursor's lastrowid:
-- RETURNING costs a fifth more here).
INSERT INTO ferryq_jobs (namespace, queue, task, args, state, lane, priority, run_at,
    order_time, expires_at, ttr, max_tries, retry, unique_key, stage, context, meta,
    created_at, timeout)
VALUES (:namespace, :queue, :task, :args, :state, :lane, :priority, :run_at,
    :order_time, :expires_at, :ttr, :max_tries, :retry, :unique_key, :stage, :context, :meta,
    :created_at, :timeout);

-- name: job_lock_unique
-- Nothing to take: the write lock already lets one enqueue of a key through at a time.

-- name: job_dependencies_hot
-- The dependencies named by an enqueue that have not ended (the write lock keeps them so).
SELECT id, namespace, state FROM ferryq_jobs WHERE id IN (SELECT value FROM json_each(:ids));

-- name: job_dependencies_ended
SELECT id, namespace, state FROM ferryq_history
WHERE id IN (SELECT value FROM json_each(:ids));

-- name: job_hold
UPDATE ferryq_jobs
SET deps_left = :deps_left, after_failed = :after_failed, dep_failed = :dep_failed
WHERE id IN (SELECT value FROM json_each(:ids));

-- name: job_dependencies_add
-- :after lists the dependencies' ids in the order given; one that has ended is in
-- history, with its state (nothing ends meanwhile: the write lock is held).
INSERT INTO ferryq_deps (job_id, pos, after_id, ended)
SELECT j.value, d.key, d.value, (SELECT h.state FROM ferryq_history h WHERE h.id = d.value)
FROM json_each(:ids) AS j, json_each(:after) AS d;

-- name: job_claim_ids
-- Walks ferryq_jobs_ready in order; the expiry check only skips rows that the
-- maintenance leader has not expired yet.
SELECT order_time, id, lane, claimed_at IS NOT NULL AS started FROM ferryq_jobs
WHERE state = 'ready' AND namespace = :namespace AND queue = :queue
  AND (expires_at IS NULL OR expires_at > :now)
ORDER BY order_time, id
LIMIT :limit;

-- name: job_claim_queue
-- The common case, one queue: pick and lease in a single pass over the ready index.
UPDATE ferryq_jobs
SET {claim_set}
WHERE id IN (
    SELECT id FROM ferryq_jobs
    WHERE state = 'ready' AND namespace = :namespace AND queue = :queue
      AND (expires_at IS NULL OR expires_at > :now)
    ORDER BY order_time, id
    LIMIT :limit)
RETURNING {claim_columns};

-- name: job_claim
UPDATE ferryq_jobs
SET {claim_set}
WHERE id IN (SELECT value FROM json_each(:ids)) AND state = 'ready'
RETURNING {claim_columns};

-- name: job_promote_due
-- Maintenance's promotion, of every queue.
UPDATE ferryq_jobs SET state = 'ready'
WHERE id IN (SELECT id FROM ferryq_jobs WHERE state = 'scheduled' AND run_at <= :now
             ORDER BY run_at LIMIT :limit);

-- name: job_promote_due_queue
-- A claim's promotion: one queue's due jobs, a range of ferryq_jobs_queue_due.
UPDATE ferryq_jobs SET state = 'ready'
WHERE id IN (SELECT id FROM ferryq_jobs
             WHERE state = 'scheduled' AND namespace = :namespace AND queue = :queue
               AND run_at <= :now
             ORDER BY run_at LIMIT :limit);

-- name: job_next_due_queue
SELECT min(run_at) FROM ferryq_jobs
WHERE state = 'scheduled' AND namespace = :namespace AND queue = :queue;

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
WHERE j.fence = f.value ->> 1 AND j.state = 'running'
RETURNING id, namespace, lane;

-- name: job_delete_batch
DELETE FROM ferryq_jobs WHERE id IN (SELECT value ->> 0 FROM json_each(:batch));

-- name: job_cancel_if_requested
-- An attempt that ends without success on a job whose cancellation was requested
-- ends the job: it is not retried, queued for its next stage, or handed back.
INSERT INTO ferryq_history ({job_columns})
SELECT {history_terminal_columns}
FROM ferryq_jobs j
WHERE j.id = :id AND j.fence = :fence AND j.state = 'running' AND j.cancel_requested = 1
RETURNING id, namespace, lane;

-- name: job_requeue
UPDATE ferryq_jobs
SET state = :state, run_at = :run_at, order_time = :order_time, lease_until = NULL,
    started_at = :started_at, finished_at = :finished_at,
    error = :error,
    errors = CASE WHEN :error IS NULL THEN errors ELSE json_insert(errors, '$[#]', json(:error)) END
WHERE id = :id AND fence = :fence AND state = 'running';

-- name: job_next_stage
-- The stage that ran is recorded with its tries; the next one starts with none.
-- Every SET expression reads the row as it was before the update.
UPDATE ferryq_jobs
SET state = :state, run_at = :run_at, order_time = :order_time, lease_until = NULL,
    stages = json_insert(stages, '$[#]', json_object(
        'stage', stage, 'outcome', 'next', 'attempts', attempts,
        'started_at', :started_at, 'finished_at', :finished_at)),
    stage = :stage, context = :context, attempts = 0, error = NULL,
    started_at = :started_at, finished_at = :finished_at
WHERE id = :id AND fence = :fence AND state = 'running';

-- name: job_return
-- Graceful shutdown: back to ready, and the try it was charged is given back.
UPDATE ferryq_jobs
SET state = 'ready', attempts = max(attempts - 1, 0), started_at = NULL, lease_until = NULL,
    worker = NULL
WHERE id = :id AND fence = :fence AND state = 'running';

-- name: job_lease_extend
-- :pairs is [[id, fence, started, progress], ...]: only the attempt that holds the lease
-- renews it; a started time (else null) is when its handler really began, later than
-- the claim; a progress (else null) is what the attempt last reported, as JSON text.
UPDATE ferryq_jobs SET lease_until = :now + ttr, started_at = coalesce(p.started, started_at),
    progress = coalesce(p.progress, ferryq_jobs.progress)
FROM (SELECT value ->> 0 AS id, value ->> 1 AS fence, value ->> 2 AS started,
             value ->> 3 AS progress
      FROM json_each(:pairs)) AS p
WHERE ferryq_jobs.id = p.id AND ferryq_jobs.fence = p.fence AND state = 'running'
RETURNING ferryq_jobs.id;

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
-- Operator or maintenance ends a job that is not running (cancel, expire): its copy
-- in history; job_delete then takes it out of the hot table.
INSERT INTO ferryq_history ({job_columns})
SELECT {history_terminal_columns}
FROM ferryq_jobs j
WHERE j.id = :id AND j.state IN ('scheduled', 'waiting', 'ready');

-- name: job_request_cancel
UPDATE ferryq_jobs SET cancel_requested = 1 WHERE id = :id AND state = 'running';

-- name: job_lock
-- Nothing to take: the write lock keeps the row as it is until the commit.

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
-- The hot jobs, the history folded into ferryq_history_counts, and the rows after
-- the fold's mark (see migration 0008), in one read.
-- A group may come in several rows: ferryq.store.flows.job_counts adds them up.
SELECT namespace, queue, state, count(*) AS n FROM ferryq_jobs
WHERE :namespace IS NULL OR namespace = :namespace
GROUP BY namespace, queue, state
UNION ALL
SELECT namespace, queue, state, n FROM ferryq_history_counts
WHERE n > 0 AND (:namespace IS NULL OR namespace = :namespace)
UNION ALL
SELECT namespace, queue, state, count(*) FROM ferryq_history
WHERE hid > (SELECT hid FROM ferryq_history_folded)
  AND (:namespace IS NULL OR namespace = :namespace)
GROUP BY namespace, queue, state;

-- name: history_fold
-- The rows after the mark, up to :until, by namespace, queue and state.
SELECT namespace, queue, state, count(*) FROM ferryq_history
WHERE hid > (SELECT hid FROM ferryq_history_folded) AND hid <= :until
GROUP BY namespace, queue, state;

-- name: history_count_add
INSERT INTO ferryq_history_counts (namespace, queue, state, n)
VALUES (:namespace, :queue, :state, :n)
ON CONFLICT (namespace, queue, state) DO UPDATE SET n = n + excluded.n;

-- name: history_fold_mark
UPDATE ferryq_history_folded SET hid = :until;

-- name: history_fold_range
-- The mark, and where a fold of at most :limit rows would end.
SELECT f.hid, min(f.hid + :limit, coalesce((SELECT max(hid) FROM ferryq_history), 0))
FROM ferryq_history_folded f;

-- name: history_prune
DELETE FROM ferryq_history
WHERE id IN (SELECT id FROM ferryq_history WHERE finished_at < :before LIMIT :limit);

-- name: leader_acquire
INSERT INTO ferryq_leaders (name, holder, expires_at) VALUES (:name, :holder, :expires_at)
ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at
WHERE ferryq_leaders.holder = excluded.holder OR ferryq_leaders.expires_at < :now;

-- name: leader_release
DELETE FROM ferryq_leaders WHERE name = :name AND holder = :holder;

-- name: lane_of_jobs
-- The lanes of the jobs about to finish (a lane never changes, so no lock is needed).
SELECT id, namespace, lane FROM ferryq_jobs
WHERE id IN (SELECT value FROM json_each(:ids)) AND lane IS NOT NULL;

-- name: lane_rules
SELECT pattern, lane_limit, on_dead, rate_n, rate_per FROM ferryq_lane_rules
WHERE namespace = :namespace
ORDER BY pattern;

-- name: lane_rule_set
INSERT INTO ferryq_lane_rules (namespace, pattern, lane_limit, on_dead, rate_n, rate_per,
                               updated_at)
VALUES (:namespace, :pattern, :lane_limit, :on_dead, :rate_n, :rate_per, :now)
ON CONFLICT (namespace, pattern) DO UPDATE SET lane_limit = excluded.lane_limit,
    on_dead = excluded.on_dead, rate_n = excluded.rate_n, rate_per = excluded.rate_per,
    updated_at = excluded.updated_at;

-- name: lane_rated
-- Whether any rule of the namespace has a rate: its claims then go through the gate.
SELECT EXISTS (SELECT 1 FROM ferryq_lane_rules
               WHERE namespace = :namespace AND rate_n IS NOT NULL);

-- name: lane_windows_lock
-- The windows of these lanes, made if new. (SQLite's write lock is held.)
INSERT INTO ferryq_lane_windows (namespace, lane)
SELECT :namespace, value FROM json_each(:lanes) WHERE true
ON CONFLICT (namespace, lane) DO UPDATE SET namespace = excluded.namespace
RETURNING lane, starts, deferred_until;

-- name: lane_unstarted
-- The admitted jobs of these lanes that have not started: at most a limit's worth each.
-- CROSS JOIN keeps the lanes the outer loop: an index range of each lane, not a walk
-- through every admitted job of the namespace.
SELECT j.lane, j.id, j.state, j.run_at
FROM json_each(:lanes) AS l CROSS JOIN ferryq_jobs j INDEXED BY ferryq_jobs_lane_held
WHERE j.namespace = :namespace AND j.lane = l.value AND j.lane IS NOT NULL
  AND j.state <> 'waiting' AND j.state IN ('ready', 'scheduled') AND j.claimed_at IS NULL
ORDER BY j.lane, j.id;

-- name: lane_windows_put
-- The windows after a claim: :windows lists [lane, starts, deferred_until, until]. An
-- upsert, so that each goes by the primary key (an UPDATE ... FROM json_each scanned
-- every window for each one).
INSERT INTO ferryq_lane_windows (namespace, lane, starts, deferred_until, until)
SELECT :namespace, json_extract(value, '$[0]'), json_extract(value, '$[1]'),
    json_extract(value, '$[2]'), json_extract(value, '$[3]')
FROM json_each(:windows) WHERE true
ON CONFLICT (namespace, lane) DO UPDATE SET starts = excluded.starts,
    deferred_until = excluded.deferred_until, until = excluded.until;

-- name: job_defer
-- Ready jobs a claim picked that its lane's rate does not let start yet: scheduled
-- again, due when the window has room (:defer lists [id, due] pairs).
UPDATE ferryq_jobs SET state = 'scheduled', run_at = d.due
FROM (SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS due
      FROM json_each(:defer)) AS d
WHERE ferryq_jobs.id = d.id AND ferryq_jobs.state = 'ready';

-- name: lane_halted_by
SELECT job_id FROM ferryq_lane_halts WHERE namespace = :namespace AND lane = :lane;

-- name: lane_held
-- The lane's admitted jobs: at most its limit (or an older, higher one) of them.
SELECT id, state, claimed_at IS NOT NULL, run_at, order_time, queue FROM ferryq_jobs
WHERE namespace = :namespace AND lane = :lane AND state <> 'waiting'
ORDER BY id;

-- name: lane_waiting
SELECT id, run_at, order_time, queue, expires_at FROM ferryq_jobs
WHERE namespace = :namespace AND lane = :lane AND state = 'waiting'
ORDER BY id LIMIT :limit;

-- name: lane_admit
UPDATE ferryq_jobs SET state = :state, run_at = :run_at, order_time = :order_time
WHERE id = :id AND state = 'waiting';

-- name: lane_demote
UPDATE ferryq_jobs SET state = 'waiting'
WHERE id = :id AND state IN ('scheduled', 'ready') AND claimed_at IS NULL;

-- name: lane_halt
INSERT INTO ferryq_lane_halts (namespace, lane, job_id, halted_at)
VALUES (:namespace, :lane, :job_id, :now)
ON CONFLICT (namespace, lane) DO NOTHING;

-- name: lane_release
-- Respawning or purging the dead job that halted a lane releases it.
DELETE FROM ferryq_lane_halts WHERE job_id IN (SELECT value FROM json_each(:ids))
RETURNING namespace, lane, job_id;

-- name: lane_ahead
-- INDEXED BY: once ANALYZE has run, the planner would rather walk the rowids below
-- :id through the whole table than the lane's own range of the index.
SELECT count(*) FROM ferryq_jobs INDEXED BY ferryq_jobs_lane_waiting
WHERE namespace = :namespace AND lane = :lane AND state = 'waiting' AND id < :id;

-- name: lane_names
-- Lanes with hot jobs whose name starts with :prefix: one index seek per lane in each
-- lane index, never a walk through a long lane.
WITH RECURSIVE waiting(lane) AS (
    SELECT (SELECT min(lane) FROM ferryq_jobs
            WHERE namespace = :namespace AND state = 'waiting' AND lane >= :prefix)
    UNION ALL
    SELECT (SELECT min(lane) FROM ferryq_jobs
            WHERE namespace = :namespace AND state = 'waiting' AND lane > waiting.lane)
    FROM waiting WHERE substr(waiting.lane, 1, length(:prefix)) = :prefix
), held(lane) AS (
    SELECT (SELECT min(lane) FROM ferryq_jobs
            WHERE namespace = :namespace AND state <> 'waiting' AND lane >= :prefix)
    UNION ALL
    SELECT (SELECT min(lane) FROM ferryq_jobs
            WHERE namespace = :namespace AND state <> 'waiting' AND lane > held.lane)
    FROM held WHERE substr(held.lane, 1, length(:prefix)) = :prefix
)
SELECT lane FROM waiting WHERE substr(lane, 1, length(:prefix)) = :prefix
UNION
SELECT lane FROM held WHERE substr(lane, 1, length(:prefix)) = :prefix;

-- name: lane_list
-- Lanes with hot jobs, busiest first: a scan of the hot table, for operators.
SELECT j.lane,
       sum(j.state = 'waiting') AS waiting,
       sum(j.state IN ('scheduled', 'ready')) AS admitted,
       sum(j.state = 'running') AS running,
       h.job_id AS halted_by
FROM ferryq_jobs j
LEFT JOIN ferryq_lane_halts h ON h.namespace = j.namespace AND h.lane = j.lane
WHERE j.namespace = :namespace AND j.lane IS NOT NULL
GROUP BY j.lane
ORDER BY count(*) DESC, j.lane
LIMIT :limit;

-- name: lane_glance
-- For each lane of :namespace named in :lanes (a JSON array of names): the jobs it
-- holds, of which not started, the dead job that halts it, and its first waiting job
-- (id, run_at, order_time, queue, expires_at; NULLs if none). Plain columns, so
-- nothing is decoded twice; index seeks only, however long the lane.
SELECT l.value,
    (SELECT count(*) FROM ferryq_jobs h
     WHERE h.namespace = :namespace AND h.lane = l.value AND h.state <> 'waiting'),
    (SELECT count(*) FROM ferryq_jobs h
     WHERE h.namespace = :namespace AND h.lane = l.value AND h.state <> 'waiting'
       AND h.claimed_at IS NULL),
    (SELECT x.job_id FROM ferryq_lane_halts x WHERE x.namespace = :namespace AND x.lane = l.value),
    w.id, w.run_at, w.order_time, w.queue, w.expires_at
FROM json_each(:lanes) AS l
LEFT JOIN ferryq_jobs AS w ON w.id = (
    SELECT f.id FROM ferryq_jobs f
    WHERE f.namespace = :namespace AND f.lane = l.value AND f.state = 'waiting'
    ORDER BY f.id LIMIT 1);

-- name: lane_take_next
-- The plain case of lanes of limit 1 in one write: each lane of :lanes that holds no
-- job now and is not halted hands its first waiting job, if due, of one of :queues and
-- not expired, straight to :worker; at most :budget of them (any: the lanes not taken
-- are admitted next, for any worker to claim).
UPDATE ferryq_jobs
SET {claim_set}
WHERE id IN (
    SELECT w.id FROM json_each(:lanes) AS l
    JOIN ferryq_jobs AS w ON w.id = (
        SELECT f.id FROM ferryq_jobs f
        WHERE f.namespace = :namespace AND f.lane = l.value AND f.state = 'waiting'
        ORDER BY f.id LIMIT 1)
    WHERE w.run_at <= :now AND w.queue IN (SELECT value FROM json_each(:queues))
      AND (w.expires_at IS NULL OR w.expires_at > :now)
      AND NOT EXISTS (SELECT 1 FROM ferryq_jobs h WHERE h.namespace = :namespace
                      AND h.lane = l.value AND h.state <> 'waiting')
      AND NOT EXISTS (SELECT 1 FROM ferryq_lane_halts x WHERE x.namespace = :namespace
                      AND x.lane = l.value)
    LIMIT :budget)
RETURNING {claim_columns};

-- name: lane_admit_next
-- The same lanes' first waiting jobs, admitted (ready, or scheduled until due) where
-- the lane holds no job and is not halted.
UPDATE ferryq_jobs SET state = CASE WHEN run_at > :now THEN 'scheduled' ELSE 'ready' END
WHERE id IN (
    SELECT (SELECT f.id FROM ferryq_jobs f
            WHERE f.namespace = :namespace AND f.lane = l.value AND f.state = 'waiting'
            ORDER BY f.id LIMIT 1)
    FROM json_each(:lanes) AS l
    WHERE NOT EXISTS (SELECT 1 FROM ferryq_jobs h WHERE h.namespace = :namespace
                      AND h.lane = l.value AND h.state <> 'waiting')
      AND NOT EXISTS (SELECT 1 FROM ferryq_lane_halts x WHERE x.namespace = :namespace
                      AND x.lane = l.value));

-- name: lane_admit_due
-- Admit lanes' next jobs that keep their own times (nothing unstarted ahead of them).
UPDATE ferryq_jobs SET state = CASE WHEN run_at > :now THEN 'scheduled' ELSE 'ready' END
WHERE id IN (SELECT value FROM json_each(:ids)) AND state = 'waiting';

-- name: lane_take
-- Hand a lane's next job straight to the worker whose attempt freed the lane: it is
-- admitted and claimed in one write.
UPDATE ferryq_jobs
SET {claim_set}
WHERE id IN (SELECT value FROM json_each(:ids)) AND state = 'waiting'
RETURNING {claim_columns};

-- name: job_take_ids
-- job_take of the jobs a claim picked and the rate gate let start (see job_claim).
UPDATE ferryq_jobs
SET {take_set}
WHERE id IN (SELECT value FROM json_each(:ids)) AND state = 'ready'
RETURNING {job_columns};

-- name: job_take
-- job_claim_queue for a consumer over HTTP: the lease is the consumer's ttr, which
-- becomes the job's own, so lease renewals and explain agree with it. The attempt
-- starts when it is handed over: no worker will report a start of its own.
UPDATE ferryq_jobs
SET {take_set}
WHERE id IN (
    SELECT id FROM ferryq_jobs
    WHERE state = 'ready' AND namespace = :namespace AND queue = :queue
      AND (expires_at IS NULL OR expires_at > :now)
    ORDER BY order_time, id
    LIMIT :limit)
RETURNING {job_columns};

-- name: job_ack
-- An HTTP consumer's acknowledgement has no fence: whatever unfinished state the job
-- is in, it ends succeeded. Jobs of other queues are left alone.
INSERT INTO ferryq_history ({job_columns})
SELECT {history_terminal_columns}
FROM ferryq_jobs j
WHERE j.id IN (SELECT value FROM json_each(:ids))
  AND j.namespace = :namespace AND j.queue = :queue
RETURNING id, namespace, lane;

-- name: job_delete_ids
DELETE FROM ferryq_jobs WHERE id IN (SELECT value FROM json_each(:ids));

-- name: queue_clear
-- Cancels the queue's ready jobs, in one pass over its range of the ready index.
INSERT INTO ferryq_history ({job_columns})
SELECT {history_terminal_columns}
FROM ferryq_jobs j
WHERE j.state = 'ready' AND j.namespace = :namespace AND j.queue = :queue
RETURNING id, namespace, lane;

-- name: periodic_upsert
-- A periodic task first seen now is handled up to now: its first tick is the next.
INSERT INTO ferryq_periodic (namespace, task, schedule, queue, catch_up, checked_until,
    updated_at)
VALUES (:namespace, :task, :schedule, :queue, :catch_up, :now, :now)
ON CONFLICT (namespace, task) DO UPDATE SET schedule = excluded.schedule,
    queue = excluded.queue, catch_up = excluded.catch_up, updated_at = excluded.updated_at;

-- name: periodic_advance
-- Compare and set: of two leaders that planned from the same point, one moves it.
UPDATE ferryq_periodic
SET checked_until = :checked_until, next_tick = :next_tick, updated_at = :now,
    last_tick = coalesce(:last_tick, last_tick), last_job = coalesce(:last_job, last_job)
WHERE namespace = :namespace AND task = :task AND checked_until = :checked_from;

-- name: migration_lock
-- Nothing to take: a migration runs in a write transaction, which holds the database's
-- write lock, so one process migrates at a time.

-- name: migration_table
CREATE TABLE IF NOT EXISTS ferryq_migrations (
    version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL);
